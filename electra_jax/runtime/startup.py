"""The process's JAX runtime (storage, compilation cache, processes, random bits), set up by every entry point."""
import os

import jax

from electra_jax.runtime import peers, storage

# How long a CPU collective's local device threads wait for its cross-process part before XLA aborts the process.
CPU_COLLECTIVE_FLAG = "xla_cpu_collective_call_terminate_timeout_seconds"


def lost_peer_settings(timeout_s: float) -> dict:
  """Before JAX's backend starts: JAX's own timeouts for a lost peer beyond peers.Watchdog's longest wait (XLA_FLAGS,
  and the jax.distributed.initialize keyword arguments returned). Nothing where `timeout_s` is 0."""
  if timeout_s <= 0:
    return {}
  seconds = int((peers.STARTUP_GRACE + 1) * timeout_s + 60)
  if jax.__version_info__ >= (0, 8):  # older jaxlibs hold it at 40 s and reject the flag
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(f"--{CPU_COLLECTIVE_FLAG}=")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--{CPU_COLLECTIVE_FLAG}={seconds}"])
  return dict(heartbeat_timeout_seconds=seconds)


def initialize(peer_timeout_s: float = 0):
  """Call before anything touches the devices. Joins a multi-host run from launch/gpu.sh's variables or a TPU pod's."""
  storage.initialize()
  if not jax.config.jax_compilation_cache_dir:  # compiled steps kept for a restart; JAX_COMPILATION_CACHE_DIR wins
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    jax.config.update("jax_compilation_cache_dir", os.path.join(home, "electra_jax", "xla"))
  if "JAX_COORDINATOR_ADDRESS" in os.environ:
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_NUM_PROCESSES"]),
                               int(os.environ["JAX_PROCESS_ID"]), **lost_peer_settings(peer_timeout_s))
  elif os.environ.get("TPU_WORKER_HOSTNAMES", "localhost").count(",") > 0:
    jax.distributed.initialize(**lost_peer_settings(peer_timeout_s))
  # Partitionable threefry draws sharded random arrays shard-locally on accelerators, but costs a CPU step dearly
  # (docs/benchmarks.md); values are independent of the mesh either way.
  if jax.default_backend() == "cpu":
    jax.config.update("jax_threefry_partitionable", False)
