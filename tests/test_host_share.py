"""Each host fetches only its share of a gs:// dataset (4 shards, 2 hosts: the bytes the fake-gcs-server sends each,
counted by a TCP proxy in front of it), and an epoch begun on 2 hosts and finished on 1 after a restart reads no
example twice and every one of each lane (bar one of a lane longer than the shortest). electra-prepare's default shard
count gives a pod lanes; a pod whose hosts do not divide them is told which count to prepare."""
import collections
import os
import pathlib
import socket
import threading

import numpy as np
import pytest

from electra_jax import prepare
from electra_jax.data import input_pipeline, pretraining
from electra_jax.runtime import storage

SHARDS = 4


class _CountingProxy:
  """Forwards TCP connections to `upstream` (host, port), counting the bytes it sends back: what clients fetched."""

  def __init__(self, upstream: tuple[str, int]):
    self.upstream, self.received = upstream, 0
    self._lock = threading.Lock()
    self._server = socket.create_server(("127.0.0.1", 0))
    self.host = f"127.0.0.1:{self._server.getsockname()[1]}"
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while True:
      try:
        client, _ = self._server.accept()
      except OSError:  # closed
        return
      server = socket.create_connection(self.upstream)
      threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
      threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

  def _pump(self, source, target, count: bool):
    try:
      while data := source.recv(1 << 16):
        target.sendall(data)
        if count:
          with self._lock:
            self.received += len(data)
    except OSError:
      pass
    finally:
      for s in (source, target):
        s.close()

  def close(self):
    self._server.close()


@pytest.fixture(scope="module")
def sharded(tiny_data, tmp_path_factory):
  """configs/tiny.py's data in SHARDS shards a split."""
  config = tiny_data[0].copy_and_resolve_references()
  config.data.update(data_dir=str(tmp_path_factory.mktemp("sharded")), tokenizer=tiny_data[1].tokenizer_path,
                     num_shards=SHARDS)
  return config, prepare.build(config)


def test_default_shard_count_is_a_power_of_two_of_shards_of_16_mib_or_more(tiny_data, tmp_path, monkeypatch):
  mib = 1 << 20
  # (a split's serialized MiB, its shards) at ~450 bytes an example (seq_len 128); TFDS's: 1, 1, 1, 2, 16, 128, 1024
  for size, count in ((7, 1), (31, 1), (100, 4), (200, 8), (1024, 64), (10 << 10, 256), (100 << 10, 1024)):
    assert pretraining.num_shards(size * mib, size * mib // 450) == count, size
  assert pretraining.num_shards(1 << 30, 10) == 8  # no shard without an example
  for split in ("train", "validation"):  # tiny's data (as the demo's, 7 MiB) stays one shard: the same batches
    assert len(input_pipeline.Reader(tiny_data[1].dataset_dir, split).shard_lengths) == 1
  # What electra-prepare writes with data.num_shards=0: with shards of 128 KiB or more, tiny's 0.78 MB train split in 4.
  monkeypatch.setattr(pretraining, "MIN_SHARD_BYTES", 1 << 17)
  config = tiny_data[0].copy_and_resolve_references()
  config.data.update(data_dir=str(tmp_path), tokenizer=tiny_data[1].tokenizer_path)
  train = input_pipeline.Reader(prepare.build(config).dataset_dir)
  assert len(train.shard_lengths) == len(input_pipeline.lanes(train.shard_lengths, config.train.batch_size)) == 4
  # Prepared again with the count a pod's warning names: rebuilt, with another metadata.json (the hosts' copies' key).
  meta = pathlib.Path(train.dataset_dir, "metadata.json").read_text()
  config.data.num_shards = 8
  assert len(input_pipeline.Reader(prepare.build(config).dataset_dir).shard_lengths) == 8
  assert pathlib.Path(train.dataset_dir, "metadata.json").read_text() != meta


@pytest.mark.parametrize("shards, hosts, index, line", [
    (1, 2, 0, "Each of the 2 hosts fetches all of the train split of DIR, not 1/2 (shards: 1; lanes at "
              "train.batch_size=16: 1, not a multiple of 2); prepare it again with --config.data.num_shards=2 (or "
              "another multiple of 2) for each host to fetch only its share (docs/data.md)"),
    (SHARDS, 8, 0, "fetches 1/4 of the train split of DIR, not 1/8 (shards: 4; lanes at train.batch_size=16: 4, not a "
                   "multiple of 8); prepare it again with --config.data.num_shards=8 (or "),
    (1, 2, 1, None),  # host 0 says it for all
    (SHARDS, 2, 0, None),  # 2 lanes each
])
def test_hosts_that_do_not_divide_the_lanes_are_told_which_num_shards_to_prepare(tiny_data, sharded, shards, hosts,
                                                                                  index, line, caplog):
  prepared = (tiny_data if shards == 1 else sharded)[1]
  reader = input_pipeline.Reader(prepared.dataset_dir)
  assert len(reader.shard_lengths) == shards
  input_pipeline.TrainIterator(reader, 16, 0, index, hosts).close()
  assert not caplog.records  # a local dataset: nothing is fetched
  reader.remote = True  # as a gs:// dataset's reader is (test_each_host_fetches_its_share reads one)
  input_pipeline.TrainIterator(reader, 16, 0, index, hosts).close()
  lines = [r.getMessage().replace(prepared.dataset_dir, "DIR") for r in caplog.records]
  assert (not lines) if line is None else (len(lines) == 1 and line in lines[0]), lines


def _bytes_under(path) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_each_host_fetches_its_share_and_an_epoch_survives_another_host_count(sharded, gcs_bucket, tmp_path,
                                                                             monkeypatch):
  config, prepared = sharded
  host, bucket = gcs_bucket
  files = {os.path.relpath(os.path.join(d, f), prepared.dataset_dir): os.path.join(d, f)
           for d, _, names in os.walk(prepared.dataset_dir) for f in names}
  for name, path in files.items():
    bucket.blob(f"share/{name}").upload_from_filename(path)
  remote = f"gs://{bucket.name}/share"
  local = input_pipeline.Reader(prepared.dataset_dir)
  train = sum(os.path.getsize(files[f]) for f in files if "-train.array_record-" in f)
  description = sum(os.path.getsize(p) for f, p in files.items() if ".array_record-" not in f)
  batch, seed = config.train.batch_size, config.train.seed
  lanes = input_pipeline.lanes(local.shard_lengths, batch)
  assert len(local.shard_lengths) == len(lanes) == SHARDS

  proxy = _CountingProxy(("127.0.0.1", int(host.rsplit(":", 1)[1])))
  for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
    monkeypatch.setenv(name, proxy.host)
  storage.initialize()
  length = min(n for _, n in lanes)
  per_lane = batch // len(lanes)
  steps = -(-length // per_lane)  # one epoch
  try:
    parts, fetched, on_disk = [], [], []
    for i in range(2):  # each host of two, alone, for half an epoch
      monkeypatch.setenv("ELECTRA_JAX_CACHE", str(tmp_path / f"cache{i}"))
      proxy.received = 0
      it = input_pipeline.TrainIterator(input_pipeline.Reader(remote), batch, seed, i, 2)
      parts.append([next(it) for _ in range(steps // 2)])
      it.close()
      fetched.append(proxy.received)
      on_disk.append(_bytes_under(tmp_path / f"cache{i}"))
    print(f"dataset {sum(map(os.path.getsize, files.values()))} bytes ({train} of train shards, {description} of "
          f"description); fetched by host 0 and 1 of 2: {fetched}; on their disks: {on_disk}")
    for i in range(2):
      assert 0.45 * train <= on_disk[i] - description <= 0.55 * train, (on_disk, train)
      assert on_disk[i] <= fetched[i] <= on_disk[i] + (64 << 10), (fetched, on_disk)  # + the HTTP exchanges
    # The rest of the epoch after a restart on one host, from the step the two reached.
    monkeypatch.setenv("ELECTRA_JAX_CACHE", str(tmp_path / "cache_one"))
    it = input_pipeline.TrainIterator(input_pipeline.Reader(remote), batch, seed, 0, 1, state={"step": steps // 2})
    rest = [next(it) for _ in range(steps - steps // 2)]
    it.close()
  finally:
    proxy.close()
  stream = [np.concatenate([a["input_ids"], b["input_ids"]]) for a, b in zip(*parts)] + [b["input_ids"] for b in rest]
  for l, (start, size) in enumerate(lanes):  # a lane's epoch: `length` of its examples, none twice (all if equal)
    rows = collections.Counter(r.tobytes() for r in np.concatenate([b[l * per_lane:(l + 1) * per_lane]
                                                                     for b in stream])[:length])
    examples = collections.Counter(r.tobytes() for r in local.read(np.arange(start, start + size))["input_ids"])
    assert rows.total() == length and not rows - examples and (size > length or rows == examples), l
