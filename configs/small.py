"""ELECTRA-Small as in the paper: 12 layers, hidden 256, embedding 128, G at 1/4; lr 5e-4, batch 128 x 128, 1M steps.

  electra-prepare  --config=configs/small.py --config.data.text_files='corpus/*.txt' --config.data.data_dir=gs://BUCKET/data
  electra-pretrain --config=configs/small.py --config.data.data_dir=gs://BUCKET/data --workdir=gs://BUCKET/runs/small
"""
from electra_jax import config


def get_config():
  c = config.base("small")
  c.train.update(num_steps=1_000_000, batch_size=128, learning_rate=5e-4)
  c.data.seq_len = 128
  c.model.dtype = "bfloat16"
  # The weights and optimiser state split over the slice (config.py's mesh), the faster layout on a TPU; on one host
  # of GPUs, --config.mesh.data=-1 --config.mesh.fsdp=1 (data parallel) takes fewer kernels (docs/benchmarks.md).
  c.mesh.update(data=1, fsdp=-1)
  return c
