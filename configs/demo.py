"""The README's demo: ELECTRA-Small-shaped (narrower) on the embedded State of the Union corpus: 2000 steps of 32 × 128
tokens, then `make demo` exports, fine-tunes and summarises (docs/pretraining.md has what it learns).

The recipe differs from ELECTRA-Small's where a short CPU run needs it (docs/pretraining.md has the study):
- dropout 0: each step is cheaper (no random masks), and a run this short does not overfit 2.4M tokens of text;
- lr 5e-4 (ELECTRA-Small's) with a 200-step warm-up instead of 10k: with lr 1e-3 the discriminator learnt no faster,
  and a warm-up of 10k steps would outlast the run;
- batch 32 × 128 instead of 128 × 128, to take more steps in the time.

  electra-prepare  --config=configs/demo.py
  electra-pretrain --config=configs/demo.py --workdir=runs/demo
"""
from electra_jax import config


def get_config():
  c = config.base("small")
  c.model.update(num_layers=4, hidden_size=128, num_heads=2, intermediate_size=512, embedding_size=64,
                 generator_fraction=0.25, dropout_rate=0.0, attention_dropout_rate=0.0)
  c.data.vocab_size = 8000
  c.data.seq_len = 128
  c.data.data_dir = "data/demo"
  c.train.update(num_steps=2000, batch_size=32, learning_rate=5e-4, warmup_steps=200, log_every=50, eval_every=200,
                 eval_batches=8, checkpoint_every=500, keep_checkpoints=10)
  return c
