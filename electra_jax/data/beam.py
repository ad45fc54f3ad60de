"""electra-prepare on Apache Beam through TFDS's Beam support: the same builder and dataset, its examples made by
workers that each read their own parts of the corpus (docs/data.md, "Corpora larger than one host: Apache Beam")."""
import json
import os
import re
import shutil
import tempfile

import apache_beam as beam
from apache_beam.options import pipeline_options
from apache_beam.runners import runner as runner_lib
from etils import epath
import tensorflow_datasets as tfds

from electra_jax.data import integrity, packing, pretraining
from electra_jax.data import corpus as corpus_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.runtime import storage


# Runners whose workers are processes of this host; the others' workers see gs:// but not this host's disk.
LOCAL_RUNNERS = ("SwitchingDirectRunner", "BundleBasedDirectRunner", "FnApiRunner")
_RECORD = ".integrity.json"  # beside a shard on the Beam path: its integrity.file_record, until metadata.json has it
_DATA_ERROR = f"{corpus_lib.DataError.__module__}.{corpus_lib.DataError.__name__}: "  # as a traceback's last line


def options(text: str, data) -> pipeline_options.PipelineOptions:
  """--beam_pipeline_options's "name=value,..." as Beam's options; a one-line ValueError for an unknown runner or
  option (Beam would only warn), or a runner on other machines given a local data.data_dir or data.text_files."""
  flags = [f"--{item.strip()}" for item in text.split(",") if item.strip()]
  parsed = pipeline_options.PipelineOptions(flags)
  known = parsed.get_all_options(retain_unknown_options=False)
  if unknown := [f[2:] for f in flags if f[2:].split("=")[0] not in known]:
    raise ValueError(f"--beam_pipeline_options: Beam has no option {', '.join(unknown)}")
  runner = parsed.view_as(pipeline_options.StandardOptions).runner or "DirectRunner"
  try:
    kind = type(runner_lib.create_runner(runner)).__name__
  except ValueError as e:
    raise ValueError(f"--beam_pipeline_options: {str(e).split(' Valid values')[0]}: try DirectRunner (or "
                     "BundleBasedDirectRunner, FnApiRunner)") from e
  local = [p for p in (data.data_dir, *data.text_files.split(",")) if p.strip() and not storage.is_remote(p)
           and not p.strip().startswith((corpus_lib.TASK_PREFIX, corpus_lib.SOTU))]
  if kind not in LOCAL_RUNNERS and local:
    raise ValueError(f"--beam_pipeline_options: runner {runner} runs its workers on other machines, which cannot see "
                     f"{local[0].strip()} on this one: put data.data_dir and data.text_files on gs://")
  return parsed


class ElectraPretrainingBeam(pretraining.ElectraPretraining, skip_registration=True):
  """ElectraPretraining whose examples a Beam pipeline makes: the same name, configs, features and files."""

  name = pretraining.ElectraPretraining.name

  def download_and_prepare(self, **kwargs):
    """ElectraPretraining's, bad data in a worker (in Beam's wrapping) the single-host path's one-line DataError."""
    try:
      super().download_and_prepare(**kwargs)
    except (corpus_lib.DataError, RuntimeError) as e:
      last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
      message = re.sub(r"\s*\[while running '.*'\]$", "", last.removeprefix(_DATA_ERROR))
      if isinstance(e, corpus_lib.DataError) or last.startswith(_DATA_ERROR):
        raise corpus_lib.DataError(message) from e
      raise

  def _example_writer(self) -> tfds.core.ExampleWriter:
    return _ShardWriter(self.info.file_format)

  def _integrity(self) -> dict:
    """The shards' records, which the workers wrote beside them (_ShardWriter): read, then deleted."""
    records = {}
    for path in epath.Path(self.data_dir).glob(f"*{integrity.SHARD}*{_RECORD}"):
      if not path.name.startswith(tfds.core.constants.INCOMPLETE_PREFIX):  # a lost attempt's (TFDS deletes those)
        records[path.name.removesuffix(_RECORD)] = json.loads(path.read_text())
      path.unlink()
    return dict(sorted(records.items()))

  def _split_generators(self, dl_manager, pipeline):  # pylint: disable=arguments-differ  (TFDS's Beam form)
    del dl_manager  # nothing is downloaded
    cfg = self.builder_config
    corpus = cfg.corpus
    parts = (pipeline
             | "Parts" >> beam.Create(list(enumerate(corpus.parts())))
             | "SpreadParts" >> beam.Reshuffle())  # to the workers: each reads only its parts
    offsets = beam.pvalue.AsSingleton(
        parts
        | "Count" >> beam.Map(count_documents, corpus)
        | "Counts" >> beam.combiners.ToList()
        | "Offsets" >> beam.Map(document_offsets, corpus.max_documents, corpus.description))
    docs = parts | "Read" >> beam.FlatMap(numbered_documents, corpus, offsets)
    train, validation = docs | "Split" >> beam.Partition(
        lambda doc, _, fraction: int(pretraining.is_validation(doc.index, fraction)), 2, cfg.validation_fraction)
    tok = epath.Path(cfg.tokenizer_path)
    pack = _Pack(tok.name, tok.read_bytes(), cfg.seq_len, cfg.seed)  # the tokenizer travels with the transform
    examples = {}
    for split, split_docs in (("train", train), ("validation", validation)):
      packed = split_docs | f"Pack{split}" >> beam.ParDo(pack).with_outputs("stats", main="examples")
      _ = (packed.stats
           | f"Sum{split}" >> beam.CombineGlobally(lambda st: {k: sum(s[k] for s in st) for k in pretraining.STATS})
           | f"Save{split}" >> beam.Map(lambda st, path: path.write_text(json.dumps(st)), self._stats_path(split)))
      examples[split] = packed.examples
    return examples

  def _stats_path(self, split: str) -> epath.Path:
    # In the dataset's directory while TFDS builds it (its incomplete.* one), where the workers write the shards too.
    return epath.Path(self.data_path) / f"stats-{split}.json"

  def _process_pipeline_result(self, pipeline_result):
    for split in ("train", "validation"):
      path = self._stats_path(split)
      self.stats[split] = json.loads(path.read_text())
      path.unlink()
      self.finish(split)


class _ShardWriter(pretraining.ExampleWriter):
  """A shard written locally on a Beam worker, then to `path`, its integrity.file_record beside it (renamed with it)."""

  def write(self, path, examples):
    storage.initialize()  # gs:// through the launcher's client (and emulator, in tests), as Corpus's readers
    remote = storage.is_remote(path)
    with tempfile.TemporaryDirectory() as tmp:
      local = os.path.join(tmp, "shard") if remote else os.fspath(path)
      positions = super().write(local, examples)
      record = integrity.file_record(local)
      if remote:
        storage.copy_file(local, path)
    epath.Path(f"{os.fspath(path)}{_RECORD}").write_text(json.dumps(record))
    return positions


def document_offsets(counts: list[tuple[int, int]], max_documents: int, description: str) -> dict[int, int]:
  """Each part's first document's corpus index, from the parts' document counts."""
  offsets, total = {}, 0
  for i, n in sorted(counts):
    offsets[i] = total
    total += n
  if not total:
    raise corpus_lib.DataError(f"the corpus ({description}) has no text")
  return offsets


def count_documents(part: tuple[int, str], corpus: corpus_lib.Corpus) -> tuple[int, int]:
  """(the part's number, how many documents it holds): a worker's first pass over its part."""
  return part[0], sum(1 for _ in corpus.part_documents(part[1]))


def numbered_documents(part: tuple[int, str], corpus: corpus_lib.Corpus, offsets: dict[int, int]):
  """The part's documents, one at a time, each numbered with its corpus index (`offsets`: document_offsets')."""
  i, name = part
  for j, doc in enumerate(corpus.part_documents(name)):
    index = offsets[i] + j
    if corpus.max_documents and index >= corpus.max_documents:
      return
    yield corpus.number(doc, index)


class _Pack(beam.DoFn):
  """A document's packed examples, keyed as the single-host path keys them, and its stats (output "stats")."""

  def __init__(self, tokenizer_name: str, tokenizer_bytes: bytes, seq_len: int, seed: int):
    self._tokenizer = (tokenizer_name, tokenizer_bytes)
    self._seq_len, self._seed = seq_len, seed
    self._dir = self._tok = None

  def setup(self):
    # Tokenizer reads a file, whose name says what it is (a .model, a cased or uncased vocab.txt).
    self._dir = tempfile.mkdtemp()
    path = epath.Path(self._dir) / self._tokenizer[0]
    path.write_bytes(self._tokenizer[1])
    self._tok = tokenizer_lib.Tokenizer(os.fspath(path))

  def teardown(self):
    shutil.rmtree(self._dir, ignore_errors=True)

  def process(self, doc: corpus_lib.Document):
    packed = packing.pack_document(doc, self._tok, self._seq_len, self._seed)
    yield from pretraining.keyed_examples(packed)
    # Data rather than Beam counters, which some runners (BundleBasedDirectRunner) count again on a retried bundle.
    yield beam.pvalue.TaggedOutput("stats", pretraining.document_stats(packed))
