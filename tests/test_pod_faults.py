"""A pod's faults, on two pre-training processes x 4 CPU devices (jax.distributed on loopback): one process killed -9
or stopped (SIGSTOP: a stalled host) mid-run ends the other within train.peer_timeout_s in one line, exit 1, and the
rerun of both resumes to the straight run's parameters bit for bit; SIGTERM to one of them stops both at the same
step, saved, exit 0.

The faults hit one workdir in turn, each rerun resuming from what the one before left (SIGTERM's stop, then a kill
-9, then a stall), so that one final rerun checks the resume after all three: every two-process run compiles its
step afresh (process 1's programs are not in the persistent cache: only process 0 writes it), a third of a minute
each; the straight run goes on beside the faults' reruns."""
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import pretrain_cli

pytestmark = pytest.mark.slow

STEPS = 16  # room after SIGTERM's stop (step 5 on a loaded machine) for the two faults' reruns to go on: a kill in
# the last save would leave the stall nothing to run
TIMEOUT_S = 15  # a loaded 2-core CI machine can hold a heartbeat back for seconds
FLAGS = (f"--config.train.num_steps={STEPS}", "--config.train.log_every=1", "--config.train.checkpoint_every=2",
         f"--config.train.eval_every={STEPS}", f"--config.train.peer_timeout_s={TIMEOUT_S}")


@contextlib.contextmanager
def _busy_host(processes: int = 2):
  """Processes spinning on the CPU beside the run: a loaded host holds the watchdog's threads back."""
  spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
  try:
    yield
  finally:
    for p in spinners:
      p.kill()
      p.wait()


def _wait(procs, timeout=300) -> list[int]:
  try:
    return [p.wait(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      p.kill()


def _run_to_end(config, workdir):
  procs = pretrain_cli.start_processes(pretrain_cli.env(), config, str(workdir), *FLAGS)
  assert _wait(procs) == [0, 0], pretrain_cli.log(procs[0])[-3000:] + pretrain_cli.log(procs[1])[-3000:]


def _started(config, workdir, logged=3, xla=""):
  """Both processes (with XLA flags `xla`), once process 0 has logged step `logged` (so a checkpoint is complete) in
  this run: a rerun rewinds metrics.jsonl to its checkpoint before its bar, so the steps logged before are not taken
  for its own."""
  procs = pretrain_cli.start_processes(pretrain_cli.env(), config, str(workdir), *FLAGS, xla=xla)
  deadline = time.time() + 300
  while "pre-training" not in pretrain_cli.log(procs[0]) or max(pretrain_cli.logged_steps(str(workdir)),
                                                                  default=0) < logged:
    assert time.time() < deadline and all(p.poll() is None for p in procs), pretrain_cli.log(procs[0])[-3000:]
    time.sleep(0.05)
  return procs


def _final(workdir) -> tuple[dict, list]:
  arrays = pretrain_cli.saved_arrays(os.path.join(workdir, "checkpoints", str(STEPS)))
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  timing = ("tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s")
  return ({n: a.read().result() for n, a in arrays.items()},
          [{k: v for k, v in r.items() if k not in timing} for r in rows if "goodput" not in r])


@pytest.fixture(scope="module")
def straight(tiny_data, sigterm, tmp_path_factory):
  """The straight run, started once SIGTERM's run has put its programs in the compilation cache and left to run
  beside the faults' reruns (their survivors mostly wait out the heartbeat timeout); calling it waits for its end and
  gives its _final."""
  workdir = tmp_path_factory.mktemp("pod") / "straight"
  procs = pretrain_cli.start_processes(pretrain_cli.env(), tiny_data[0], str(workdir), *FLAGS)

  def result():
    assert _wait(procs) == [0, 0], pretrain_cli.log(procs[0])[-3000:] + pretrain_cli.log(procs[1])[-3000:]
    return _final(workdir)
  yield functools.cache(result)
  for p in procs:
    p.kill()


def _assert_resumes_exactly(config, workdir, straight):
  _run_to_end(config, workdir)
  arrays, rows = _final(workdir)
  straight = straight()
  assert rows == straight[1]
  assert arrays.keys() == straight[0].keys()
  for name, value in arrays.items():
    np.testing.assert_array_equal(value, straight[0][name], err_msg=name)


@pytest.fixture(scope="module")
def sigterm(tiny_data, tmp_path_factory):
  """SIGTERM to process 1 of a new run once process 0 has logged step 3: (exit codes, each process's "Stopped by"
  lines, the checkpoints then, the workdir); the lost-process test goes on from that workdir."""
  workdir = tmp_path_factory.mktemp("pod") / "run"
  procs = _started(tiny_data[0], workdir)
  procs[1].send_signal(signal.SIGTERM)
  codes = _wait(procs)
  assert codes == [0, 0], pretrain_cli.log(procs[0])[-3000:]
  stopped = [[l for l in pretrain_cli.log(p).splitlines() if "Stopped by" in l] for p in procs]
  return codes, stopped, pretrain_cli.checkpoint_dirs(str(workdir)), workdir


def test_sigterm_to_one_process_stops_both_at_the_same_step(sigterm):
  codes, stopped, checkpoints, _ = sigterm
  assert codes == [0, 0]
  steps = [int(s[-1].split(" after step ")[1].split(",")[0]) for s in stopped]
  assert steps[0] == steps[1] < STEPS and str(steps[0]) in checkpoints, stopped


def _newest_checkpoint(workdir) -> int:
  return max(int(c) for c in pretrain_cli.checkpoint_dirs(str(workdir)) if c.isdigit())


def _lose_a_process(config, workdir, fault, victim, in_save=False):
  """Reruns both processes until process 0 logs the first odd step past the newest checkpoint (as step 3 of a new run)
  and, `in_save`, until the next checkpoint is being written (the victim's loss then cuts the save's collectives off),
  then sends `fault` to `victim` while two more processes load the CPU: the other ends in one line within the
  timeout, naming the newest complete checkpoint, never in JAX's abort. The runs' environment sets JAX's own wait for
  a collective's cross-process part far below the watchdog's timeout (as its default, 40 s, is below the default
  train.peer_timeout_s): the command sets it beyond."""
  newest = _newest_checkpoint(workdir)
  procs = _started(config, workdir, logged=newest + 1 + newest % 2,
                   xla="--xla_cpu_collective_call_terminate_timeout_seconds=5")
  while in_save and not any(".orbax-checkpoint-tmp" in c for c in pretrain_cli.checkpoint_dirs(str(workdir))):
    assert all(p.poll() is None for p in procs), pretrain_cli.log(procs[0])[-3000:]
    time.sleep(0.002)
  with _busy_host():
    os.kill(procs[victim].pid, fault)
    t0 = time.time()
    survivor = procs[1 - victim]
    code = _wait([survivor], timeout=120)[0]
    took = time.time() - t0
  log = pretrain_cli.log(survivor)
  last = log.strip().splitlines()[-1]
  print(f"{fault.name} to process {victim}: the other exited {code} after {took:.1f} s: {last}")
  procs[victim].kill()
  procs[victim].wait()
  assert code == 1 and took < TIMEOUT_S + 20, log[-4000:]
  assert "Fatal Python error" not in log and "Termination timeout" not in log, log[-3000:]  # JAX's abort: none
  assert last.startswith(f"electra-pretrain: error: process {victim} of 2 stopped responding (no heartbeat for "), last
  assert last.endswith(f"; the newest complete checkpoint is step {_newest_checkpoint(workdir)} under {workdir}/"
                       "checkpoints: run every process again to resume from it"), last


def test_a_lost_process_ends_the_other_in_one_line(tiny_data, sigterm, straight):
  """Process 1 killed -9 while a checkpoint is written in the rerun after SIGTERM's stop, then process 0 stalled
  (SIGSTOP) in the rerun after the kill; the last rerun resumes from what all three left to the straight run's end."""
  config, workdir = tiny_data[0], sigterm[3]
  _lose_a_process(config, workdir, signal.SIGKILL, 1, in_save=True)
  _lose_a_process(config, workdir, signal.SIGSTOP, 0)
  _assert_resumes_exactly(config, workdir, straight)


# A loop of collectives under the watchdog, the way the commands' loop runs it, on 2 processes x 1 CPU device; the
# process named by argv[2] raises an error of its own at step 3.
ONE_FAILS = """
import sys
from jax.experimental import multihost_utils
from electra_jax import cli
from electra_jax.runtime import peers, startup
startup.initialize(peer_timeout_s=15)
try:
  with peers.Watchdog(15, "loop", lambda: "nothing saved", on_lost=lambda: None):
    for step in range(600):
      multihost_utils.sync_global_devices(f"step {step}")
      if step == 3 and int(sys.argv[1]) == int(sys.argv[2]):
        raise ValueError("an error of its own")
except ValueError as e:
  cli.fail("loop", e)
"""


@pytest.mark.parametrize("failing", [0, 1])
def test_an_error_of_one_process_ends_every_process_in_one_line(tmp_path, failing):
  """The failing process ends in its own line, every other one in a line naming it, all with exit 1 within seconds,
  none in JAX's abort: jax.distributed's shutdown waits for every process, and aborts the one whose peer left first
  (process 0, the coordination service's host, failing or not)."""
  coordinator = f"127.0.0.1:{pretrain_cli.free_port()}"
  procs = [subprocess.Popen([sys.executable, "-c", ONE_FAILS, str(i), str(failing)], cwd=pretrain_cli.ROOT,
                            env=pretrain_cli.env(XLA_FLAGS=pretrain_cli.xla_flags(0), JAX_COORDINATOR_ADDRESS=coordinator,
                                                 JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)),
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    errors = [p.communicate(timeout=60)[1] for p in procs]
  finally:
    for p in procs:
      p.kill()
  lasts = [e.strip().splitlines()[-1] for e in errors]
  assert [p.returncode for p in procs] == [1, 1], "\n".join(e[-3000:] for e in errors)
  assert lasts[failing] == "loop: error: an error of its own", lasts
  assert lasts[1 - failing] == (f"loop: error: process {failing} of 2 failed: an error of its own; nothing saved: run "
                                "every process again to resume from it"), lasts
