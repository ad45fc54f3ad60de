"""The one jitted, sharded step: the same numbers on 1 device and on 8 (data=8; data=2 x fsdp=4), and with the batch
in k micro-batches (train.grad_accum_steps)."""
import jax
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax.data.special_ids import SpecialIds
from electra_jax.parallel import sharding
from electra_jax.pretrain import experiment


def _run(mesh, objective, steps=2, batch_size=16, full_rows=False, update=None):
  """Params, metrics and state after `steps` steps on one batch: [CLS] A [SEP] B (segment 1 from position 13) [SEP],
  every other row padded from position 20 unless `full_rows`. `update`: {config section: its overrides}."""
  c = config_lib.base("tiny")
  c.model.num_layers = 1  # what is checked holds layer by layer; each layer is compile time
  c.data.update(vocab_size=256, seq_len=32)
  c.train.update(batch_size=batch_size, num_steps=10, warmup_steps=1)
  c.objective.name = objective
  c.mesh.update(data=mesh[0], fsdp=mesh[1])
  for section, values in (update or {}).items():
    c[section].update(values)
  exp = experiment.create(c, SpecialIds(), devices=jax.devices()[:mesh[0] * mesh[1]])
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 256, (batch_size, 32)).astype(np.int32)
  ids[:, 0], ids[:, 12], ids[:, 31] = 2, 3, 3
  if not full_rows:
    ids[::2, 20:] = 0
  segments = (np.arange(32) > 12).astype(np.int32)[None].repeat(batch_size, 0)
  batch = jax.device_put({"input_ids": ids, "segment_ids": segments}, exp.sharded.batch)
  state = exp.sharded.init(jax.random.key(0))
  for _ in range(steps):
    state, metrics = exp.step(state, batch, jax.random.key(1))
  return jax.device_get(state.params), jax.device_get(metrics), state


def _assert_close(run1, run2):
  (params1, metrics1, _), (params2, metrics2, _) = run1, run2
  for a, b in zip(jax.tree.leaves(params1), jax.tree.leaves(params2)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-5)
  assert metrics1.keys() == metrics2.keys()
  for k in metrics1:
    np.testing.assert_allclose(metrics1[k], metrics2[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_sharded_step_equals_single_device(objective="electra"):
  """The flat update (train.flat_update, the default) on 1 device, on data=8 and on data=2 x fsdp=4, and the update
  per weight array on data=2 x fsdp=4: the same parameters and metrics."""
  one = _run((1, 1), objective)
  for mesh, flat in [((8, 1), True), ((2, 4), True), ((2, 4), False)]:
    run = _run(mesh, objective, update=dict(train=dict(flat_update=flat)))
    _assert_close(one, run)
    state = run[2]
    # FSDP really shards: the discriminator's FFN kernel is split 4 ways over "fsdp"; so are the flat update's
    # moments of the split weights, a row of shards per device.
    kernel = state.params["discriminator"]["layer_0"]["intermediate"]["kernel"]
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim == 2]
    if mesh[1] > 1:
      assert kernel.sharding.spec[0] == "fsdp" and kernel.addressable_shards[0].data.shape[0] == kernel.shape[0] // 4
    if mesh[1] > 1 and flat:
      assert len(moments) == 2 and all(m.shape[0] == 4 and m.sharding.spec[0] == "fsdp" and
                                       m.addressable_shards[0].data.shape[0] == 1 for m in moments)


def test_each_mesh_axis_can_take_the_devices_the_other_leaves():
  shapes = [(-1, 2), (1, -1), (2, -1), (8, 1)]
  assert [sharding.mesh_shape(d, f, 8) for d, f in shapes] == [(4, 2), (1, 8), (2, 4), (8, 1)]
  with pytest.raises(ValueError, match="mesh data=-1 and fsdp=-1: at most one of them"):
    sharding.mesh_shape(-1, -1, 8)
  with pytest.raises(ValueError, match="mesh data=3 x fsdp=-1 does not match the 8 devices"):
    sharding.mesh_shape(3, -1, 8)


def test_batch_must_divide_over_devices():
  c = config_lib.base("tiny")
  c.train.batch_size = 12
  with pytest.raises(ValueError, match="batch_size=12 is not divisible by the 8 data-parallel devices"):
    experiment.create(c, SpecialIds())


# two_stage switches at step 2 of 4 (step 0 has learning rate 0): each stage trains, accumulated.
@pytest.mark.slow  # micro-batches in the quick tier: test_finetune_accumulation (the same update)
@pytest.mark.parametrize("objective,generator_fraction,sharing", [("electra", 0.5, "shared"),
                                                                  ("two_stage", 1.0, "untied")])
def test_accumulated_step_equals_whole_batch(objective, generator_fraction, sharing):
  """k micro-batches of B/k give the update one batch of B gives (dropout off; full rows, so every micro-batch holds
  as many tokens): the same parameters after four steps, the same mean losses, summed counts and gradient norm."""
  def run(k, mesh=(8, 1)):
    return _run(mesh, objective, steps=4, batch_size=32, full_rows=True, update=dict(
        model=dict(generator_fraction=generator_fraction, dropout_rate=0.0, attention_dropout_rate=0.0),
        objective=dict(embedding_sharing=sharing), train=dict(num_steps=4, grad_accum_steps=k)))
  whole = run(1)
  for k, mesh in [(2, (8, 1)), (4, (2, 4))]:  # micro-batches of 16 rows over data=8; of 8 over data=2 x fsdp=4
    _assert_close(whole, run(k, mesh))


@pytest.mark.parametrize("k", [0, 3, 4])  # 4: micro-batches of 16 / 4 = 4 rows do not split over 8 devices
def test_accumulation_must_split_the_batch(k):
  c = config_lib.base("tiny")
  c.train.update(batch_size=16, grad_accum_steps=k)
  with pytest.raises(ValueError, match=f"^train.grad_accum_steps={k} must be >= 1 and divide train.batch_size=16 into "
                     "micro-batches that split over the 8 data-parallel devices$"):
    experiment.create(c, SpecialIds())


def test_whole_word_masking_reaches_the_step(tiny_data):
  """objective.whole_word_masking trains on prepared data with the word starts of its tokenizer, which it needs."""
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  config, prepared = tiny_data
  config = config.copy_and_resolve_references()
  config.objective.whole_word_masking = True
  with pytest.raises(ValueError, match="^objective.whole_word_masking needs the tokenizer's word starts"):
    experiment.create(config, prepared.special_ids)
  exp = experiment.create(config, prepared.special_ids, word_starts=prepared.word_starts)
  it = input_pipeline.train_iterator(config, prepared)
  state, metrics = exp.step(exp.sharded.init(jax.random.key(0)), input_pipeline.to_global(next(it), exp.sharded.batch),
                            jax.random.key(1))
  it.close()
  assert int(state.step) == 1 and np.isfinite(float(metrics["loss"])) and float(metrics["mlm_loss"]) > 0


def test_state_initialised_on_the_host_equals_the_devices(monkeypatch):
  """A GPU mesh's state is initialised on the host's CPU and copied over (sharding.host_for): the same values, placed
  as the devices' own init places them. Here the host is the CPU device the mesh's first shard lives on."""
  c = config_lib.base("tiny")
  c.model.num_layers = 1
  c.data.update(vocab_size=256, seq_len=32)
  c.mesh.update(data=2, fsdp=4)
  on_devices = experiment.create(c, SpecialIds()).sharded.init(jax.random.key(5))
  monkeypatch.setattr(sharding, "host_for", lambda mesh: jax.devices()[0])
  init = experiment.create(c, SpecialIds()).sharded.init
  assert init.__name__ == "init_via_host"  # not the devices' own jitted init
  via_host = init(jax.random.key(5))
  assert jax.tree.structure(via_host) == jax.tree.structure(on_devices)
  for a, b in zip(jax.tree.leaves(via_host), jax.tree.leaves(on_devices)):
    assert a.sharding == b.sharding and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  kernel = via_host.params["discriminator"]["layer_0"]["intermediate"]["kernel"]
  assert kernel.addressable_shards[0].data.shape[0] == kernel.shape[0] // 4  # split over fsdp, not replicated
