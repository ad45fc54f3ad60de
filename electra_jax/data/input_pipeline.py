"""Per-host input: this host's rows of each global batch of the prepared dataset (shuffled, repeated, prefetched),
and `to_global`, the one place where host numpy becomes global jax arrays.

The dataset is array_record, read by random access (ArrayRecord's reader) with no TensorFlow in the process. Global
batch b is a pure function of (seed, b), and a host reads only its rows of it, so the iterator's whole state is
{"step": b}, restoring is O(1), and a resumed run sees bit-identical batches, on any number of hosts. (A tf.data
iterator checkpoint stores its shuffle buffer; `skip` re-reads the stream: see docs/data.md for the measurements.)
"""
import concurrent.futures
import functools
import os
from typing import Iterator

import jax
import numpy as np
import tensorflow_datasets as tfds
from array_record.python import array_record_module
from tensorflow_datasets.proto import tf_example_generated_pb2

from electra_jax import storage

FEATURES = ("input_ids", "segment_ids")


class Reader:
  """Examples of one split by index, read a batch at a time through ArrayRecord's own reader (one per shard, no
  read-ahead: random access) and parsed without TensorFlow: the records are tf.train.Example protos, parsed with the
  proto module TFDS ships. (TFDS's data source costs as much again in per-batch key bookkeeping, its decoded reads
  ~2x more.)"""

  def __init__(self, dataset_dir: str, split: str = "train"):
    # ArrayRecord's reader takes local paths only: a gs:// dataset is read from a local copy (metadata.json changes
    # whenever electra-prepare rebuilds it).
    builder = tfds.builder_from_directory(storage.local_dir(dataset_dir, "metadata.json"))
    info = builder.info.splits[split]
    self.split = split
    self.seq_len = builder.info.features["input_ids"].shape[0]
    self.num_examples = info.num_examples
    self._shards = [array_record_module.ArrayRecordReader(os.path.join(builder.data_dir, f),
                                                          options="readahead_buffer_size:0",
                                                          file_reader_buffer_size=32768) for f in info.filenames]
    self._starts = np.cumsum([0, *info.shard_lengths])[:-1]

  def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    shards = np.searchsorted(self._starts, indices, side="right") - 1
    records = [b""] * len(indices)
    for s in np.unique(shards):
      where = np.flatnonzero(shards == s)
      for i, record in zip(where, self._shards[s].read((indices[where] - self._starts[s]).tolist())):
        records[i] = record
    return self.parse(records)

  def parse(self, records: list[bytes]) -> dict[str, np.ndarray]:
    examples = [tf_example_generated_pb2.Example.FromString(r).features.feature for r in records]
    return {k: np.array([e[k].int64_list.value for e in examples], np.int32).reshape(len(examples), self.seq_len)
            for k in FEATURES}


class TrainIterator:
  """Endless per-host batches {'input_ids', 'segment_ids'}: int32 [batch_size / process_count, seq_len].

  Global batch b is positions [b·B, (b+1)·B) of a stream that runs through the split epoch after epoch, each epoch
  in its own seeded permutation; host i of n reads only rows [i·B/n, (i+1)·B/n) of it. So the global batches do not
  depend on the number of hosts (a run on 2 hosts sees the data of a run on 1, and a run can resume on another
  topology without losing its place), hosts never read the same example in an epoch, and the whole state is
  {"step": b}.
  """

  def __init__(self, reader: Reader, global_batch_size: int, seed: int, process_index: int, process_count: int,
               state: dict | None = None, num_threads: int = 2, prefetch: int = 4):
    self._reader = reader
    self._size = self._reader.num_examples
    if self._size < global_batch_size:
      raise ValueError(f"the {reader.split} split has {self._size} examples, fewer than one batch "
                       f"({global_batch_size}); prepare more data")
    self._global_batch = global_batch_size
    per_host = _per_host(global_batch_size, process_count)
    self._rows = np.arange(process_index * per_host, (process_index + 1) * per_host)
    self._seed = seed
    self._step = int((state or {}).get("step", 0))
    self._permutation = functools.lru_cache(maxsize=2)(self._permutation)  # a batch needs at most two epochs
    self._pool = concurrent.futures.ThreadPoolExecutor(num_threads)  # the reads and the parse release the GIL
    self._pending = [self._pool.submit(self._batch, self._step + i) for i in range(prefetch)]

  def _permutation(self, epoch: int) -> np.ndarray:
    return np.random.default_rng((self._seed, epoch)).permutation(self._size)

  def _batch(self, step: int) -> dict[str, np.ndarray]:
    epochs, offsets = np.divmod(step * self._global_batch + self._rows, self._size)
    indices = np.empty_like(offsets)
    for epoch in np.unique(epochs):  # a batch spans at most two epochs
      where = epochs == epoch
      indices[where] = self._permutation(int(epoch))[offsets[where]]
    return self._reader.read(indices)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = self._pending.pop(0).result()
    self._pending.append(self._pool.submit(self._batch, self._step + len(self._pending) + 1))
    self._step += 1
    return batch

  def get_state(self) -> dict:
    """How many batches were handed out; TrainIterator(..., state=this) continues with the next one."""
    return {"step": self._step}

  def close(self):
    self._pool.shutdown(wait=False, cancel_futures=True)


def _hosts(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  return (jax.process_index() if process_index is None else process_index,
          jax.process_count() if process_count is None else process_count)


def _per_host(batch_size: int, process_count: int) -> int:
  if batch_size % process_count:
    raise ValueError(f"train.batch_size={batch_size} is not divisible by the {process_count} hosts")
  return batch_size // process_count


def train_iterator(config, prepared, state: dict | None = None, process_index: int | None = None,
                   process_count: int | None = None) -> TrainIterator:
  """This host's training batches (global train.batch_size / process_count each), from `state` if given."""
  index, count = _hosts(process_index, process_count)
  return TrainIterator(Reader(prepared.dataset_dir), config.train.batch_size, config.train.seed, index, count,
                       state=state)


def validation_batches(config, prepared, process_index: int | None = None, process_count: int | None = None,
                       num_batches: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """This host's rows of the validation batches, in a fixed order, once: at most `num_batches` (default
  train.eval_batches; 0 = all full batches), the same number on every host."""
  index, count = _hosts(process_index, process_count)
  per_host = _per_host(config.train.batch_size, count)
  reader = Reader(prepared.dataset_dir, "validation")
  available = reader.num_examples // config.train.batch_size
  num_batches = config.train.eval_batches if num_batches is None else num_batches
  for b in range(min(num_batches, available) if num_batches else available):
    start = b * config.train.batch_size + index * per_host
    yield reader.read(np.arange(start, start + per_host))


def to_global(batch: dict[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """Per-host numpy batch -> global jax arrays, laid out by `sharding` (batch axis split over hosts and devices)."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
