"""ELECTRA-Large as in the paper: 24 layers, hidden 1024, G at 1/4, mask 25%; lr 2e-4, batch 2048 x 512, 400k steps.

  electra-pretrain --config=configs/large.py --config.data.data_dir=gs://BUCKET/data --workdir=gs://BUCKET/runs/large
"""
from electra_jax import config


def get_config():
  c = config.base("large")
  c.objective.mask_prob = 0.25
  c.train.update(num_steps=400_000, batch_size=2048, learning_rate=2e-4)
  c.data.seq_len = 512
  c.model.update(dtype="bfloat16", remat=True)
  c.mesh.update(data=1, fsdp=-1)  # the weights and optimiser state split over the slice (config.py's mesh)
  return c
