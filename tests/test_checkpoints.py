"""Checkpoints and fault tolerance, end to end with the real electra-pretrain in subprocesses on tiny real data.

One straight run of N steps is the reference. A second run is killed (SIGKILL right after a checkpoint, SIGKILL in
the middle of an async save, SIGKILL at seeded random steps), stopped (SIGTERM) and resumed each time by the same
command: its final parameters are bitwise those of the straight run and so is every metrics.jsonl row. Subprocesses
share a JAX compilation cache, so only the first one compiles the step.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from electra_jax import checkpoints, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 8
TIME_FIELDS = {"tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s"}
RUN_FLAGS = (f"--config.train.num_steps={N}", "--config.train.checkpoint_every=2", "--config.train.log_every=1",
             "--config.train.eval_every=1000", "--config.train.keep_checkpoints=3")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jit")),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def _cmd(config, workdir, *flags):
  return [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
          f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}", *RUN_FLAGS, *flags]


def _start(env, config, workdir, *flags):
  """The run in the background (no `timeout` wrapper: the signals must reach it; _wait kills it when it hangs), its
  output in a new <workdir>.<n>.log (Orbax logs a lot: a pipe could fill up)."""
  n = sum(f.startswith(os.path.basename(workdir) + ".") for f in os.listdir(os.path.dirname(workdir)))
  log = f"{workdir}.{n}.log"
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.Popen(_cmd(config, workdir, *flags), cwd=ROOT, env=env, stdout=f, stderr=f, text=True)
  proc.log = log
  return proc


def _log(proc):
  with open(proc.log, encoding="utf-8") as f:
    return f.read()


def _run(env, config, workdir, *flags, **kw):
  return subprocess.run(["timeout", "-k", "10", "420", *_cmd(config, workdir, *flags)], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=False, **kw)


def _steps(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(l)["step"] for l in f if l.endswith("\n")]


def _checkpoints(workdir):
  path = os.path.join(workdir, "checkpoints")
  return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _training(proc, workdir):
  """The steps the run logged since it started (metrics.jsonl is rewound to the restored step before the bar)."""
  return _steps(workdir) if "pre-training" in _log(proc) else []


def _wait(proc, until, what, timeout=300):
  deadline = time.time() + timeout
  while not until():
    assert proc.poll() is None, f"exited (rc={proc.returncode}) before {what}: {_log(proc)[-2000:]}"
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.005)


def _kill(proc, sig=signal.SIGKILL):
  proc.send_signal(sig)
  return proc.wait(timeout=120)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(l).items() if k not in TIME_FIELDS} for l in f]


def _params(workdir, step=None):
  return jax.device_get(checkpoints.load_params(str(workdir), step)[1])


def _assert_same_params(a, b):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def straight(tiny_data, env, tmp_path_factory):
  """N steps in one go, started at once; `result()` waits for it: the reference every resumed run must match."""
  config, _ = tiny_data
  workdir = tmp_path_factory.mktemp("straight") / "run"
  proc = _start(env, config, workdir)

  def result():
    assert proc.wait(timeout=420) == 0, _log(proc)[-3000:]
    return workdir
  yield result
  proc.kill()


def test_kills_and_sigterm_resume_exactly(tiny_data, env, straight, tmp_path):
  config, _ = tiny_data
  workdir = str(tmp_path / "run")

  # SIGKILL right after the first checkpoint is complete.
  proc = _start(env, config, workdir)
  _wait(proc, lambda: "2" in _checkpoints(workdir), "checkpoint 2")
  _kill(proc)

  # SIGKILL while an async save is being written: Orbax's temporary directory is there, the step is not.
  proc = _start(env, config, workdir)
  _wait(proc, lambda: any(".orbax-checkpoint-tmp" in c for c in _checkpoints(workdir)), "a save in progress")
  _kill(proc)
  in_progress = [c for c in _checkpoints(workdir) if ".orbax-checkpoint-tmp" in c]
  assert in_progress, "the save finished before the kill"
  assert in_progress[0].split(".")[0] not in _checkpoints(workdir)

  # SIGTERM: finish the step, save it, exit 0.
  proc = _start(env, config, workdir)
  _wait(proc, lambda: max(_training(proc, workdir) or [0]) > 2, "a step after the resume")
  assert _kill(proc, signal.SIGTERM) == 0, _log(proc)[-3000:]
  stopped = max(_steps(workdir))
  assert f"Stopped by SIGTERM after step {stopped}" in _log(proc)
  assert str(stopped) in _checkpoints(workdir)

  # SIGKILL at seeded random steps of resumed runs.
  rng = np.random.default_rng(0)
  for _ in range(2):
    start = max(int(c) for c in _checkpoints(workdir) if c.isdigit())
    if start + 1 >= N:
      break
    kill_at = int(rng.integers(start + 1, N))
    proc = _start(env, config, workdir)
    _wait(proc, lambda: kill_at in _training(proc, workdir), f"step {kill_at}")  # pylint: disable=cell-var-from-loop
    time.sleep(rng.uniform(0, 0.5))
    _kill(proc)

  out = _run(env, config, workdir)
  assert out.returncode == 0, out.stderr[-3000:]
  reference = straight()
  assert _checkpoints(workdir) == _checkpoints(reference) == ["4", "6", "8"]
  _assert_same_params(_params(reference), _params(workdir))
  expected, got = _metrics(reference), _metrics(workdir)
  assert [r["step"] for r in got] == list(range(1, N + 1))
  assert got == expected
