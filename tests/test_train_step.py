"""The one jitted, sharded step: the same numbers on 1 device and on 8 (data=8; data=2 x fsdp=4)."""
import jax
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import experiment
from electra_jax.special_ids import SpecialIds


def _run(mesh, objective, steps=2):
  c = config_lib.base("tiny")
  c.data.update(vocab_size=256, seq_len=32)
  c.train.update(batch_size=16, num_steps=10, warmup_steps=1)
  c.objective.name = objective
  c.mesh.update(data=mesh[0], fsdp=mesh[1])
  exp = experiment.create(c, SpecialIds(), devices=jax.devices()[:mesh[0] * mesh[1]])
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 256, (16, 32)).astype(np.int32)
  ids[:, 0], ids[:, 31] = 2, 3
  ids[::2, 20:] = 0
  batch = jax.device_put({"input_ids": ids, "segment_ids": (np.arange(32) > 12).astype(np.int32)[None].repeat(16, 0)},
                         exp.sharded.batch)
  state = exp.sharded.init(jax.random.key(0))
  for _ in range(steps):
    state, metrics = exp.step(state, batch, jax.random.key(1))
  return jax.device_get(state.params), jax.device_get(metrics), state


def test_sharded_step_equals_single_device(objective="electra"):
  params1, metrics1, _ = _run((1, 1), objective)
  for mesh in [(8, 1), (2, 4)]:
    params, metrics, state = _run(mesh, objective)
    for a, b in zip(jax.tree.leaves(params1), jax.tree.leaves(params)):
      np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-5)
    for k in metrics1:
      np.testing.assert_allclose(metrics1[k], metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # FSDP really shards: the discriminator's FFN kernel is split 4 ways over "fsdp".
  kernel = state.params["discriminator"]["layer_0"]["intermediate"]["kernel"]
  assert kernel.sharding.spec[0] == "fsdp" and kernel.addressable_shards[0].data.shape[0] == kernel.shape[0] // 4


def test_batch_must_divide_over_devices():
  c = config_lib.base("tiny")
  c.train.batch_size = 12
  with pytest.raises(ValueError, match="batch_size=12 is not divisible by the 8 data-parallel devices"):
    experiment.create(c, SpecialIds())
