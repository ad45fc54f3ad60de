"""Checkpoints and fault tolerance, end to end with the real electra-pretrain on tiny real data.

One straight run of N steps is the reference. A second run is killed (SIGKILL after a checkpoint, in the middle of
the next async save; SIGKILL at a seeded random step), stopped (SIGTERM) and resumed each time by the same command: its final parameters are bitwise those of the straight run and so is every metrics.jsonl row. So is a run
that finds its latest checkpoint corrupt and resumes from the one before.
"""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import time

import jax
import numpy as np
import pytest

from electra_jax.pretrain import experiment
from electra_jax.run import checkpoints, weights
from electra_jax.run import workdir as workdir_lib
from tests import pretrain_cli as cli

pytestmark = pytest.mark.slow  # every test here runs the commands as subprocesses

N = 8
TIME_FIELDS = {"tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s"}
RUN = (f"--config.train.num_steps={N}", "--config.train.checkpoint_every=2", "--config.train.log_every=1",
       "--config.train.eval_every=1000", "--config.train.keep_checkpoints=3")


@pytest.fixture(scope="module")
def env():
  """The code XLA generates for every command (cli.xla_flags' `exact`): the NaN run's program, with its debugging
  branch, is to match the straight run's bit for bit up to its NaN."""
  return cli.env(XLA_FLAGS=cli.xla_flags(8, exact=True))


def _training(proc, workdir):
  """The steps a run logged, once it is training (metrics.jsonl is rewound to the restored step before its bar)."""
  return cli.logged_steps(workdir) if "pre-training" in cli.log(proc) else []


def _wait(proc, until, what, timeout=300):
  deadline = time.time() + timeout
  while not until():
    assert proc.poll() is None, f"exited (rc={proc.returncode}) before {what}: {cli.log(proc)[-2000:]}"
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.005)


def _signal(proc, sig=signal.SIGKILL):
  proc.send_signal(sig)
  return proc.wait(timeout=120)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in r.items() if k not in TIME_FIELDS} for r in map(json.loads, f) if "goodput" not in r]


def _params(workdir, step=None):
  return jax.device_get(weights.load(str(workdir), step).params)


def _assert_same_params(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def straight(tiny_data, env, tmp_path_factory):
  """N steps in one go, started at once; calling it waits: the reference every resumed run must match.
  `straight.compiled()` waits until it has saved its first checkpoint: every program of a run up to there is in the
  shared compilation cache."""
  config, _ = tiny_data
  workdir = tmp_path_factory.mktemp("straight") / "run"
  proc = cli.start(env, config, workdir, *RUN)

  def result():
    assert proc.wait(timeout=420) == 0, cli.log(proc)[-3000:]
    return workdir
  result.compiled = lambda: proc.poll() is not None or _wait(
      proc, lambda: any(c.isdigit() for c in cli.checkpoint_dirs(workdir)), "the straight run's first checkpoint")
  yield result
  proc.kill()


def _selected(request, test) -> bool:
  return any(item.module.__name__ == __name__ and item.originalname == test for item in request.session.items)


@pytest.fixture(scope="module", autouse=True)
def runs(tiny_data, env, straight, tmp_path_factory, request):
  """The runs of the tests below the kill test (those this session runs), one at a time in a thread beside the kill
  test, which keeps the other core busy: test name -> future of what it checks. They start once the straight run has
  compiled its programs (the NaN runs compile their own; the others start from the straight run's end)."""
  config, _ = tiny_data
  base = tmp_path_factory.mktemp("runs")

  def nan():
    """Both runs (NaN at step 5 with train.max_bad_steps=1, then again on the same workdir), a copy of the workdir
    after the first, the workdir."""
    workdir = base / "nan"
    straight.compiled()
    nan_at_5 = ("--config.train.debug_nan_at_step=5", "--config.train.max_bad_steps=1")
    first = cli.run(env, config, workdir, *RUN, *nan_at_5)
    shutil.copytree(workdir, base / "nan_after_first")
    again = cli.run(env, config, workdir, *RUN, *nan_at_5)
    return first, base / "nan_after_first", again, workdir

  def corrupt():
    """The run on a copy of the straight run whose checkpoint N is corrupt, and that checkpoint's file hashes."""
    workdir = base / "corrupt"
    shutil.copytree(straight(), workdir)
    cli.spoil(workdir / "checkpoints" / str(N), "corrupt")
    corrupt = cli.file_hashes(workdir / "checkpoints" / str(N))
    return cli.run(env, config, workdir, *RUN), workdir, corrupt

  def fewer_devices():
    """The straight run continued to N + 2 on 4 devices with batch 8."""
    workdir = base / "fewer_devices"
    shutil.copytree(straight(), workdir)
    four = dict(env, XLA_FLAGS=cli.xla_flags(4))
    return cli.run(four, config, workdir, *RUN, f"--config.train.num_steps={N + 2}", "--config.train.batch_size=8",
                   "--allow_config_change"), workdir

  jobs = {"test_nan_stops_at_its_step_and_keeps_the_last_good_checkpoint": nan,
          "test_corrupt_latest_checkpoint_resumes_from_the_one_before": corrupt,
          "test_resume_on_fewer_devices_with_another_batch_size": fewer_devices}
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    yield {test: pool.submit(job) for test, job in jobs.items() if _selected(request, test)}


def test_kills_and_sigterm_resume_exactly(tiny_data, env, straight, tmp_path):
  config, _ = tiny_data
  workdir = str(tmp_path / "run")

  # SIGKILL once the first checkpoint is complete, while the next async save is being written: Orbax's temporary
  # directory is there, the step is not (one run for both: each run is seconds of start-up). Started once the
  # straight run's programs are in the cache: the two would compile the same ones at once.
  straight.compiled()
  proc = cli.start(env, config, workdir, *RUN)
  _wait(proc, lambda: "2" in cli.checkpoint_dirs(workdir) and any(
      ".orbax-checkpoint-tmp" in c for c in cli.checkpoint_dirs(workdir)), "checkpoint 2, then a save in progress")
  _signal(proc)
  in_progress = [c for c in cli.checkpoint_dirs(workdir) if ".orbax-checkpoint-tmp" in c]
  assert in_progress, "the save finished before the kill"
  assert in_progress[0].split(".")[0] not in cli.checkpoint_dirs(workdir) and "2" in cli.checkpoint_dirs(workdir)

  # SIGTERM: finish the step, save it, exit 0.
  proc = cli.start(env, config, workdir, *RUN)
  _wait(proc, lambda: max(_training(proc, workdir) or [0]) > 2, "a step after the resume")
  assert _signal(proc, signal.SIGTERM) == 0, cli.log(proc)[-3000:]
  stopped = max(cli.logged_steps(workdir))
  assert f"Stopped by SIGTERM after step {stopped}" in cli.log(proc)
  assert str(stopped) in cli.checkpoint_dirs(workdir)

  # SIGKILL at a seeded random step of a resumed run (one: each run is seconds of start-up; tests/soak.py kills many).
  rng = np.random.default_rng(0)
  start = max(int(c) for c in cli.checkpoint_dirs(workdir) if c.isdigit())
  if start + 1 < N:
    kill_at = int(rng.integers(start + 1, N))
    proc = cli.start(env, config, workdir, *RUN)
    _wait(proc, lambda: kill_at in _training(proc, workdir), f"step {kill_at}")
    time.sleep(rng.uniform(0, 0.5))
    _signal(proc)

  out = cli.run(env, config, workdir, *RUN)
  assert out.returncode == 0, out.stderr[-3000:]
  reference = straight()
  assert cli.checkpoint_dirs(reference) == ["4", "6", "8"]
  # the newest three of every 2 steps' and the SIGTERM's (a log row comes two steps late: the stop may be past 4)
  assert cli.checkpoint_dirs(workdir) == sorted({"2", "4", "6", "8", str(stopped)}, key=int)[-3:]
  _assert_same_params(_params(reference), _params(workdir))
  assert [r["step"] for r in _metrics(workdir)] == list(range(1, N + 1))
  assert _metrics(workdir) == _metrics(reference)


def test_nan_stops_at_its_step_and_keeps_the_last_good_checkpoint(straight, runs, request):
  out, after_first, again, workdir = runs[request.node.originalname].result()
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("electra-pretrain: error: loss=nan grad_norm=nan at step 5: 1 non-finite steps in a row "
                         "(train.max_bad_steps), none of them applied; stopped without saving it; the newest "
                         "checkpoint is kept (step 4 under "), last
  assert cli.checkpoint_dirs(after_first) == ["2", "4"] and cli.logged_steps(after_first) == [1, 2, 3, 4]
  _assert_same_params(_params(straight(), 4), _params(after_first, 4))

  # Non-finite from the first step after a restore: the checkpoint's weights are finite (checked as restored) but
  # lead straight to non-finite steps.
  out = again
  last = out.stderr.strip().splitlines()[-1]
  assert out.returncode == 1 and re.fullmatch(
      r"electra-pretrain: error: loss=nan grad_norm=nan at step 5: 1 non-finite steps in a row \(train.max_bad_steps\), "
      r"none of them applied, every step since resuming from step 4: its weights are finite but lead to non-finite "
      r"steps; lower train.learning_rate, or move .*/checkpoints/4 aside to resume from the one before", last), last
  assert cli.checkpoint_dirs(workdir) == ["2", "4"]


def test_corrupt_latest_checkpoint_resumes_from_the_one_before(straight, runs, request):
  """Checkpoint N's arrays altered on disk (the files still parse): one warning line, the run resumes from N - 2
  and ends as the straight run did; the corrupt checkpoint is kept, byte for byte, under another name."""
  out, workdir, corrupt = runs[request.node.originalname].result()
  assert out.returncode == 0, out.stderr[-3000:]
  warnings = [l for l in out.stderr.splitlines() if "corrupt" in l]
  assert len(warnings) == 1 and re.search(
      rf"checkpoint .*/checkpoints/{N} is corrupt: the bytes of \d+ of its \d+ arrays \(e.g. \S+\) differ from the "
      rf"checksums saved with it: "
      rf"using step {N - 2} instead, the newest intact checkpoint \(kept as .*/checkpoints/{N}.corrupt\)$",
      warnings[0]), warnings
  assert f"Resumed from step {N - 2} " in out.stderr
  assert cli.checkpoint_dirs(workdir) == [str(N - 4), str(N - 2), str(N), f"{N}.corrupt"]
  assert cli.file_hashes(workdir / "checkpoints" / f"{N}.corrupt") == corrupt
  _assert_same_params(_params(straight()), _params(workdir))
  assert _metrics(workdir) == _metrics(straight())


def test_resume_on_fewer_devices_with_another_batch_size(runs, request):
  """8 devices -> 4 (the arrays are resharded onto the new mesh), batch 16 -> 8 with a note, continuing to N + 2."""
  out, workdir = runs[request.node.originalname].result()
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Continuing" in out.stderr and "with a changed config (--allow_config_change): train.batch_size: 16 -> 8" \
      in out.stderr
  assert f"Resumed from step {N} onto a {{'data': 4, 'fsdp': 1}} mesh" in out.stderr
  assert (f"train.batch_size changed from 16 to 8 since step {N} was saved: the input continues after the {N * 16} "
          f"examples already seen (at batch {N * 2} of size 8)") in out.stderr
  assert cli.logged_steps(workdir) == list(range(1, N + 3)) and "10" in cli.checkpoint_dirs(workdir)
  assert json.loads((workdir / "config.json").read_text())["train"]["batch_size"] == 8


def test_restore_reshards_onto_another_mesh(tiny_data, straight):
  """A checkpoint written on 8 devices (data=8) restores bitwise onto 2 devices split by FSDP: its weights and step;
  its optimiser state, flat (train.flat_update) and laid out for weights whole on each device, is refused in one line
  naming the mesh it was saved on, for one laid out over fsdp=2 (optim.FlatLayout), and naming the switch, for one
  per weight array."""
  config, prepared = tiny_data
  reference = _params(straight())
  config = workdir_lib.load_config(str(straight()))
  config.mesh.update(data=1, fsdp=2)
  exp = experiment.create(config, prepared.special_ids, devices=jax.devices()[:2])
  ckpt = checkpoints.Checkpointer(str(straight()), config, prepared.tokenizer_path)
  abstract = exp.sharded.abstract()
  restored = ckpt.restore({"params": abstract.params, "step": abstract.step})
  with pytest.raises(ValueError, match=r"checkpoints/8 holds its optimiser state flat over mesh.fsdp=1, this run "
                     r"over 2: resume with --config.mesh.data=-1 --config.mesh.fsdp=1 \(optim.py; the flat update's "
                     r"layout follows the weights' split\)$"):
    ckpt.restore(abstract)
  config.train.flat_update = False
  with pytest.raises(ValueError, match=r"checkpoints/8 holds its optimiser state flat, this run per weight array: "
                     r"resume with --config.train.flat_update=True \(optim.py; a flat update runs on GPUs and CPUs\)$"):
    ckpt.restore(experiment.create(config, prepared.special_ids, devices=jax.devices()[:2]).sharded.abstract())
  ckpt.close()
  kernel = restored.state["params"]["discriminator"]["layer_0"]["intermediate"]["kernel"]
  assert kernel.sharding.mesh.devices.size == 2 and kernel.sharding.spec[0] == "fsdp"
  _assert_same_params(reference, jax.device_get(restored.state["params"]))
  assert restored.extra["position"] == {"step": N} and int(restored.state["step"]) == N


def test_restore_refuses_another_tokenizer(tiny_data, straight, tmp_path):
  config, prepared = tiny_data
  other = tmp_path / "other.model"
  other.write_bytes(open(prepared.tokenizer_path, "rb").read() + b"\0")
  config = workdir_lib.load_config(str(straight()))
  exp = experiment.create(config, prepared.special_ids)
  ckpt = checkpoints.Checkpointer(str(straight()), config, str(other))
  with pytest.raises(ValueError, match=r"checkpoints/8 was trained with another tokenizer \(their SHA-256 differ\)"):
    ckpt.restore(exp.sharded.abstract())
  ckpt.close()


def test_params_only_export_round_trips(straight, tmp_path):
  out = tmp_path / "export"
  assert weights.export_params(str(straight()), str(out), step=6) == str(out)
  assert sorted(os.listdir(out)) == ["config.json", "params"] and os.listdir(tmp_path) == ["export"]
  _assert_same_params(_params(straight(), 6), _params(out))
  with pytest.raises(FileExistsError, match="export exists; pass overwrite=True"):
    weights.export_params(str(straight()), str(out))
  weights.export_params(str(straight()), str(out), overwrite=True)
  _assert_same_params(_params(straight()), _params(out))
  assert os.listdir(tmp_path) == ["export"]
