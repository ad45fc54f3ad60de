"""Fine-tuning the discriminator on a classification, regression, sentence-pair, token classification (NER-style) or
extractive QA task (`electra-finetune`, or `python -m electra_jax.finetune`).

  config.py         the config schema (base_config)
  tasks.py          task data, splits, encoding, metrics
  token_tasks.py    token classification (NER-style tagging): CoNLL-style data, first-piece tags, entity metrics
  qa.py             extractive QA: SQuAD JSON, doc-stride windows, answer spans, exact match and F1
  model.py          the classifier, tagger and QA heads, where their encoder comes from, the optimiser
  heads.py          each task type's part (Head): reading and encoding its splits, model head, loss, metrics,
                    predictions, best/'s class
  experiment.py     what a config compiles: the splits, the model and optimiser, the pure train_step and its jit, the
                    rows of each step
  loop.py           the loop's own part: restore or init, evaluation, model selection, the results
  hf_heads.py       the best model as an HF ElectraFor{SequenceClassification,TokenClassification,QuestionAnswering}
                    directory
  __main__.py       the command line
"""
from electra_jax.finetune.config import base_config
from electra_jax.finetune.loop import finetune
from electra_jax.finetune.tasks import carve, compute_metrics, label_sort_key, load_rows

__all__ = ["base_config", "carve", "compute_metrics", "finetune", "label_sort_key", "load_rows"]
