"""Runs the real `python -m electra_jax.pretrain` for the checkpoint and bad-input tests.

The subprocesses see the 8 simulated devices of conftest.py (XLA_FLAGS is inherited) and share one JAX compilation
cache, so only the first of them compiles the step.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(cache_dir, **overrides) -> dict:
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_COMPILATION_CACHE_DIR=str(cache_dir),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
              **overrides)


def cmd(config, workdir, *flags) -> list[str]:
  return [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
          f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}", *flags]


def run(environ, config, workdir, *flags, shell_setup="") -> subprocess.CompletedProcess:
  """Runs to the end (`timeout -k`: a hung run is killed), after `shell_setup` (e.g. "ulimit -f 256") if given."""
  command = ["timeout", "-k", "10", "420", *cmd(config, workdir, *flags)]
  if shell_setup:
    command = ["sh", "-c", f'{shell_setup} && exec "$@"', "sh", *command]
  return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, check=False)


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
  """Steps in metrics.jsonl (complete lines only)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(l)["step"] for l in f if l.endswith("\n")]


def checkpoint_dirs(workdir) -> list[str]:
  path = os.path.join(workdir, "checkpoints")
  return sorted(os.listdir(path)) if os.path.isdir(path) else []
