"""Your own classification task (the README's own-task command): JSONL/CSV/TSV files with a text column, an optional
second text (pairs) and a label column; regression with --config.task.type=regression.

  electra-finetune --config=configs/finetune/classify.py --config.task.train_file=train.jsonl \
      --config.task.eval_file=dev.jsonl --config.init_from=runs/demo --workdir=runs/ft_mine
  electra-finetune --config=configs/finetune/classify.py --config.task.train_file=train.csv \
      --config.task.text_b_field=text_b --config.init_from=exports/demo --workdir=runs/ft_pairs   # sentence pairs
  electra-finetune --config=configs/finetune/classify.py ... --seeds=0,1,2 --learning_rates=1e-4,3e-4,1e-3  # protocol

The recipe adapts to the data: at least train.min_steps updates (3 epochs of a large task, many more of a small one),
a dev fold (10% of the training rows) that picks the model and stops the run once it stops improving, and the
paper's learning rate for the encoder's size (train.learning_rate=0: Small 3e-4, Base 1e-4, Large 5e-5) and
layer-wise decay for its depth (train.layer_decay=0: 0.8 for Small and Base, 0.9 for Large, off below 12 layers).
Without an eval file, 20% of the training rows are held out as the eval split.
"""
from electra_jax.finetune.config import base_config


def get_config():
  c = base_config()
  c.task.name = "mine"
  c.seq_len = 128
  return c
