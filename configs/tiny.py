"""Tiny ELECTRA for tests: 1 layer, hidden 64, seq 64; runs in seconds on CPU.

  electra-prepare  --config=configs/tiny.py
  electra-pretrain --config=configs/tiny.py --workdir=runs/tiny
"""
from electra_jax import config


def get_config():
  c = config.base("tiny")
  c.data.vocab_size = 2000
  c.data.seq_len = 64
  c.data.max_documents = 40
  c.data.data_dir = "data/tiny"
  c.train.update(num_steps=40, batch_size=16, learning_rate=2e-3, warmup_steps=5, log_every=10, eval_every=20,
                 eval_batches=2, checkpoint_every=20)
  return c
