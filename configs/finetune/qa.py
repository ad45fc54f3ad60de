"""Extractive question answering on your own SQuAD v1.1 JSON files (data[].paragraphs[]: context and qas[] of id,
question and answers' text and answer_start): [CLS] question [SEP] context window [SEP], contexts longer than a
window cut into windows that share task.doc_stride pieces, start/end logits, the best span over a question's windows;
SQuAD's exact match and F1, by which a dev fold selects the model.

  electra-finetune --config=configs/finetune/qa.py --config.task.train_file=train.json \
      --config.task.eval_file=dev.json --config.init_from=runs/demo --workdir=runs/ft_qa
"""
from electra_jax.finetune.config import base_config


def get_config():
  c = base_config()
  c.task.update(type="qa", num_epochs=2.0, doc_stride=64, max_query_length=64, max_answer_length=30)
  c.seq_len = 256
  c.mesh.update(data=1, fsdp=-1)  # the weights and optimiser state split over the slice (config.py's mesh)
  return c
