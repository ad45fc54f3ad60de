"""How long a checkpoint save blocks the training loop: Checkpointer.save's own time (what runs before Orbax's
asynchronous write takes over), and the wait for that write, for a config's whole train state on simulated devices
with the weights split over them (mesh.fsdp), as on a pod.

  python benchmarks/save_time.py --config=configs/small.py [--devices=8] [--saves=5]

Prints one line per save and, last, one JSON object with the medians.
"""
import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CONFIG = config_flags.DEFINE_config_file("config", "configs/small.py", "Config file (Python, get_config()).",
                                          lock_config=True)
_DEVICES = flags.DEFINE_integer("devices", 8, "Simulated CPU devices, all in mesh.fsdp.")
_SAVES = flags.DEFINE_integer("saves", 5, "Saves timed (each of another step).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax's INFO lines, one per file
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_DEVICES.value}"
  import jax  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS)
  from electra_jax.pretrain import experiment  # pylint: disable=g-import-not-at-top
  from electra_jax.run import checkpoints  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  config.mesh.update(data=1, fsdp=-1)
  config.train.keep_checkpoints = 2
  exp = experiment.create(config)
  state = exp.sharded.init(jax.random.key(0))
  jax.block_until_ready(state)
  blocking, writing = [], []
  with tempfile.TemporaryDirectory() as workdir:
    ckpt = checkpoints.Checkpointer(workdir, config)
    for step in range(1, _SAVES.value + 1):
      t0 = time.perf_counter()
      ckpt.save(step, state, {}, force=True)
      t1 = time.perf_counter()
      ckpt._manager.wait_until_finished()  # pylint: disable=protected-access  (the write alone, for the record)
      blocking.append(t1 - t0)
      writing.append(time.perf_counter() - t1)
      print(f"save {step}: blocks {blocking[-1] * 1e3:.0f} ms, then writes {writing[-1] * 1e3:.0f} ms")
    ckpt.close()
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  print(json.dumps(dict(config=os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"])),
                        devices=len(jax.devices()), state_mib=state_bytes / 2**20, param_arrays=len(jax.tree.leaves(
                            state.params)), save_blocking_s=statistics.median(blocking),
                        save_writing_s=statistics.median(writing))))


if __name__ == "__main__":
  app.run(main)
