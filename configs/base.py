"""ELECTRA-Base as in the paper: 12 layers, hidden 768, G at 1/3; lr 2e-4, batch 256 x 512, 766k steps.

  electra-pretrain --config=configs/base.py --config.data.data_dir=gs://BUCKET/data --workdir=gs://BUCKET/runs/base
"""
from electra_jax import config


def get_config():
  c = config.base("base")
  c.train.update(num_steps=766_000, batch_size=256, learning_rate=2e-4)
  c.data.seq_len = 512
  c.model.dtype = "bfloat16"
  c.mesh.update(data=1, fsdp=-1)  # the weights and optimiser state split over the slice (config.py's mesh)
  return c
