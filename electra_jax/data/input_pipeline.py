"""Per-host input: this host's rows of each global batch of the prepared dataset, read by index without TensorFlow,
and `to_global`, where host numpy becomes global jax arrays (docs/data.md, "The input pipeline and exact resume")."""
import collections
import collections.abc
import concurrent.futures
import contextlib
import functools
import json
import math
import os
import threading
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from array_record.python import array_record_module
from etils import epath
from google.protobuf import message
from tensorflow_datasets.proto import tf_example_generated_pb2

from electra_jax.data import integrity
from electra_jax.data import records as records_lib
from electra_jax.runtime import storage

FEATURES = ("input_ids", "segment_ids")


class Reader:
  """Examples of one split by index; a shard is opened when first read (a gs:// one fetched then to a local copy)."""

  def __init__(self, dataset_dir: str, split: str = "train", fail_fast: bool = True):
    """fail_fast: raise integrity.Damaged for the first shard of a size other than recorded; else `size_problems`."""
    self.dataset_dir, self.remote = dataset_dir, storage.is_remote(dataset_dir)
    self._copy = storage.LocalCopy(dataset_dir, "metadata.json", "dataset_info.json") if self.remote else None
    sizes = storage.file_sizes(dataset_dir)
    if self._copy:  # the dataset's description (dataset_info.json, features.json, metadata.json), not its shards
      for name in sizes:
        if integrity.SHARD not in name:
          self._copy.fetch(name)
    builder = tfds.builder_from_directory(self._copy.path if self._copy else dataset_dir)
    info = builder.info.splits[split]
    self.split, self.num_examples, self.shard_lengths = split, info.num_examples, list(info.shard_lengths)
    self.seq_len = builder.info.features["input_ids"].shape[0]
    self._dir, self._files = builder.data_dir, list(info.filenames)
    # What electra-prepare wrote (metadata.json): a shard of another size is refused before the first step.
    self.expected = json.loads((epath.Path(builder.data_dir) / "metadata.json").read_text()).get("files", {})
    self.size_problems = {}
    for s, name in enumerate(self._files):
      if problem := integrity.size_problem(self.expected.get(name), sizes.get(name)):
        error = integrity.damaged(name, dataset_dir, problem)
        if fail_fast:
          raise error
        self.size_problems[s] = error
    self._shards = [None] * len(self._files)
    self._opening = threading.Lock()  # the prefetch threads share the shards
    self._starts = np.cumsum([0, *info.shard_lengths])[:-1]
    self._decode = records_lib.Decoder(FEATURES, self.seq_len)

  def path(self, name: str) -> str:
    """Where the shard file `name` is read: the dataset's own directory, or this host's copy of a gs:// one."""
    return os.path.join(self._copy.path if self._copy else self._dir, name)

  def _check_crc(self, name: str, path: str):
    if problem := integrity.crc_problem(self.expected.get(name), path):
      raise integrity.damaged(name, self.dataset_dir, problem)

  def _shard(self, s: int) -> array_record_module.ArrayRecordReader:
    with self._opening:
      if self._shards[s] is None:
        name = self._files[s]
        path = self._copy.fetch(name, functools.partial(self._check_crc, name)) if self._copy else self.path(name)
        try:
          reader = array_record_module.ArrayRecordReader(path, options="readahead_buffer_size:0",
                                                         file_reader_buffer_size=32768)
        except (RuntimeError, ValueError, OSError) as e:
          raise self._damaged(s, e) from e
        if (count := reader.num_records()) != self.shard_lengths[s]:  # a truncated shard opens with none
          reader.close()
          raise self._damaged(s, f"{count} records, where the dataset's description says {self.shard_lengths[s]}")
        self._shards[s] = reader
      return self._shards[s]

  def _damaged(self, s: int, what) -> integrity.Damaged:
    """The one-line error for shard `s` saying what broke the read; a gs:// shard's local copy is deleted."""
    try:
      size = os.path.getsize(self.path(self._files[s]))
    except OSError:
      size = None
    what = integrity.size_problem(self.expected.get(self._files[s]), size) or " ".join(str(what).split())
    if self._copy:
      with contextlib.suppress(OSError):
        os.unlink(self.path(self._files[s]))
    return integrity.damaged(self._files[s], self.dataset_dir, what,
                             local_copy=self.path(self._files[s]) if self._copy else None)

  def verify(self, s: int, batch: int = 4096):
    """Checks shard `s` whole (size, CRC-32, record count, every chunk's hash), raising integrity.Damaged."""
    if s in self.size_problems:
      raise self.size_problems[s]
    if not self._copy:
      self._check_crc(self._files[s], self.path(self._files[s]))
    for start in range(0, self.shard_lengths[s], batch):  # read, not parsed: a third of the time
      self._records(s, list(range(start, min(start + batch, self.shard_lengths[s]))))

  def _records(self, s: int, indices: list[int]) -> list[bytes]:
    """Records `indices` of shard `s` (indices within the shard)."""
    try:  # ArrayRecord checks each chunk's hash as it reads it
      return self._shard(s).read(indices)
    except RuntimeError as e:
      raise self._damaged(s, e) from e

  def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    shards = np.searchsorted(self._starts, indices, side="right") - 1
    records = [b""] * len(indices)
    for s in np.unique(shards):
      where = np.flatnonzero(shards == s)
      for i, record in zip(where, self._records(s, (indices[where] - self._starts[s]).tolist())):
        records[i] = record
    try:
      return self.parse(records)
    except (ValueError, message.DecodeError) as e:
      raise self._unparsable(records, shards) or e

  def parse(self, records: list[bytes]) -> dict[str, np.ndarray]:
    """`records` decoded by numpy where laid out as electra-prepare writes them, else by protobuf (said once)."""
    if self._decode and (batch := self._decode(records)) is not None:
      return batch
    batch = records_lib.parse(records, FEATURES, self.seq_len)
    if self._decode:
      self._decode = None
      logging.warning("The records of %s are not laid out as electra-prepare writes them since 2026-11-28 (each "
                      "example's features in the order of their names): they are parsed with protobuf, which holds "
                      "Python's GIL and can hold back the training loop; delete the dataset and run electra-prepare "
                      "again for the faster reads (the same examples, in the same order)", self.dataset_dir)
    return batch

  def _unparsable(self, records: list[bytes], shards: np.ndarray) -> integrity.Damaged | None:
    """The error for the first record that is not one of this dataset's examples (a shard cut short once opened)."""
    for s, record in zip(shards, records):
      try:
        feature = tf_example_generated_pb2.Example.FromString(record).features.feature
        lengths = sorted({len(feature[k].int64_list.value) for k in FEATURES})
        what = None if lengths == [self.seq_len] else (
            f"a record of {' and '.join(map(str, lengths))} values, where its examples have {self.seq_len}")
      except message.DecodeError:
        what = "a record that is not an example"
      if what:
        return self._damaged(s, what)
    return None


class TrainIterator(collections.abc.Iterator):
  """Endless per-host batches of int32 [batch_size / process_count, seq_len]. Global batch b is a pure function of
  (seed, b), drawn from gcd(shards, batch size) lanes of consecutive shards (docs/data.md), whatever the host count:
  the state is {"step": b}; host i of n reads rows [i·B/n, (i+1)·B/n)."""

  def __init__(self, reader: Reader, global_batch_size: int, seed: int, process_index: int, process_count: int,
               state: dict | None = None, num_threads: int = 2, prefetch: int = 4):
    self._reader = reader
    if reader.num_examples < global_batch_size:
      raise ValueError(f"the {reader.split} split has {reader.num_examples} examples, fewer than one batch "
                       f"({global_batch_size}); prepare more data")
    self._global_batch = global_batch_size
    self._lanes = lanes(reader.shard_lengths, global_batch_size)
    self._lane_length = min(length for _, length in self._lanes)
    _, _, per_host = _share(global_batch_size, process_index, process_count)
    rows = np.arange(process_index * per_host, (process_index + 1) * per_host)
    self._lane, self._row = np.divmod(rows, global_batch_size // len(self._lanes))  # each row's lane, place in it
    if reader.remote and process_index == 0 and len(self._lanes) % process_count:  # one line per run
      shards, share = len(reader.shard_lengths), len(set(self._lane.tolist()))
      logging.warning(
          "Each of the %d hosts fetches %s the %s split of %s, not 1/%d (shards: %d; lanes at train.batch_size=%d: "
          "%d, not a multiple of %d); prepare it again with --config.data.num_shards=%d (or another multiple of %d) "
          "for each host to fetch only its share (docs/data.md)", process_count,
          "all of" if share == len(self._lanes) else f"{share}/{len(self._lanes)} of", reader.split, reader.dataset_dir,
          process_count, shards, global_batch_size, len(self._lanes), process_count,
          -(-shards // process_count) * process_count, process_count)
    self._seed = seed
    self._step = int((state or {}).get("step", 0))
    self._permutation = functools.lru_cache(maxsize=2 * len(self._lanes))(self._permutation)  # two epochs a batch
    self._pool = concurrent.futures.ThreadPoolExecutor(num_threads)  # the reads and numpy's decoding release the GIL
    self._pending = [self._pool.submit(self._batch, self._step + i) for i in range(prefetch)]
    try:  # the first batch read now: a damaged shard in it is refused before the run writes anything
      self._pending[0].result()
    except Exception:
      self.close()
      raise

  def _permutation(self, epoch: int, lane: int) -> np.ndarray:
    """The lane's epoch: a permutation of its examples, cut to the common length (so each epoch leaves out others)."""
    key = (self._seed, epoch) if len(self._lanes) == 1 else (self._seed, epoch, lane)  # one lane: as before lanes
    return np.random.default_rng(key).permutation(self._lanes[lane][1])[:self._lane_length]

  def _batch(self, step: int) -> dict[str, np.ndarray]:
    per_lane = self._global_batch // len(self._lanes)
    epochs, offsets = np.divmod(step * per_lane + self._row, self._lane_length)
    indices = np.empty_like(offsets)
    for epoch, lane in {(int(e), int(l)) for e, l in zip(epochs, self._lane)}:  # at most two epochs a lane
      where = (epochs == epoch) & (self._lane == lane)
      indices[where] = self._lanes[lane][0] + self._permutation(epoch, lane)[offsets[where]]
    return self._reader.read(indices)

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


def lanes(shard_lengths: list[int], global_batch_size: int) -> list[tuple[int, int]]:
  """(first index, length) of each lane: gcd(shards, batch size) runs of consecutive shards."""
  count = math.gcd(len(shard_lengths), global_batch_size)
  per_lane = len(shard_lengths) // count
  starts = np.cumsum([0, *shard_lengths])
  return [(int(starts[l * per_lane]), int(starts[(l + 1) * per_lane] - starts[l * per_lane])) for l in range(count)]


def _share(batch_size: int, process_index: int | None, process_count: int | None) -> tuple[int, int, int]:
  """(this host's index, the host count (default: JAX's), its rows of each batch)."""
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if batch_size % count:
    raise ValueError(f"train.batch_size={batch_size} is not divisible by the {count} hosts")
  return index, count, batch_size // count


def train_iterator(config, prepared, state: dict | None = None, process_index: int | None = None,
                   process_count: int | None = None) -> TrainIterator:
  """This host's training batches (global train.batch_size / process_count each), from `state` if given."""
  index, count, _ = _share(config.train.batch_size, process_index, process_count)
  return TrainIterator(Reader(prepared.dataset_dir), config.train.batch_size, config.train.seed, index, count,
                       state=state)


def resume_position(extra: dict, batch_size: int, step: int) -> dict:
  """The input position checkpoint `step` saved, in global batches of `batch_size` (the same on any host count):
  after a change of train.batch_size, the batch that follows the examples already seen."""
  position = dict(extra.get("position") or {})
  old = extra.get("batch_size", batch_size)
  if old != batch_size and "step" in position:
    seen = position["step"] * old
    position["step"] = seen // batch_size
    logging.warning("train.batch_size changed from %d to %d since step %d was saved: the input continues after the "
                    "%d examples already seen (at batch %d of size %d), and the learning-rate schedule continues at "
                    "step %d", old, batch_size, step, seen, position["step"], batch_size, step)
  return position


def validation_batches(config, prepared, process_index: int | None = None, process_count: int | None = None,
                       num_batches: int | None = None, reader: Reader | None = None) -> Iterator[dict[str, np.ndarray]]:
  """This host's rows of the validation batches, in a fixed order, once: at most `num_batches` (default
  train.eval_batches; 0 = all full batches), the same number on every host. `reader`: one kept open across calls."""
  index, _, per_host = _share(config.train.batch_size, process_index, process_count)
  reader = reader or Reader(prepared.dataset_dir, "validation")
  available = reader.num_examples // config.train.batch_size
  num_batches = config.train.eval_batches if num_batches is None else num_batches
  for b in range(min(num_batches, available) if num_batches else available):
    start = b * config.train.batch_size + index * per_host
    yield reader.read(np.arange(start, start + per_host))


class OnDevice(collections.abc.Iterator):
  """The next `depth` batches placed on the devices ahead by one thread, `steps` stacked a time (a dispatch's);
  get_state() is `batches`' position after the last one handed out. stable: each in the same device buffers (a GPU
  command buffer finds its input where it was), the one before deleted."""

  def __init__(self, batches: Iterator[dict[str, np.ndarray]], sharding: jax.sharding.Sharding, depth: int = 2,
               steps: int = 1, stable: bool = False):
    self._batches, self._sharding, self._steps = batches, sharding, steps
    self._stable, self._slot = stable, None
    self._state = self._position()
    self._pool = concurrent.futures.ThreadPoolExecutor(1, "on-device")
    self._pending = collections.deque(self._pool.submit(self._place) for _ in range(depth))

  def _position(self):
    return self._batches.get_state() if hasattr(self._batches, "get_state") else None

  def _place(self):
    batch = next(self._batches) if self._steps == 1 else stack([next(self._batches) for _ in range(self._steps)])
    return to_global(batch, self._sharding), self._position()

  def __next__(self) -> dict[str, jax.Array]:
    batch, self._state = self._pending.popleft().result()
    self._pending.append(self._pool.submit(self._place))
    if self._stable:  # the first slot a copy: a batch on a CPU may lie in its numpy array's memory, not donatable
      slot = jax.tree.map(jnp.copy, batch) if self._slot is None else self._slot
      batch = self._slot = _write_into(slot, batch)
    return batch

  def get_state(self):
    return self._state

  def close(self):
    self._pool.shutdown(wait=True, cancel_futures=True)  # no thread left reading from what closes next
    if hasattr(self._batches, "close"):
      self._batches.close()


@functools.partial(jax.jit, donate_argnums=0)
def _write_into(slot: dict[str, jax.Array], batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """`batch` written over `slot` (donated) in place: XLA would hand back the batch's own buffers for a copy."""
  return jax.tree.map(lambda s, b: jax.lax.dynamic_update_slice(s, b, (0,) * b.ndim), slot, batch)


def stack(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Host batches stacked on a new leading axis: the input of a dispatch of len(batches) steps."""
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def to_global(batch: dict[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """Per-host numpy batch -> global jax arrays, laid out by `sharding` (batch axis split over hosts and devices)."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
