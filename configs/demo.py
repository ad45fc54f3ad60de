"""The README's demo: ELECTRA-Small-shaped (narrower) on the embedded State of the Union corpus, ~45 minutes on 2 CPU
cores.

Why 3000 steps: at this size the first ~500 steps sit on the no-context plateau (G no better than a unigram model, D
predicting the base rate), and a discriminator stopped there fine-tunes worse than random init (docs/finetuning.md).

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
  c.train.update(num_steps=3000, batch_size=32, learning_rate=1e-3, warmup_steps=200, log_every=50, eval_every=500,
                 eval_batches=4, checkpoint_every=500, keep_checkpoints=10)
  return c
