"""electra-pretrain: pre-train ELECTRA per a config file into a workdir (re-running on the same workdir resumes).

  electra-pretrain --config=configs/demo.py --workdir=runs/demo [--config.train.num_steps=1000 ...]

SIGTERM or Ctrl-C saves the current step and exits 0; bad input (flags, config, data, workdir, checkpoint) or a
NaN/Inf loss exits 1 with one line "electra-pretrain: error: ..." on stderr (-v=1 adds the traceback). See
docs/reliability.md.
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where config.json, checkpoints/, metrics.jsonl and tensorboard/ go "
                               "(local or gs://).")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False, "Continue a workdir whose config.json differs from this config (beyond length, "
    "cadence and mesh); without it such a workdir is refused as another run's.")
flags.mark_flags_as_required(["config", "workdir"])
flags.register_validator("workdir", bool, message="--workdir must name a directory")

# Bad input, as opposed to a bug: reported in one line. FloatingPointError is the NaN/Inf guard.
USER_ERRORS = (ValueError, OSError, FloatingPointError)


def _fail(message: str):
  sys.stderr.write(f"electra-pretrain: error: {' '.join(str(message).split())}\n")
  sys.exit(1)


def parse_flags(argv):
  """absl's parser, with a flag or config error in one line (a misspelt key, a wrong type, a missing file)."""
  try:
    argv = flags.FLAGS(argv)
    _CONFIG.value  # pylint: disable=pointless-statement  (a config file that fails to load raises here)
    return argv
  except AttributeError as e:  # config_flags's "Did you mean" for a misspelt key, a KeyError's text inside
    cause = e.args[0] if e.args else e
    _fail(f"unknown config key {cause.args[0] if isinstance(cause, KeyError) else cause}")
  except (flags.Error, ValueError, OSError) as e:  # OSError: a config file that does not load
    _fail(e)


class _QuietOrbax(logging.logging.Filter):
  """Orbax narrates every save at INFO; keep its warnings and errors, and our own INFO lines."""

  def filter(self, record):
    return record.levelno >= logging.logging.WARNING or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.get_absl_handler().addFilter(_QuietOrbax())
  from electra_jax import sharding, train  # pylint: disable=g-import-not-at-top
  sharding.initialize_runtime()
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value, allow_config_change=_ALLOW_CONFIG_CHANGE.value)
  except USER_ERRORS as e:
    logging.debug("electra-pretrain failed", exc_info=True)
    _fail(e)
  workdir = _WORKDIR.value
  print(f"Done. In {workdir}: checkpoints/ (Orbax; run the same command to resume), metrics.jsonl, config.json\n"
        f"TensorBoard: tensorboard --logdir {os.path.join(workdir, 'tensorboard')}")


def run():
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
