"""electra-pretrain: pre-train ELECTRA per a config file into a workdir (re-running on the same workdir resumes).

  electra-pretrain --config=configs/demo.py --workdir=runs/demo
  electra-pretrain --config=configs/demo.py --workdir=runs/demo --config.train.num_steps=5000   # continue it longer
  electra-pretrain --config=configs/tiny.py --workdir=runs/tiny --config.train.num_steps=20 --config.mesh.fsdp=2

Prepare the data first with electra-prepare and the same --config. SIGTERM or Ctrl-C saves the current step and exits
0; bad input or a NaN/Inf loss exits 1 with one line "electra-pretrain: error: ..." on stderr; a corrupt checkpoint is
passed over, with a warning, for the newest intact one (docs/reliability.md).
"""
import os

from absl import flags, logging
from ml_collections import config_flags

from electra_jax import cli


def define_flags():
  own = [config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()).", lock_config=True),
         flags.DEFINE_string("workdir", None, "The run's directory, local or gs:// (the same command resumes it)."),
         flags.DEFINE_bool("allow_config_change", False, "Continue a workdir whose config.json differs from this "
                           "config (beyond length, cadence and mesh), not refuse it as another run's.")]
  flags.register_validator("workdir", bool, message="--workdir must name a directory")
  return own


def main(config, workdir, allow_config_change):
  from electra_jax.pretrain import loop as pretrain_loop  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import startup
  plan = plan_lib.resolve(config, workdir, allow_config_change)  # reads files only: before JAX joins the peers
  startup.initialize(plan.config.train.peer_timeout_s)
  logging.info("%s", plan.describe())
  pretrain_loop.train(plan)
  print(f"Done. In {workdir}: checkpoints/ (Orbax; run the same command to resume), metrics.jsonl, config.json, "
        "plan.json\n"
        f"TensorBoard: tensorboard --logdir {os.path.join(workdir, 'tensorboard')}")


def run():
  cli.run("electra-pretrain", __doc__, main, define_flags(), required=["config", "workdir"], needs=["tensorboardX"])


if __name__ == "__main__":
  run()
