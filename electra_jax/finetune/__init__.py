"""Fine-tuning the discriminator on a classification, regression, sentence-pair, token classification (NER-style) or
extractive QA task (`electra-finetune`, or `python -m electra_jax.finetune`). May import cli, run/ and the layers
below; never pretrain/.

  config.py         the config schema (base_config)
  tasks.py          task data, splits, encoding, metrics
  token_tasks.py    token classification (NER-style tagging): CoNLL-style data, first-piece tags, entity metrics
  qa.py             extractive QA: SQuAD JSON, doc-stride windows, answer spans, exact match and F1
  model.py          the classifier, tagger and QA heads
  heads.py          each task type's part (Head): reading and encoding its splits, model head, loss, metrics,
                    predictions, best/'s class
  plan.py           what a run is, decided once at its entrance: the workdir's verdict, the weights it starts from
                    (a sources.Source) and the tokenizer
  protocol.py       the command's runs: one, or the paper's protocol (a run and a plan per seed and learning rate,
                    the rate chosen on dev)
  experiment.py     what a config compiles: the encoder's weights, the splits, the model and optimiser (layer-wise LR
                    decay), the pure train_step and its jit, the rows of each step
  loop.py           the loop's own part: restore or init, evaluation, model selection, the results
  hf_heads.py       the best model as an HF ElectraFor{SequenceClassification,TokenClassification,QuestionAnswering}
                    directory
  __main__.py       the command line
"""
import importlib

# name -> the module that defines it. Imported on first use (PEP 562), so that a config file's
# `from electra_jax.finetune.config import base_config` loads no model stack: a bad flag is refused at once.
_EXPORTS = {"base_config": "config", "finetune": "loop", "carve": "tasks", "compute_metrics": "tasks",
            "label_sort_key": "tasks", "load_rows": "tasks"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
