"""Masking, sampling, losses and labels of the objectives on many sequences."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from electra_jax import flops, losses, masking, objectives, sampling
from electra_jax.special_ids import SpecialIds

SPECIAL = SpecialIds()
VOCAB = 1000


def _batch(rng, batch=512, seq_len=128):
  """[CLS] A [SEP] B [SEP] then padding, with ragged lengths."""
  ids = rng.integers(5, VOCAB, (batch, seq_len)).astype(np.int32)
  lengths = rng.integers(seq_len // 4, seq_len + 1, batch)
  for i, n in enumerate(lengths):
    ids[i, 0] = SPECIAL.cls
    ids[i, n // 2] = SPECIAL.sep
    ids[i, n - 1] = SPECIAL.sep
    ids[i, n:] = SPECIAL.pad
  return jnp.asarray(ids)


@pytest.mark.parametrize("mask_prob", [0.15, 0.25])
def test_masking_statistics(mask_prob):
  ids = _batch(np.random.default_rng(0))
  m = masking.mask_tokens(jax.random.key(0), ids, SPECIAL, mask_prob, VOCAB)
  ids, masked, pos, w = map(np.asarray, (ids, m.input_ids, m.positions, m.weights))
  chosen = np.zeros(ids.shape, bool)
  np.put_along_axis(chosen, pos, w > 0, axis=1)
  candidates = (ids != SPECIAL.pad) & (ids != SPECIAL.cls) & (ids != SPECIAL.sep)
  assert not (chosen & ~candidates).any(), "chose [CLS], [SEP] or padding"
  assert (chosen.sum(1) <= masking.max_predictions(mask_prob, ids.shape[1])).all()
  assert abs(chosen.sum() / candidates.sum() - mask_prob) <= 0.01
  # Targets are the original ids at the chosen positions; nothing outside them changes.
  np.testing.assert_array_equal(np.take_along_axis(ids, pos, 1)[w > 0], m.targets[w > 0])
  assert (masked[~chosen] == ids[~chosen]).all()
  mask_fraction = (masked[chosen] == SPECIAL.mask).mean()
  assert abs(mask_fraction - 0.85) < 0.02
  assert (masked[chosen & (masked != SPECIAL.mask)] == ids[chosen & (masked != SPECIAL.mask)]).all(), \
      "ELECTRA keeps the other 15% unchanged (no random tokens)"


def test_bert_recipe_80_10_10():
  ids = _batch(np.random.default_rng(1))
  m = masking.mask_tokens(jax.random.key(1), ids, SPECIAL, 0.15, VOCAB, bert_recipe=True)
  w = np.asarray(m.weights) > 0
  new = np.take_along_axis(np.asarray(m.input_ids), np.asarray(m.positions), 1)[w]
  orig = np.asarray(m.targets)[w]
  assert abs((new == SPECIAL.mask).mean() - 0.8) < 0.02
  assert abs(((new != SPECIAL.mask) & (new != orig)).mean() - 0.1) < 0.02
  assert abs((new == orig).mean() - 0.1) < 0.02


@pytest.mark.parametrize("block", [0, 10, 8])  # one short block; 5 whole blocks; 6 blocks and a shorter last one
def test_sampling_follows_softmax_and_temperature(block):
  """Frequencies of 40k draws over a 50-token vocabulary match softmax(logits / T) by a chi-square test (p > 1e-4
  fails a correct sampler once in 10,000 runs; the most likely token 25% too likely fails it), for every way the
  two-level inverse CDF cuts the vocabulary into blocks."""
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(3), (50,)) * 2)
  n = 40_000
  sample = functools.partial(sampling.sample, block=block)
  for temperature in (1.0, 2.0):
    want = np.asarray(jax.nn.softmax(jnp.log(probs) / temperature), np.float64)
    want /= want.sum()
    logits = jnp.log(probs)[None].repeat(n, 0)
    draws = np.asarray(sample(jax.random.key(0), logits, temperature))
    counts = np.bincount(draws, minlength=50)
    assert scipy.stats.chisquare(counts, want * n).pvalue > 1e-4, temperature
    wrong = want * np.where(np.arange(50) == np.argmax(want), 1.25, 1.0)
    assert scipy.stats.chisquare(counts, wrong / wrong.sum() * n).pvalue < 1e-4
  cold = np.asarray(sample(jax.random.key(1), jnp.log(probs)[None].repeat(1000, 0), 0.01))
  assert (cold == int(np.argmax(probs))).mean() > 0.99
  # A zero-probability token is never drawn.
  masked = jnp.log(probs).at[7].set(-jnp.inf)
  assert 7 not in np.asarray(sample(jax.random.key(2), masked[None].repeat(n, 0), 1.0))


def test_disc_loss_counts():
  logits = jnp.array([[3.0, -3.0, 3.0, -3.0]])
  labels = jnp.array([[True, True, False, False]])
  loss, acc, counts = losses.disc_loss(logits, labels, jnp.ones((1, 4)))
  assert float(acc) == pytest.approx(0.5)
  assert float(counts["disc_true_positives"]) == 1 and float(counts["disc_predicted_positives"]) == 2
  expected = -np.mean(np.log(jax.nn.sigmoid(np.array([3.0, -3.0, 3.0, -3.0]) * np.array([1, 1, -1, -1]))))
  assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_uniform_replacement_trains_discriminator_alone():
  """The objective added as one registry entry: no generator parameters; D's labels mark exactly the tokens that
  changed, ~mask_prob of the maskable ones (a uniform draw rarely equals the original or a special id)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from electra_jax import config as config_lib, modeling  # pylint: disable=g-import-not-at-top
  c = config_lib.base("tiny")
  c.data.update(vocab_size=VOCAB, seq_len=128)
  c.objective.name = "uniform_replacement"
  model = modeling.Electra(modeling.ModelConfig.from_config(c))
  params = nn.meta.unbox(jax.jit(lambda k: objectives.init_params(model, c, k))(jax.random.key(0)))
  assert set(params) == {"embeddings", "discriminator", "discriminator_head"}
  ids = _batch(np.random.default_rng(1), batch=64)
  loss, metrics = objectives.compute_loss(model, params, {"input_ids": ids, "segment_ids": jnp.zeros_like(ids)},
                                          jax.random.key(2), c.objective, SPECIAL, deterministic=True)
  non_pad = np.asarray(ids != SPECIAL.pad)
  maskable = non_pad & np.asarray((ids != SPECIAL.cls) & (ids != SPECIAL.sep))
  expected = 0.15 * maskable.sum() / non_pad.sum()
  assert abs(float(metrics["replaced_fraction"]) - expected) < 0.01
  assert float(metrics["disc_label_positives"]) == pytest.approx(float(metrics["replaced_fraction"]) * non_pad.sum())
  assert np.isfinite(float(loss)) and "mlm_loss" not in metrics
  electra = c.copy_and_resolve_references()
  electra.objective.name = "electra"
  assert flops.step_flops(c) < flops.step_flops(electra)
