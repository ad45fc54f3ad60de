"""The per-host pipeline: disjoint covering host shards, exact O(1) resume, fixed validation, global arrays."""
import collections
import json
import logging

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tensorflow_datasets.proto import tf_example_generated_pb2

from electra_jax.data import input_pipeline, records


def _rows(batches):
  return collections.Counter(row.tobytes() for b in batches for row in b["input_ids"])


@pytest.mark.parametrize("count", [2, 4])
def test_hosts_read_disjoint_rows_that_cover_the_split(tiny_data, count):
  config, prepared = tiny_data
  source = tfds.builder_from_directory(prepared.dataset_dir).as_data_source(split="train")
  n, batch = len(source), config.train.batch_size
  split = _rows({"input_ids": r["input_ids"][None]} for r in source.__getitems__(list(range(n))))
  steps = -(-n // batch)  # one epoch, and a bit of the next
  single = input_pipeline.train_iterator(config, prepared, process_index=0, process_count=1)
  hosts = [input_pipeline.train_iterator(config, prepared, process_index=i, process_count=count) for i in range(count)]
  stream = []
  for _ in range(steps):
    parts = [next(it) for it in hosts]
    assert all(p["input_ids"].shape == (batch // count, config.data.seq_len) for p in parts)
    # The hosts' rows, in host order, are exactly the global batch a single host would read.
    whole = next(single)
    for key in ("input_ids", "segment_ids"):
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
    stream.append(whole["input_ids"])
  # The first n rows of the stream are one epoch: disjoint, and covering the split (as multisets: a few short
  # examples recur in the text).
  assert _rows([{"input_ids": np.concatenate(stream)[:n]}]) == split
  for it in hosts + [single]:
    it.close()


def test_resume_gives_identical_batches(tiny_data):
  config, prepared = tiny_data
  steps_per_epoch = prepared.stats["train"]["examples"] // config.train.batch_size
  reference = input_pipeline.train_iterator(config, prepared)
  expected = [next(reference) for _ in range(steps_per_epoch + 5)]  # across an epoch boundary
  for k in (0, 3, steps_per_epoch - 1):
    interrupted = input_pipeline.train_iterator(config, prepared)
    for _ in range(k):
      next(interrupted)
    state = json.loads(json.dumps(interrupted.get_state()))  # what a checkpoint stores
    assert state == {"step": k}
    interrupted.close()
    resumed = input_pipeline.train_iterator(config, prepared, state=state)
    for want in expected[k:k + 6]:
      got = next(resumed)
      for key in ("input_ids", "segment_ids"):
        np.testing.assert_array_equal(got[key], want[key])
        assert got[key].dtype == np.int32
    resumed.close()
  reference.close()


def test_epochs_are_reshuffled_and_seed_matters(tiny_data):
  config, prepared = tiny_data
  n = prepared.stats["train"]["examples"]
  reader = input_pipeline.Reader(prepared.dataset_dir)
  it = input_pipeline.TrainIterator(reader, n, seed=0, process_index=0, process_count=1)
  first, second = next(it), next(it)
  assert _rows([first]) == _rows([second])  # each epoch is a permutation of the split
  assert (first["input_ids"] != second["input_ids"]).any()
  other = input_pipeline.TrainIterator(reader, n, seed=1, process_index=0, process_count=1)
  assert (next(other)["input_ids"] != first["input_ids"]).any()


def test_validation_is_fixed_finite_and_equal_across_hosts(tiny_data):
  config, prepared = tiny_data
  config = config.copy_and_resolve_references()
  config.train.batch_size = 4
  one = list(input_pipeline.validation_batches(config, prepared, 0, 1, num_batches=0))
  assert len(one) == prepared.stats["validation"]["examples"] // 4
  again = list(input_pipeline.validation_batches(config, prepared, 0, 1, num_batches=0))
  assert _rows(one) == _rows(again) and all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(one, again))
  assert len(list(input_pipeline.validation_batches(config, prepared, 0, 1, num_batches=2))) == 2
  hosts = [list(input_pipeline.validation_batches(config, prepared, i, 2, num_batches=0)) for i in range(2)]
  assert len(hosts[0]) == len(hosts[1]) > 0


def test_to_global_lays_the_batch_over_the_devices(tiny_data):
  config, prepared = tiny_data
  mesh = Mesh(np.array(jax.devices()).reshape(8, 1), ("data", "fsdp"))
  sharding = NamedSharding(mesh, P(("data", "fsdp")))
  batch = next(input_pipeline.train_iterator(config, prepared))
  arrays = input_pipeline.to_global(batch, sharding)
  assert len(jax.devices()) == 8
  for key, value in arrays.items():
    assert value.shape == (config.train.batch_size, config.data.seq_len) and value.sharding == sharding
    np.testing.assert_array_equal(np.asarray(value), batch[key])


def test_reader_maps_indices_across_shards(tiny_data, tmp_path):
  """Split indices over several ArrayRecord files read the records TFDS's own data source reads."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from electra_jax import prepare  # pylint: disable=g-import-not-at-top
  config = tiny_data[0].copy_and_resolve_references()
  config.data.update(data_dir=str(tmp_path), tokenizer=tiny_data[1].tokenizer_path, num_shards=3)
  prepared = prepare.build(config)
  reader = input_pipeline.Reader(prepared.dataset_dir)
  assert len(reader._shards) == 3  # pylint: disable=protected-access
  source = tfds.builder_from_directory(prepared.dataset_dir).as_data_source(split="train").data_source
  indices = np.random.default_rng(0).permutation(reader.num_examples)
  got, want = reader.read(indices), reader.parse(source.__getitems__(indices.tolist()))
  for key in input_pipeline.FEATURES:
    np.testing.assert_array_equal(got[key], want[key])


def _buffers(batch) -> list[int]:
  return [s.data.unsafe_buffer_pointer() for k in input_pipeline.FEATURES for s in batch[k].addressable_shards]


@pytest.mark.parametrize("stable", [False, True])
def test_batches_placed_ahead_are_the_same_batches_and_position(tiny_data, stable):
  """OnDevice (the training loop's prefetch onto the devices) hands out the iterator's batches unchanged, as global
  arrays with the batch sharding, and its position is that of the last batch handed out, not of the read-ahead;
  `stable`, in the same device buffers every time."""
  config, prepared = tiny_data
  mesh = Mesh(np.array(jax.devices()), ("data",))
  sharding = NamedSharding(mesh, P("data"))
  plain = input_pipeline.train_iterator(config, prepared)
  placed = input_pipeline.OnDevice(input_pipeline.train_iterator(config, prepared, state={"step": 0}), sharding,
                                   stable=stable)
  assert placed.get_state() == {"step": 0}
  buffers = set()
  for step in range(1, 6):
    batch, expected = next(placed), next(plain)
    assert batch["input_ids"].sharding == sharding and placed.get_state() == {"step": step}
    for key in ("input_ids", "segment_ids"):
      np.testing.assert_array_equal(np.asarray(batch[key]), expected[key])
    buffers.add(tuple(_buffers(batch)))
  assert len(buffers) == 1 or not stable
  resumed = input_pipeline.OnDevice(input_pipeline.train_iterator(config, prepared, state=placed.get_state()),
                                    sharding)
  np.testing.assert_array_equal(np.asarray(next(resumed)["input_ids"]), next(plain)["input_ids"])
  for it in (plain, placed, resumed):
    it.close()


def test_batches_decoded_with_numpy_are_those_protobuf_parses(tiny_data, caplog):
  """Every batch of an epoch is decoded by records.Decoder (numpy: the reading threads hold the GIL only between its
  loops) into the arrays protobuf's parse gives; records laid out otherwise are left to protobuf, and the Reader
  then says once that the dataset is read the slow way."""
  config, prepared = tiny_data
  reader = input_pipeline.Reader(prepared.dataset_dir)
  source = tfds.builder_from_directory(prepared.dataset_dir).as_data_source(split="train").data_source
  decode = records.Decoder(input_pipeline.FEATURES, config.data.seq_len)
  order = np.random.default_rng(0).permutation(reader.num_examples)
  for start in range(0, reader.num_examples, config.train.batch_size):
    raw = source.__getitems__(order[start:start + config.train.batch_size].tolist())
    got, want = decode(raw), records.parse(raw, input_pipeline.FEATURES, config.data.seq_len)
    assert got is not None
    for key in input_pipeline.FEATURES:
      assert got[key].dtype == np.int32 and got[key].flags.c_contiguous
      np.testing.assert_array_equal(got[key], want[key])

  example = tf_example_generated_pb2.Example.FromString(raw[0])
  features = example.features.feature
  ids, segments = (tf_example_generated_pb2.Example(features={"feature": {k: features[k]}})
                   .SerializeToString() for k in input_pipeline.FEATURES)
  del features["segment_ids"].int64_list.value[-1]
  other = {"features in another order": segments + ids, "cut short": raw[0][:-1], "empty": b"",
           "a value fewer": records.canonical(example.SerializeToString()),
           "another name": raw[0].replace(b"segment_ids", b"segment_idz"),
           "another length": raw[0][:1] + bytes([raw[0][1] ^ 1]) + raw[0][2:]}  # the example's, its first byte
  for what, record in other.items():
    assert decode([raw[1], record]) is None, what
  caplog.set_level(logging.WARNING, logger="absl")
  for _ in range(2):
    parsed = reader.parse([raw[0], segments + ids])
    for key in input_pipeline.FEATURES:
      np.testing.assert_array_equal(parsed[key], want[key][[0, 0]])
  assert caplog.text.count("are not laid out as electra-prepare writes them") == 1
