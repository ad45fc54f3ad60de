"""Two-stage ELECTRA (objective.name=two_stage): G alone, then D initialised from G with G frozen."""
import copy
import jax
import numpy as np
import optax
import pytest

from configs import tiny
from electra_jax.model import flops, masking, two_stage
from electra_jax.pretrain import experiment

SWITCH = 3  # two_stage_fraction=0.5 of 6 steps: steps 0-2 train G, step 3 copies G into D and starts stage 2


def _config(**objective):
  c = tiny.get_config()
  c.data.update(vocab_size=256, seq_len=32)
  c.train.update(batch_size=8, num_steps=2 * SWITCH)
  c.model.generator_fraction = 1.0
  c.objective.update(name="two_stage", embedding_sharing="untied")
  c.objective.update(**objective)
  return c


def _network(params, name):
  return {k: v for k, v in params.items() if k.startswith(name)}


def _counted(s):
  return isinstance(s, (optax.ScaleByAdamState, optax.ScaleByScheduleState))


def _equal(a, b):
  return jax.tree.all(jax.tree.map(np.array_equal, a, b))


@pytest.fixture(scope="module")
def run():
  """The experiment, the params before each step and after the last one, each step's metrics, the final state."""
  exp = experiment.create(_config())
  ids = np.random.default_rng(0).integers(5, 256, (8, 32)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
  batch = jax.device_put({"input_ids": ids, "segment_ids": np.zeros_like(ids)}, exp.sharded.batch)
  state = exp.sharded.init(jax.random.key(0))
  params, step_metrics = [jax.device_get(state.params)], []
  for _ in range(2 * SWITCH):
    state, m = exp.step(state, batch, jax.random.key(1))  # donates `state`: copy what we keep first
    params.append(jax.device_get(state.params))
    step_metrics.append(jax.device_get(m))
  return exp, params, step_metrics, state


def test_stage1_trains_generator_alone(run):
  _, params, step_metrics, _ = run
  assert not _equal(_network(params[0], "generator"), _network(params[SWITCH], "generator"))
  # AdamW's weight decay would shrink D even without gradients: it stays bitwise as initialised.
  assert _equal(_network(params[0], "discriminator"), _network(params[SWITCH], "discriminator"))
  for m in step_metrics[:SWITCH]:
    assert m["loss"] == m["mlm_loss"] > 0
    assert m["disc_loss"] == m["replaced_fraction"] == 0


def test_switch_copies_generator_into_discriminator(run):
  exp, params, _, state = run
  before, after = params[SWITCH], params[SWITCH + 1]
  copied = two_stage.discriminator_from_generator(before)
  assert copied["discriminator"] is before["generator"]
  assert copied["discriminator_embeddings"] is before["generator_embeddings"]
  assert _equal(_network(copied, "generator"), _network(before, "generator"))
  assert copied["discriminator_head"] is before["discriminator_head"]
  # After the switch step, D is G's copy moved by one Adam step: at most the learning rate per weight.
  lr = float(exp.schedule(SWITCH))
  for name in ("", "_embeddings"):
    gap = jax.tree.map(lambda d, g: np.abs(d - g).max(), after["discriminator" + name], before["generator" + name])
    assert 0 < max(jax.tree.leaves(gap)) <= 1.01 * lr
    assert not _equal(after["discriminator" + name], before["discriminator" + name])
  # Adam (moments and bias correction) restarted at the switch; the learning-rate schedule carried on.
  counts = {type(s).__name__: int(s.count) for s in jax.tree.leaves(state.opt_state, is_leaf=_counted)
            if _counted(s)}
  assert counts == {"ScaleByAdamState": SWITCH, "ScaleByScheduleState": 2 * SWITCH}


def test_stage2_freezes_generator(run):
  _, params, step_metrics, _ = run
  for before, after in zip(params[SWITCH:], params[SWITCH + 1:]):
    assert _equal(_network(before, "generator"), _network(after, "generator"))
    assert not _equal(_network(before, "discriminator"), _network(after, "discriminator"))
  for m in step_metrics[SWITCH:]:
    np.testing.assert_allclose(m["loss"], 50.0 * m["disc_loss"], rtol=1e-6)
    assert m["mlm_loss"] > 0 and m["replaced_fraction"] > 0


@pytest.mark.parametrize("override, message", [
    (dict(embedding_sharing="shared"), "objective.embedding_sharing=untied"),
    (dict(two_stage_fraction=1.0), r"objective.two_stage_fraction=1.0 must be in \(0, 1\)"),
    (dict(two_stage_fraction=0.0), r"objective.two_stage_fraction=0.0 must be in \(0, 1\)"),
])
def test_bad_configs(override, message):
  with pytest.raises(ValueError, match=message):
    experiment.create(_config(**override))


def test_needs_equal_sizes():
  c = _config()
  c.model.generator_fraction = 0.5
  with pytest.raises(ValueError, match=r"two_stage initialises D from G, so it needs model.generator_fraction=1.0"):
    experiment.create(c)


def test_flops_average_the_two_stages(run):
  exp = run[0]
  c, mc = exp.config, exp.model.config
  batch, seq_len = c.train.batch_size, c.data.seq_len
  stage1 = (flops.encoder_flops(mc, mc.generator, batch, seq_len) +  # G training
            flops.mlm_head_flops(mc, mc.generator.hidden_size,
                                 batch * masking.max_predictions(c.objective.mask_prob, seq_len)))
  electra = copy.deepcopy(c)
  electra.objective.name = "electra"
  stage2 = flops.step_flops(electra) - 2 / 3 * stage1  # G forward
  for f in (0.25, 0.5):
    step = flops.step_flops(c, two_stage_fraction=f)
    assert min(stage1, stage2) < step < max(stage1, stage2)
    assert step == pytest.approx(f * stage1 + (1 - f) * stage2, rel=1e-12)
  assert flops.step_flops(c) == flops.step_flops(c, two_stage_fraction=c.objective.two_stage_fraction)