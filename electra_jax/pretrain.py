"""electra-pretrain: pre-train ELECTRA per a config file into a workdir (re-running on the same workdir resumes).

  electra-pretrain --config=configs/demo.py --workdir=runs/demo [--config.train.num_steps=1000 ...]
"""
import os

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where config.json, checkpoints/, metrics.jsonl and tensorboard/ go "
                               "(local or gs://).")
flags.mark_flags_as_required(["config", "workdir"])


def initialize_distributed():
  """Joins the other processes of a multi-host run: explicitly from launch/gpu.sh's variables, automatically on a
  TPU pod; a single process needs nothing."""
  import jax  # pylint: disable=g-import-not-at-top
  if "JAX_COORDINATOR_ADDRESS" in os.environ:
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_NUM_PROCESSES"]),
                               int(os.environ["JAX_PROCESS_ID"]))
  elif os.environ.get("TPU_WORKER_HOSTNAMES", "localhost").count(",") > 0:
    jax.distributed.initialize()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  initialize_distributed()
  from electra_jax import train  # pylint: disable=g-import-not-at-top
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  logging.info("Done: %s holds checkpoints/, metrics.jsonl and tensorboard/", _WORKDIR.value)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
