"""The README's demo: ELECTRA-Small-shaped (narrower) on the embedded State of the Union corpus, a few minutes on 2 CPU cores.

  electra-prepare  --config=configs/demo.py
  electra-pretrain --config=configs/demo.py --workdir=runs/demo
"""
from electra_jax import config


def get_config():
  c = config.base("small")
  c.model.update(num_layers=4, hidden_size=128, num_heads=2, intermediate_size=512, embedding_size=64,
                 generator_fraction=0.25)
  c.data.vocab_size = 8000
  c.data.seq_len = 128
  c.data.data_dir = "data/demo"
  c.train.update(num_steps=600, batch_size=32, learning_rate=1e-3, warmup_steps=60, log_every=20, eval_every=200,
                 eval_batches=4, checkpoint_every=200)
  return c
