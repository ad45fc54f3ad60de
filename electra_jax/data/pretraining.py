"""The TFDS dataset of packed pre-training examples (input_ids and segment_ids, int32 [seq_len]), split into train
and validation by whole documents; named by a hash of all that determines them (prepared.config_name)."""
import contextlib
import dataclasses
import glob
import math
import os
import shutil

import numpy as np
import tensorflow_datasets as tfds
import tqdm
from tensorflow_datasets.core.utils import shard_utils

from electra_jax.data import integrity, packing, prepared, records
from electra_jax.data import corpus as corpus_lib
from electra_jax.runtime import storage

MIN_SHARD_BYTES = 16 << 20  # of serialized examples: smaller shards would add files, not lanes a pod needs
MAX_SHARDS = 256  # a host opens every shard it reads (one file each), and lanes stop at the batch size anyway
STATS = ("documents", "lines", "tokens", "truncated_tokens", "examples", "replaced_bytes")  # per split, metadata.json


@dataclasses.dataclass
class PretrainingConfig(tfds.core.BuilderConfig):
  seq_len: int = 128
  corpus: corpus_lib.Corpus | None = None
  tokenizer_path: str = ""
  validation_fraction: float = 0.01
  seed: int = 0
  num_workers: int = 0
  identity: dict | None = None  # into metadata.json: prepare compares it to detect stale data
  settings: dict | None = None  # the data.* keys that made it (metadata.json): commands find it from data_dir alone


@contextlib.contextmanager
def writing(dataset_dir: str):
  """Around TFDS's build into the local `dataset_dir`: a killed build's incomplete.* directories deleted (unless a
  live build's mark is beside them), no space one OSError."""
  parent, name = os.path.split(dataset_dir)
  os.makedirs(parent, exist_ok=True)
  storage.remove_leftovers(dataset_dir)
  if not any(e.startswith(f".{name}.") for e in os.listdir(parent)):
    for leftover in glob.glob(os.path.join(parent, glob.escape(tfds.core.constants.INCOMPLETE_PREFIX) + "*")):
      shutil.rmtree(leftover, ignore_errors=True)
  mark = storage.temp_path(dataset_dir)
  open(mark, "wb").close()  # pylint: disable=consider-using-with
  try:
    yield
  except (OSError, RuntimeError) as e:
    if not storage.no_space(e):
      raise
    # Measured once TFDS has deleted what it wrote: the space the dataset needs is more than this.
    free = f"; it needs more than the {storage.size(storage.free_space(parent))} free on its disk" if (
        storage.no_space(e, storage.DISK_FULL)) else ""
    raise OSError(f"writing the dataset {dataset_dir} failed, no space ({' '.join(str(e).split())}{free}): nothing "
                  "of it was kept; free space or fix the cause, then re-run") from e
  finally:
    os.unlink(mark)
    for d in (parent, os.path.dirname(parent)):  # left empty by a failed build
      with contextlib.suppress(OSError):
        os.rmdir(d)


def num_shards(total_bytes: int, num_examples: int) -> int:
  """A split's shard count when data.num_shards is 0: the most shards, a power of two (so that a pod's hosts each
  fetch only their lanes), of at least MIN_SHARD_BYTES each, up to MAX_SHARDS, or TFDS's own count where more."""
  count = 1
  while 2 * count <= min(total_bytes // MIN_SHARD_BYTES, num_examples, MAX_SHARDS):
    count *= 2
  return max(count, shard_utils.ShardConfig.calculate_number_shards(total_bytes, num_examples))


class _Shards(shard_utils.ShardConfig):
  """TFDS's writer asks this for each split's shard count once the split's size is known."""

  def get_number_shards(self, total_size: int, num_examples: int, uses_precise_sharding: bool = True) -> int:
    del uses_precise_sharding  # TFDS's writer of this builder is precise
    return self.num_shards or num_shards(total_size, num_examples)


class DownloadConfig(tfds.download.DownloadConfig):
  """What electra-prepare builds with: TFDS's, each split in `num_shards` shards where it sets no count."""

  def get_shard_config(self) -> shard_utils.ShardConfig:
    return _Shards(num_shards=self.num_shards)


class ExampleWriter(tfds.core.ExampleWriter):
  """TFDS's shard writer, features in a fixed order (protobuf's map order varies by process): rebuilt bytes match."""

  def write(self, path, examples):
    return super().write(path, ((key, records.canonical(example)) for key, example in examples))


def is_validation(index: int, fraction: float) -> bool:
  """Every ~1/fraction-th document, starting with the first, so even a tiny corpus has a validation document."""
  if fraction <= 0:
    return False
  j = index + math.ceil(1 / fraction) - 1
  return math.floor((j + 1) * fraction) > math.floor(j * fraction)


class ElectraPretraining(tfds.core.GeneratorBasedBuilder):
  """Packed ELECTRA pre-training examples; built by electra-prepare with a PretrainingConfig and a DownloadConfig."""

  VERSION = tfds.core.Version(prepared.VERSION)  # its name, electra_pretraining, is prepared.NAME

  def __init__(self, *, config: PretrainingConfig, **kwargs):
    self.stats = {}
    super().__init__(config=config, **kwargs)

  def _download_and_prepare(self, dl_manager, download_config=None):
    super()._download_and_prepare(dl_manager, download_config)
    self.info.metadata.update(files=self._integrity())

  def _integrity(self) -> dict:  # the finished shards' records (the Beam builder's come from its workers)
    return integrity.record(os.fspath(self.data_dir))

  def _example_writer(self) -> tfds.core.ExampleWriter:
    return ExampleWriter(self.info.file_format)

  def _info(self) -> tfds.core.DatasetInfo:
    seq = (self.builder_config.seq_len,)
    features = {k: tfds.features.Tensor(shape=seq, dtype=np.int32) for k in ("input_ids", "segment_ids")}
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features),
                                          metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing is downloaded
    return {"train": self._generate_examples("train"), "validation": self._generate_examples("validation")}

  def _generate_examples(self, split: str):
    cfg = self.builder_config
    stats = self.stats.setdefault(split, dict.fromkeys(STATS, 0))
    with tqdm.tqdm(total=cfg.corpus.total(), desc=f"{split}: tokenize + pack", unit_scale=True, smoothing=0.1) as bar:

      def split_docs():  # the whole corpus is read for each split; progress counts every document read
        for doc in cfg.corpus.documents():
          bar.update(doc.size)
          if is_validation(doc.index, cfg.validation_fraction) == (split == "validation"):
            yield doc

      for doc in packing.pack_documents(split_docs(), cfg.tokenizer_path, cfg.seq_len, cfg.seed, cfg.num_workers):
        yield from keyed_examples(doc)
        for key, value in document_stats(doc).items():
          stats[key] += value
    self.finish(split)

  def finish(self, split: str):
    """Once a split's stats are counted: an empty split is an error; the stats go into metadata.json."""
    cfg = self.builder_config
    if not self.stats[split]["examples"]:
      raise corpus_lib.DataError(f"the {split} split is empty: the corpus ({cfg.corpus.description}) is too small "
                                 f"for validation_fraction={cfg.validation_fraction}")
    self.info.metadata.update(identity=cfg.identity, settings=cfg.settings, stats=self.stats)


def document_stats(doc: packing.PackedDocument) -> dict[str, int]:
  return dict(zip(STATS, (1, doc.lines, doc.tokens, doc.truncated, len(doc.input_ids), doc.replaced_bytes)))


def keyed_examples(doc: packing.PackedDocument):
  """A packed document's (key, example)s, keyed by the document's index and the example's place in it: TFDS orders a
  split by its keys' hashes, so the dataset is the same however the documents were packed (here or on Beam)."""
  for j in range(len(doc.input_ids)):
    yield f"{doc.index:010d}-{j:06d}", {"input_ids": doc.input_ids[j], "segment_ids": doc.segment_ids[j]}
