"""Cloud Storage stops answering in the middle of a checkpoint save (a fake-gcs-server killed): electra-pretrain ends
within the bound ($ELECTRA_JAX_STORAGE_TIMEOUT_S) in one line, exit 1, no retry tracebacks; with the server back
(the same objects), the same command resumes from the newest complete checkpoint, never from the half-written one.
A store that stops answering without closing its port (the server paused) under electra-export ends it the same way.
A store gone for a few seconds during a save is ridden out: the run saves after it, every checkpoint complete; a save
that failed meanwhile is saved again, and an upload whose session the restarted store lost is started again."""
import re
import subprocess
import sys
import time

import pytest

from tests import fake_gcs, helpers, pretrain_cli

BUCKET = "faults"
TIMEOUT_S = 6
FLAGS = ("--config.train.num_steps=12", "--config.train.checkpoint_every=4", "--config.train.log_every=1",
         "--config.train.eval_every=12")


def _env(store, timeout_s):
  """The commands' environment: the store and its bound, on one device (a store's faults are the same on any mesh, and
  the runs start and step faster)."""
  return pretrain_cli.env(STORAGE_EMULATOR_HOST=store.host, ELECTRA_JAX_STORAGE_TIMEOUT_S=str(timeout_s),
                          XLA_FLAGS=pretrain_cli.xla_flags(1))


def _cmd(config, workdir):
  return [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
          f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}", *FLAGS]


@pytest.mark.slow  # electra-pretrain and electra-export, as subprocesses
def test_store_lost_mid_save_ends_in_one_line_and_the_rerun_resumes(tiny_data, tmp_path):
  config = tiny_data[0]
  store = fake_gcs.Server(tmp_path / "gcs", BUCKET)
  try:
    env = _env(store, TIMEOUT_S)
    workdir = f"gs://{BUCKET}/run"
    log = tmp_path / "run.log"
    with open(log, "w", encoding="utf-8") as f:
      proc = subprocess.Popen(_cmd(config, workdir), cwd=pretrain_cli.ROOT, env=env, stdout=f, stderr=f)
    deadline = time.time() + 300
    while not store.names("run/checkpoints/8/"):  # the second save has begun
      assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
      time.sleep(0.02)
    store.kill()
    killed = time.time()
    code = proc.wait(timeout=120)
    took = time.time() - killed
    out = log.read_text()
    last = out.strip().splitlines()[-1]
    print(f"store killed during save 8: exit {code} after {took:.1f} s: {last}")
    assert code == 1 and took < TIMEOUT_S + 15, out[-3000:]
    assert re.fullmatch(rf"electra-pretrain: error: Cloud Storage \({store.host}\) has not answered for {TIMEOUT_S} s "
                        rf"\(ELECTRA_JAX_STORAGE_TIMEOUT_S={TIMEOUT_S}\): stopped; what was complete before is kept "
                        r"\(a checkpoint or upload cut off midway is never read as complete\): run the same command "
                        "again once the store answers", last), last
    assert "Traceback" not in out, out[-3000:]

    store.start()
    names = store.names("run/checkpoints/")
    complete = sorted({int(p[2]) for p in (n.split("/") for n in names) if p[3:] == ["commit_success.txt"]})
    print(f"complete checkpoints: {complete}; 8 {'complete' if 8 in complete else 'half-written'}")
    assert complete and complete[-1] in (4, 8)
    start = time.time()
    rerun = subprocess.run(["timeout", "-k", "10", "300", *_cmd(config, workdir)], cwd=pretrain_cli.ROOT, env=env,
                           capture_output=True, text=True, check=False)
    print(f"the rerun resumed and finished in {time.time() - start:.1f} s")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resume from the workdir's newest checkpoint, step {complete[-1]}" in rerun.stdout + rerun.stderr
    assert {f"run/checkpoints/{s}/commit_success.txt" for s in (4, 8, 12)} <= store.names("run/checkpoints/")

    # A store that accepts connections but never answers while electra-export reads the workdir to restore it.
    store.pause()
    start = time.time()
    export = subprocess.run(["timeout", "-k", "10", "120", sys.executable, "-m", "electra_jax.export",
                             f"--workdir={workdir}", f"--output={tmp_path / 'export'}"], cwd=pretrain_cli.ROOT,
                            env=env, capture_output=True, text=True, check=False)
    took = time.time() - start
    store.pause(False)
    last = export.stderr.strip().splitlines()[-1]
    print(f"store stalled under electra-export: exit {export.returncode} after {took:.1f} s: {last}")
    assert export.returncode == 1 and took < TIMEOUT_S + 30 and not (tmp_path / "export").exists(), export.stderr
    assert last.startswith(f"electra-export: error: Cloud Storage ({store.host}) has not answered for {TIMEOUT_S} s")
    assert "Traceback" not in export.stderr, export.stderr[-3000:]

    bad = subprocess.run([sys.executable, "-m", "electra_jax.export", f"--workdir={workdir}",
                          f"--output={tmp_path / 'export'}"], cwd=pretrain_cli.ROOT, capture_output=True, text=True,
                         env=dict(env, ELECTRA_JAX_STORAGE_TIMEOUT_S="soon"), timeout=120, check=False)
    helpers.assert_one_line_error(bad, "ELECTRA_JAX_STORAGE_TIMEOUT_S='soon' must be a number of seconds above 0")
  finally:
    store.kill()


@pytest.mark.slow  # electra-pretrain, as a subprocess
def test_store_lost_for_seconds_mid_save_is_ridden_out(tiny_data, tmp_path):
  """The store gone for a few seconds while a checkpoint is written (far below the bound): the run goes on, saves
  again after it, and ends with every checkpoint it left complete, the last at the final step."""
  config = tiny_data[0]
  store = fake_gcs.Server(tmp_path / "gcs", BUCKET)
  try:
    env = _env(store, 60)
    workdir = f"gs://{BUCKET}/run"
    log = tmp_path / "run.log"
    with open(log, "w", encoding="utf-8") as f:
      proc = subprocess.Popen(["timeout", "-k", "10", "300", *_cmd(config, workdir)], cwd=pretrain_cli.ROOT, env=env,
                              stdout=f, stderr=f)
    deadline = time.time() + 300
    while not store.names("run/checkpoints/8/"):  # the second save has begun
      assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
      time.sleep(0.02)
    store.kill()
    time.sleep(4)
    store.start()
    code = proc.wait(timeout=300)
    out = log.read_text()
    names = store.names("run/checkpoints/")
    complete = sorted({int(p[2]) for p in (n.split("/") for n in names) if p[3:] == ["commit_success.txt"]})
    print(f"store gone for 4 s during save 8: exit {code}; complete checkpoints {complete}")
    print("\n".join(l for l in out.splitlines() if l[:1] in "WE" or "again" in l)[-3000:])
    assert code == 0, out[-5000:]
    assert complete[0] == 4 and complete[-1] == 12, complete
    steps = {p[2] for p in (n.split("/") for n in names) if len(p) > 3}
    assert steps == set(map(str, complete)), names  # a save cut off is not left half-written
  finally:
    store.kill()


@pytest.mark.parametrize("where", ["the next save", "the final wait"])
def test_a_failed_save_on_gcs_is_saved_again(tmp_path, monkeypatch, where):
  """A save that fails on gs:// (a store that stumbled) is saved again, whether its failure surfaces at the next save
  or at the final wait; a failure that persists ends in the failed save's line after checkpoints.RETRIES retries.
  (Local paths stand in for gs:// here: the failures are injected.)"""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from electra_jax.run import checkpoints  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import outage, storage
  monkeypatch.setattr(storage, "is_remote", lambda path: True)
  monkeypatch.setattr(outage, "answering", lambda timeout: True)
  method = "save" if where == "the next save" else "wait_until_finished"
  failures = {"left": 1}
  real = getattr(ocp.CheckpointManager, method)

  def stumbling(self, *args, **kwargs):
    if failures["left"] and (method == "wait_until_finished" or self.latest_step() is not None):
      failures["left"] -= 1
      raise FileNotFoundError("http://127.0.0.1:1/upload/storage/v1/b/b/o?uploadType=resumable&upload_id=gone")
    return real(self, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, method, stumbling)
  state = {"w": jnp.arange(8.0)}
  ckpt = checkpoints.Checkpointer(str(tmp_path), tiny.get_config())
  assert ckpt.save(4, state, force=True) and ckpt.save(8, {"w": state["w"] + 1}, force=True)
  ckpt.close()
  assert failures["left"] == 0 and checkpoints.latest_step(str(tmp_path)) == 8
  assert checkpoints.read_state(str(tmp_path), tiny.get_config())["w"].tolist() == list(range(1, 9))

  failures["left"] = checkpoints.RETRIES + 1
  ckpt = checkpoints.Checkpointer(str(tmp_path), tiny.get_config())
  with pytest.raises(OSError, match="saving a checkpoint under .* failed"):
    ckpt.save(12, state, force=True)
    ckpt.save(16, state, force=True)
    ckpt.close()


def test_an_upload_whose_session_the_store_lost_is_started_again(tmp_path, monkeypatch):
  """gcsfs begins every upload with a resumable session; a store restarted between the session's start and its data
  no longer knows it (404: FileNotFoundError). gcsfs_private.restart_lost_uploads has gcsfs start it again."""
  # As storage.initialize does, before gcsfs is first imported: no Storage Control probe of each bucket.
  monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  from gcsfs.core import GCSFileSystem  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import gcsfs_private  # pylint: disable=g-import-not-at-top
  store = fake_gcs.Server(tmp_path / "gcs", BUCKET)
  try:
    gcsfs_private.restart_lost_uploads()
    fs = GCSFileSystem(endpoint_url=f"http://{store.host}", token="anon")
    f = fs.open(f"{BUCKET}/metrics.jsonl", "wb")
    f.write(b"x" * 1000)
    f.offset = 0
    f._initiate_upload()  # pylint: disable=protected-access  (as fsspec's flush does first, when the file closes)
    store.kill()
    store.start()
    f.close()
    assert fs.cat(f"{BUCKET}/metrics.jsonl") == b"x" * 1000
  finally:
    store.kill()


def test_a_copy_whose_upload_session_the_store_lost_midway_is_started_again(tmp_path, monkeypatch):
  """A file larger than gcsfs's block size goes up in several requests of one session; a store restarted between
  them no longer knows it: storage.copy_file starts the copy again from the first byte (a dataset's upload)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import storage  # pylint: disable=g-import-not-at-top
  store = fake_gcs.Server(tmp_path / "gcs", BUCKET)
  try:
    for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
      monkeypatch.setenv(name, store.host)
    storage.initialize()
    data = bytes(range(256)) * (40 << 12)  # 10 MiB: two of gcsfs's blocks and more
    (tmp_path / "shard").write_bytes(data)
    monkeypatch.setattr(storage, "_CHUNK", 6 << 20)
    copyfileobj, restarts = shutil.copyfileobj, []

    def restarting_midway(r, w, length):
      w.write(r.read(length))
      w.flush()  # the first 6 MiB sent, in the upload's session
      if not restarts:
        restarts.append(1)
        store.kill()
        store.start()
      copyfileobj(r, w, length)

    monkeypatch.setattr(shutil, "copyfileobj", restarting_midway)
    storage.copy_file(tmp_path / "shard", f"gs://{BUCKET}/shard")
    monkeypatch.setattr(shutil, "copyfileobj", copyfileobj)
    assert restarts and store.bucket.blob("shard").download_as_bytes() == data
  finally:
    store.kill()


@pytest.mark.parametrize("lost", ["rm_file", "merge"])
def test_a_log_append_whose_answer_the_store_lost_leaves_the_file_as_written(tmp_path, monkeypatch, lost):
  """metrics.jsonl and the event files on gs:// grow by a part uploaded beside them, composed onto them and deleted. A
  request the store did but whose answer it lost is one gcsfs sends again: the part's delete then finds nothing
  (FileNotFoundError), or the part is composed twice. Either way the file ends as written, and no part is left."""
  from electra_jax.run import metrics  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import storage  # pylint: disable=g-import-not-at-top
  store = fake_gcs.Server(tmp_path / "gcs", BUCKET)
  try:
    for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
      monkeypatch.setenv(name, store.host)
    storage.initialize()
    log = metrics.RemoteLog(f"gs://{BUCKET}/metrics.jsonl")
    log.write("step 1\n")
    log.flush()  # the first flush writes the file whole
    fs = log._fs  # pylint: disable=protected-access  (gcsfs's, whose requests the store is to lose)
    request, sent = getattr(fs, lost), []

    def done_then_sent_again(*args, **kwargs):
      sent.append(args)
      request(*args, **kwargs)  # done by the store, its answer lost
      return request(*args, **kwargs)

    monkeypatch.setattr(fs, lost, done_then_sent_again)
    for step in (2, 3):
      log.write(f"step {step}\n")
      log.flush()
    assert sent and store.bucket.blob("metrics.jsonl").download_as_text() == "step 1\nstep 2\nstep 3\n"
    assert store.names() == {"metrics.jsonl"}
  finally:
    store.kill()
