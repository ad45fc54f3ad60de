"""Runs the real `python -m electra_jax.pretrain` for the checkpoint and bad-input tests.

The subprocesses see the 8 simulated devices and the JAX compilation cache of conftest.py (both are inherited through
the environment), so only the first of them compiles the step.
"""
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys

import tensorstore as ts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def xla_flags(devices: int = 8, exact: bool = False) -> str:
  """XLA_FLAGS for the tests: `devices` simulated CPU devices (0: the host's one) at optimisation level 0, which
  compiles 3-4x faster, and without XLA:CPU's fusion emitters, which halves each compile again: compiling tiny models
  is most of the suite's time. Two programs of the same steps (k steps a call and one; a step with a debugging branch)
  then differ in the last bit where XLA's own code generation keeps them equal: `exact` keeps it (the emitters on, as
  every command runs) for the tests that compare such programs bit for bit."""
  count = f"--xla_force_host_platform_device_count={devices} " if devices else ""
  return count + "--xla_backend_optimization_level=0" + ("" if exact else " --xla_cpu_use_fusion_emitters=false")


def exactly(fn, *args):
  """fn(*args) (a module-level function; args and result pickled) in a Python process of its own whose XLA generates
  code as every command does (xla_flags' `exact`), set up as conftest.py sets up the suite's."""
  flags = os.environ["XLA_FLAGS"]
  os.environ["XLA_FLAGS"] = xla_flags(8, exact=True)  # what the new process starts with
  try:
    with concurrent.futures.ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), _set_up) as pool:
      return pool.submit(fn, *args).result()
  finally:
    os.environ["XLA_FLAGS"] = flags


def _set_up():
  from electra_jax.runtime import console, startup  # pylint: disable=g-import-not-at-top
  console.choose_platforms()
  startup.initialize()


def compile_cache(cache_dir) -> dict:
  """The environment that makes JAX keep every compiled program in cache_dir (and reuse it), however small."""
  return dict(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def env(**overrides) -> dict:
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **overrides)


def clock_shifted(environ, shift: str) -> dict:
  """`environ` with its wall clock shifted by `shift` (libfaketime's "+3h", "-3h"; the dev extra's libfaketime
  package brings the library), the monotonic clock left alone: a machine whose clock is wrong."""
  import libfaketime  # pylint: disable=g-import-not-at-top
  _, additions = libfaketime.get_reload_information()
  additions = {k: ":".join(filter(None, (v, environ.get(k)))) if k.startswith("LD_") else v
               for k, v in additions.items()}
  return dict(environ, **additions, FAKETIME=shift)


def cmd(config, workdir, *flags) -> list[str]:
  return [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
          f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}", *flags]


def run(environ, config, workdir, *flags, wrapper=()) -> subprocess.CompletedProcess:
  """Runs to the end (`timeout -k`: a hung run is killed), under `wrapper` (a command prefix) if given."""
  command = [*wrapper, "timeout", "-k", "10", "420", *cmd(config, workdir, *flags)]
  return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, check=False)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_processes(environ, config, workdir, *flags, processes: int = 2, devices: int = 4,
                    xla: str = "") -> list[subprocess.Popen]:
  """Starts a job of `processes` x `devices` CPU devices (jax.distributed over a loopback coordinator), each
  process as `start` does, with XLA flags `xla` besides."""
  coordinator = f"127.0.0.1:{free_port()}"
  return [start(dict(environ, XLA_FLAGS=f"{xla_flags(devices)} {xla}", JAX_COORDINATOR_ADDRESS=coordinator,
                     JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(i)), config, workdir, *flags)
          for i in range(processes)]


def start(environ, config, workdir, *flags) -> subprocess.Popen:
  """Starts in the background, without a `timeout` wrapper so that signals reach it; its output goes to a new
  <workdir>.<n>.log (Orbax logs a lot: a pipe could fill up), named by `proc.log`."""
  n = sum(f.startswith(os.path.basename(workdir) + ".") for f in os.listdir(os.path.dirname(workdir)))
  log = f"{workdir}.{n}.log"
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.Popen(cmd(config, workdir, *flags), cwd=ROOT, env=environ, stdout=f, stderr=f, text=True)
  proc.log = log
  return proc


def log(proc) -> str:
  with open(proc.log, encoding="utf-8") as f:
    return f.read()


def logged_steps(workdir) -> list[int]:
  """Steps in metrics.jsonl (complete lines only; a session's closing time split aside)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [r["step"] for r in map(json.loads, (l for l in f if l.endswith("\n"))) if "goodput" not in r]


def checkpoint_dirs(workdir) -> list[str]:
  path = os.path.join(workdir, "checkpoints")
  return sorted(os.listdir(path)) if os.path.isdir(path) else []


def file_hashes(path) -> dict:
  """Every file under `path` with its content's hash: what must not change."""
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      with open(os.path.join(root, f), "rb") as fh:
        out[os.path.relpath(os.path.join(root, f), path)] = hashlib.sha256(fh.read()).hexdigest()
  return out


def saved_arrays(checkpoint) -> dict:
  """Name -> TensorStore array of a checkpoint's state, opened straight from its files (no Orbax, no target)."""
  store = {"driver": "ocdbt", "base": f"file://{os.path.abspath(os.path.join(checkpoint, 'state'))}/"}
  names = [k.decode()[:-len("/.zarray")] for k in ts.KvStore.open(store).result().list().result()
           if k.endswith(b"/.zarray")]
  return {n: ts.open({"driver": "zarr", "kvstore": {**store, "path": n + "/"}}).result() for n in names}


def spoil(checkpoint, what: str):
  """Inverts the first 64 bytes of every file of a checkpoint's arrays ("unreadable": metadata included), writes
  other values into one saved array through TensorStore itself ("corrupt": every file stays well-formed, so only
  the checksums saved with the checkpoint can tell), or deletes the arrays ("partial").

  "corrupt" goes through TensorStore because the arrays are zstd-compressed: flipped bytes in a data file may or may
  not still decompress, depending on where the chunks landed."""
  state = os.path.join(checkpoint, "state")
  if what == "partial":
    shutil.rmtree(state)
  elif what == "corrupt":
    array = next(a for n, a in saved_arrays(checkpoint).items() if n.startswith("params.") and n.endswith("kernel"))
    array.write(array.read().result() + 1).result()
  else:
    for root, _, files in os.walk(state):
      for f in files:
        with open(os.path.join(root, f), "r+b") as fh:
          data = fh.read(64)
          fh.seek(0)
          fh.write(bytes(b ^ 0xff for b in data))
