"""Token classification (NER-style tagging) on your own files: JSONL rows of a word list and its tag list
({"tokens": [...], "tags": [...]}; task.tokens_field, task.tags_field) or a CoNLL-style column file (.txt/.conll:
`word ... tag` per line, a blank line between sentences). Each word's tag is predicted at its first piece; IOB2 tags
give conlleval's entity precision, recall and F1, by which a dev fold selects the model.

  electra-finetune --config=configs/finetune/ner.py --config.task.train_file=train.jsonl \
      --config.task.eval_file=dev.jsonl --config.init_from=runs/demo --workdir=runs/ft_ner
"""
from electra_jax.finetune.config import base_config


def get_config():
  c = base_config()
  c.task.update(type="token_classification", num_epochs=3.0)
  c.seq_len = 128  # sentences longer than this lose whole words from the end (predicted O)
  return c
