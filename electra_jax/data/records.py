"""A prepared dataset's records, tf.train.Examples of int64 features in the order of their names (`canonical`), read a
batch at a time as int32 by numpy (`Decoder`, which releases the GIL), or by protobuf (`parse`) where laid out otherwise
(docs/data.md, "Parsing batches without holding the GIL")."""
from typing import Sequence

import numpy as np
from tensorflow_datasets.proto import tf_example_generated_pb2

_MAX_BYTES = 4  # of a varint the decoder reads: values below 2^28, lengths of records below 256 MiB


def canonical(serialized: bytes) -> bytes:
  """A serialized tf.train.Example with its features in the order of their names."""
  return tf_example_generated_pb2.Example.FromString(serialized).SerializeToString(deterministic=True)


def parse(records: Sequence[bytes], features: Sequence[str], length: int) -> dict[str, np.ndarray]:
  """`features` of the serialized examples `records`, each `length` values: int32 [len(records), length], parsed by
  protobuf (any layout; raises ValueError or protobuf's DecodeError on a record that is not such an example)."""
  examples = [tf_example_generated_pb2.Example.FromString(r).features.feature for r in records]
  return {k: np.array([e[k].int64_list.value for e in examples], np.int32).reshape(len(examples), length)
          for k in features}


def _varints(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(start, size in bytes) of each varint of `data` (uint8), which ends at its first byte below 0x80. The canonical
  records read as varints from end to end: tags, lengths, the features' names (ASCII, a byte each) and the values."""
  ends = np.flatnonzero(data < 0x80)
  starts = np.empty_like(ends)
  starts[:1] = 0
  starts[1:] = ends[:-1] + 1
  return starts, ends - starts + 1


def _values(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
  """The varints' values, int32 (each at most _MAX_BYTES long): 7 bits a byte, the lowest first."""
  bits = np.zeros(len(data) + _MAX_BYTES - 1, np.int32)  # past the end: 0
  np.bitwise_and(data, 0x7F, out=bits[:len(data)])
  values = bits[starts]
  for k in range(1, int(sizes.max())):
    values |= (bits[starts + k] << 7 * k) * (sizes > k)
  return values


class Decoder:
  """A batch of canonical records of `features` (`length` values each) as int32 [batch, length], or None when any is
  laid out otherwise: a record (a sequence of varints) is decoded only when its count of varints, fixed bytes and
  lengths match, so a decoded batch is the one `parse` gives."""

  def __init__(self, features: Sequence[str], length: int):
    self.features, self.length = tuple(features), length
    # The layout, from three examples whose values are all 0, all 1 and all 200 (two bytes each): the varints that
    # differ between the first two are the values, those that differ between the first and the third the lengths.
    zeros, ones, wide = (np.frombuffer(self._example(v), np.uint8) for v in (0, 1, 200))
    starts, sizes = _varints(zeros)
    template, value = _values(zeros, starts, sizes), _values(ones, *_varints(ones))
    is_value = template != value
    is_length = ~is_value & (template != _values(wide, *_varints(wide)))
    self._count = len(template)
    self._fixed = np.flatnonzero(~is_value & ~is_length)
    self._template, self._sizes = template[self._fixed], sizes[self._fixed]
    # A length at varint j: its message runs from varint j + 1 to the varint before _ends (the record's end: _count).
    self._lengths = np.flatnonzero(is_length)
    self._ends = np.searchsorted(np.append(starts, len(zeros)), starts[self._lengths + 1] + template[self._lengths])
    first = np.flatnonzero(is_value)[::length]  # each feature's first value; features in the order of their names
    self._first = dict(zip(sorted(self.features), first.tolist()))

  def _example(self, value: int) -> bytes:
    example = tf_example_generated_pb2.Example()
    for name in self.features:
      example.features.feature[name].int64_list.value.extend([value] * self.length)
    return canonical(example.SerializeToString())

  def __call__(self, records: Sequence[bytes]) -> dict[str, np.ndarray] | None:
    record_ends = np.cumsum(np.fromiter(map(len, records), np.int64, len(records)))
    data = np.frombuffer(b"".join(records), np.uint8)
    if not len(data) or data[-1] >= 0x80:
      return None
    starts, sizes = _varints(data)
    b, n = len(records), self._count
    # As many varints as records hold, the first of each record at its start, none longer than the decoder reads.
    if len(starts) != b * n or (starts[n::n] != record_ends[:-1]).any() or sizes.max() > _MAX_BYTES:
      return None
    values = _values(data, starts, sizes).reshape(b, n)
    sizes = sizes.reshape(b, n)
    bounds = np.concatenate([starts.reshape(b, n), record_ends[:, None]], axis=1)
    if not ((values[:, self._fixed] == self._template).all() and (sizes[:, self._fixed] == self._sizes).all() and
            (values[:, self._lengths] == bounds[:, self._ends] - bounds[:, self._lengths + 1]).all()):
      return None
    return {k: np.ascontiguousarray(values[:, self._first[k]:self._first[k] + self.length]) for k in self.features}
