"""electra-finetune: the discriminator fine-tuned on a classification, regression, sentence-pair, token classification
(NER-style) or extractive QA task.

  electra-finetune --config=configs/finetune/classify.py --config.task.train_file=train.jsonl \
      --config.task.eval_file=dev.jsonl --config.init_from=runs/demo --workdir=runs/ft_mine  # your own task
  electra-finetune --config=configs/finetune/sentiment.py --config.init_from=runs/demo --workdir=runs/ft_sentiment \
      --seeds=0,1,2 --learning_rates=1e-4,3e-4,1e-3  # the protocol: median (min-max) over seeds, rate chosen on dev

Tagging (configs/finetune/ner.py: JSONL tokens/tags or CoNLL columns) and extractive QA (configs/finetune/qa.py: SQuAD
v1.1 JSON) run the same way. A run starts from a pre-training workdir (its latest checkpoint, or --config.init_step),
an HF ELECTRA directory, or random init (empty init_from). Task data: JSONL/CSV/TSV files (local or gs://), a local
TFDS dataset or a built-in task; a seeded dev fold (task.dev_fraction) chooses the model and stops the run early.

The workdir (docs/finetune_workdir.md) receives config.json, plan.json, metrics, checkpoints/ (SIGTERM/Ctrl-C save;
the same command resumes), best/ (an HF directory), predictions and, last, eval_results.json. A workdir holding another
config's run is refused unless --config.overwrite=true; one that another run writes or that overlaps its inputs, always.
"""
import json

from absl import flags, logging
from ml_collections import config_flags

from electra_jax import cli


def define_flags():
  return [config_flags.DEFINE_config_file("config", None, "Fine-tuning config file (Python, get_config()): task, "
                                          "init_from, model, training.", lock_config=True),
          flags.DEFINE_string("workdir", None, "Where the run's files go (a run of the same config there resumes)."),
          flags.DEFINE_list("seeds", [], "The paper's protocol: a run per seed (and learning rate) under "
                            "WORKDIR/lr<rate>/seed<seed>, reported as the median (min-max) over seeds at the rate "
                            "best on the dev fold (docs/finetuning.md). Empty: one run, train.seed."),
          flags.DEFINE_list("learning_rates", [], "With --seeds: the rates to choose from on the dev fold (empty: "
                            "train.learning_rate).")]


def main(config, workdir, seeds, learning_rates):
  rates = [_number(float, "learning_rates", r) for r in learning_rates]
  seeds = [_number(int, "seeds", s) for s in seeds]
  # The library only now: flags and config are checked without it.
  from electra_jax.finetune import protocol  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import startup
  startup.initialize(config.train.peer_timeout_s)
  if (results := protocol.run(config, workdir, seeds, rates)) is not None:
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
