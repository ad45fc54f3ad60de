"""Prepared data damaged after electra-prepare finished, or while a run reads it (a copy cut short, a disk error, bytes
overwritten): reading it ends in one line naming the shard, the dataset and the remedy, and the workdir is left as it
was; electra-check finds every such shard, and passes a good data_dir; electra-prepare (--repair, for damage that
leaves the sizes) rebuilds the dataset bit for bit, and the stopped run resumes on the batches it would have read."""
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorflow_datasets.proto import tf_example_generated_pb2

from electra_jax import prepare
from electra_jax import check as check_command
from electra_jax.data import check, input_pipeline, integrity, records
from tests import helpers, pretrain_cli


def _copy(tiny_data, tmp_path):
  """A copy of the tiny data_dir, and its (one) train shard's path."""
  data_dir = tmp_path / "data"
  shutil.copytree(tiny_data[0].data.data_dir, data_dir)
  dataset = data_dir / os.path.relpath(tiny_data[1].dataset_dir, tiny_data[0].data.data_dir)
  (shard,) = dataset.glob("*-train.array_record-*")
  return data_dir, shard


def _truncate(shard):
  """Cut to half in place: rewriting it would show a reading thread an empty file for a moment."""
  os.truncate(shard, shard.stat().st_size // 2)


def _overwrite(shard):
  """64 bytes inverted every 16 KiB: the size stays, the bytes of every chunk differ."""
  data = bytearray(shard.read_bytes())
  for start in range(4096, len(data) - 64, 16384):
    data[start:start + 64] = bytes(b ^ 0xFF for b in data[start:start + 64])
  shard.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _overwrite])
def test_a_damaged_shard_is_named_by_the_reader_and_the_check(tiny_data, tmp_path, damage):
  data_dir, shard = _copy(tiny_data, tmp_path)
  dataset = str(shard.parent)
  assert check.check(str(data_dir)).problems == []
  damage(shard)
  with pytest.raises(integrity.Damaged, match=f"shard {shard.name} of the prepared dataset {dataset} is damaged"):
    reader = input_pipeline.Reader(dataset)  # a truncated shard: its size, before any read
    reader.read(np.arange(reader.num_examples))  # an overwritten one: ArrayRecord's chunk hashes
  problems = check.check(str(data_dir)).problems
  print(problems)
  assert len(problems) == 1 and shard.name in problems[0] and "copy the dataset again" in problems[0]


def test_a_shard_cut_short_after_it_was_opened_is_named(tiny_data, tmp_path):
  """ArrayRecord reads past the end of a shard truncated while it was open as empty records: the parse of a batch
  fails in a reading thread, and the error is the shard's."""
  _, shard = _copy(tiny_data, tmp_path)
  reader = input_pipeline.Reader(str(shard.parent))
  batches = input_pipeline.TrainIterator(reader, 16, seed=0, process_index=0, process_count=1)
  size = shard.stat().st_size
  _truncate(shard)
  with pytest.raises(integrity.Damaged, match=rf"^shard {shard.name} of the prepared dataset {shard.parent} is damaged "
                     rf"\({size // 2} bytes, but electra-prepare wrote {size}: truncated\): rebuild it with "
                     "electra-prepare --repair"):
    for _ in range(reader.num_examples // 16):
      next(batches)
  batches.close()


@pytest.mark.parametrize("damage", [os.unlink, _overwrite])
def test_prepare_rebuilds_a_damaged_dataset_bit_for_bit(tiny_data, tmp_path, damage, caplog):
  """A missing (or truncated) shard is found by every electra-prepare, an overwritten one by --repair, which reads
  every shard; the dataset is rebuilt with the bytes first written."""
  data_dir, shard = _copy(tiny_data, tmp_path)
  config = tiny_data[0].copy_and_resolve_references()
  config.data.data_dir = str(data_dir)
  files = {f.name: f.read_bytes() for f in shard.parent.iterdir()}
  damage(shard)
  caplog.set_level(logging.INFO, logger="absl")
  if damage is _overwrite:
    prepare.build(config)
    assert "Already prepared" in caplog.text and "--repair reads every byte" in caplog.text
  prepare.build(config, repair=damage is _overwrite)
  assert f"shard {shard.name} of the prepared dataset {shard.parent} is damaged" in caplog.text
  assert "bit-identical" in caplog.text
  assert {f.name: f.read_bytes() for f in shard.parent.iterdir()} == files


def test_examples_are_written_with_their_features_in_one_order():
  """Protobuf writes a map's entries in an order of its own per process: the writer fixes it, so that the same
  examples are the same bytes (what lets --repair tell a rebuilt shard from the first by its CRC-32)."""
  ids, segments = (tf_example_generated_pb2.Example(features={"feature": {name: {"int64_list": {"value": [i]}}}})
                   .SerializeToString() for i, name in enumerate(input_pipeline.FEATURES))
  assert ids + segments != segments + ids  # the same example, its two features in two orders
  assert records.canonical(ids + segments) == records.canonical(segments + ids)


def test_check_command_passes_good_data_and_names_each_problem(tiny_data, tmp_path, capsys):
  data_dir, shard = _copy(tiny_data, tmp_path)
  check_command.main(str(data_dir))  # returns (exit status 0) only when all is well
  assert capsys.readouterr().out.strip().endswith(f"{data_dir}: all well")
  command = [sys.executable, "-m", "electra_jax.check", f"--data_dir={data_dir}"]
  _truncate(shard)
  (validation,) = shard.parent.glob("*-validation.array_record-*")
  _overwrite(validation)
  tokenizer = next((data_dir / "tokenizer").glob("*.model"))
  tokenizer.write_bytes(tokenizer.read_bytes()[:1000])
  bad = subprocess.run(command, cwd=pretrain_cli.ROOT, capture_output=True, text=True, check=False)
  errors = [l for l in bad.stderr.splitlines() if l.startswith("electra-check: error: ")]
  print("\n".join(errors))
  assert bad.returncode == 1 and len(errors) == 3 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
  assert [shard.name in errors[1], validation.name in errors[2], str(tokenizer) in errors[0]] == [True] * 3, errors


@pytest.mark.slow
def test_pretraining_on_a_damaged_shard_ends_in_one_line_and_writes_nothing(tiny_data, tmp_path):
  data_dir, shard = _copy(tiny_data, tmp_path)
  config = tiny_data[0].copy_and_resolve_references()
  config.data.data_dir = str(data_dir)
  _overwrite(shard)  # found by the chunk hashes of the first batch it reads (a truncated shard, by its size: above)
  workdir = tmp_path / "run"
  result = pretrain_cli.run(pretrain_cli.env(), config, workdir, "--config.train.num_steps=2")
  print(result.stderr.strip().splitlines()[-1])
  helpers.assert_one_line_error(result, f"shard {shard.name} of the prepared dataset {shard.parent} is damaged")
  assert not workdir.exists()


def test_a_damaged_copy_of_a_gcs_shard_is_never_read(tiny_data, gcs_bucket, tmp_path, monkeypatch):
  """A gs:// shard whose bytes differ from those recorded is refused as it is fetched, before it reaches the host's
  local copy; a local copy damaged after the fetch is deleted when read, and the next reader fetches it again."""
  from electra_jax.runtime import storage  # pylint: disable=g-import-not-at-top
  host, bucket = gcs_bucket
  dataset = tiny_data[1].dataset_dir
  (shard,) = (f for f in os.listdir(dataset) if "-train.array_record-" in f)
  for name in os.listdir(dataset):
    bucket.blob(f"damaged/{name}").upload_from_filename(os.path.join(dataset, name))
  data = bytearray(open(os.path.join(dataset, shard), "rb").read())
  data[1000:1064] = bytes(b ^ 0xFF for b in data[1000:1064])
  bucket.blob(f"damaged/{shard}").upload_from_string(bytes(data))
  for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
    monkeypatch.setenv(name, host)
  monkeypatch.setenv("ELECTRA_JAX_CACHE", str(tmp_path / "cache"))
  storage.initialize()
  remote = f"gs://{bucket.name}/damaged"
  with pytest.raises(integrity.Damaged, match=f"shard {shard} of the prepared dataset {remote} is damaged .*CRC-32"):
    input_pipeline.Reader(remote).read(np.arange(4))
  assert not [f for _, _, files in os.walk(tmp_path / "cache") for f in files if f.startswith(shard)]

  bucket.blob(f"damaged/{shard}").upload_from_filename(os.path.join(dataset, shard))
  reader = input_pipeline.Reader(remote)
  expected = reader.read(np.arange(16))
  copy = reader.path(shard)
  with open(copy, "r+b") as f:
    f.seek(len(data) // 2)
    f.write(b"\0" * 4096)
  with pytest.raises(integrity.Damaged, match=f"the local copy {copy} of shard {shard} .* it was deleted"):
    input_pipeline.Reader(remote).verify(0)
  assert not os.path.exists(copy)
  np.testing.assert_array_equal(input_pipeline.Reader(remote).read(np.arange(16))["input_ids"], expected["input_ids"])


def _losses(workdir) -> dict:
  """{step: its losses and gradient norm} of metrics.jsonl: what a step's batch determines."""
  with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(l) for l in f if l.endswith("\n")]
  return {r["step"]: [r[k] for k in ("loss", "mlm_loss", "disc_loss", "grad_norm")] for r in rows if "loss" in r}


@pytest.mark.slow
def test_a_shard_cut_short_while_a_run_reads_it_is_named_repaired_and_the_run_resumes(tiny_data, tmp_path, caplog):
  """The issue's case: ArrayRecord reads a shard truncated after it was opened as empty records, without an error.
  The run ends in one line naming the shard and the repair; electra-prepare --repair writes the shard's very bytes
  again, and the same command resumes from the last checkpoint: the steps it takes again are those the run took on
  the undamaged data."""
  data_dir, shard = _copy(tiny_data, tmp_path)
  config = tiny_data[0].copy_and_resolve_references()
  config.data.data_dir = str(data_dir)
  original = shard.read_bytes()
  workdir = tmp_path / "run"
  flags = ("--config.train.num_steps=48", "--config.train.checkpoint_every=20", "--config.train.log_every=1")
  proc = pretrain_cli.start(pretrain_cli.env(), config, workdir, *flags)
  deadline = time.time() + 300
  while 21 not in pretrain_cli.logged_steps(workdir) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  os.truncate(shard, len(original) // 2)  # the batches read ahead are well; the next one read is not
  proc.wait(timeout=300)
  failed = subprocess.CompletedProcess(proc.args, proc.returncode, "", pretrain_cli.log(proc))
  print(failed.stderr.strip().splitlines()[-1])
  helpers.assert_one_line_error(failed, f"shard {shard.name} of the prepared dataset {shard.parent} is damaged "
                                        f"({len(original) // 2} bytes, but electra-prepare wrote {len(original)}")
  assert "electra-prepare --repair" in failed.stderr
  assert pretrain_cli.checkpoint_dirs(workdir) == ["20"]
  before = _losses(workdir)

  with caplog.at_level(logging.INFO, logger="absl"):
    prepare.main(config, "", repair=True)  # electra-prepare --config=configs/tiny.py --config.data.data_dir=D --repair
  assert "bit-identical" in caplog.text and shard.read_bytes() == original

  result = pretrain_cli.run(pretrain_cli.env(), config, workdir, *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  after = _losses(workdir)
  assert sorted(after) == list(range(1, 49))
  redone = range(21, max(before) + 1)  # the steps the damaged run took after its checkpoint
  assert [after[s] for s in redone] == [before[s] for s in redone]
