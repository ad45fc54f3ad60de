"""The networks against HF transformers' ELECTRA, and where gradients may flow between G and D."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import experiment, modeling, objectives
from electra_jax.special_ids import SpecialIds


def _init(config, objective="electra"):
  config.objective.name = objective
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  return model, jax.eval_shape(lambda: objectives.init_params(model, config, jax.random.key(0)))


def test_small_parameter_counts_equal_hf():
  import transformers  # pylint: disable=g-import-not-at-top  (the reference; installed by make test)
  c = config_lib.base("small")
  c.data.vocab_size = 30522
  mc = modeling.ModelConfig.from_config(c)
  _, params = _init(c)
  params = {k: modeling.count_params(v) for k, v in params.items()}

  def hf(e, cls):
    return cls(transformers.ElectraConfig(
        vocab_size=mc.vocab_size, embedding_size=mc.embedding_size, hidden_size=e.hidden_size,
        num_hidden_layers=e.num_layers, num_attention_heads=e.num_heads, intermediate_size=e.intermediate_size)
    ).num_parameters()

  assert "generator_embeddings" not in params and "discriminator_embeddings" not in params
  shared = params["embeddings"]
  assert params["discriminator"] + params["discriminator_head"] + shared == hf(
      mc.discriminator, transformers.ElectraForPreTraining)
  assert params["generator"] + params["generator_head"] + shared == hf(mc.generator, transformers.ElectraForMaskedLM)


@pytest.mark.parametrize("sharing,expected", [
    ("shared", {"embeddings", "generator", "discriminator", "generator_head", "discriminator_head"}),
    ("untied", {"generator_embeddings", "discriminator_embeddings", "generator", "discriminator",
                "generator_head", "discriminator_head"}),
    ("all", {"embeddings", "discriminator", "generator_head", "discriminator_head"}),
])
def test_parameter_tree_per_sharing_mode(sharing, expected):
  c = config_lib.base("tiny")
  c.data.update(vocab_size=100, seq_len=16)
  c.objective.embedding_sharing = sharing
  if sharing == "all":
    c.model.generator_fraction = 1.0
  assert set(_init(c)[1]) == expected


def test_mlm_objective_has_no_generator():
  c = config_lib.base("tiny")
  c.data.update(vocab_size=100, seq_len=16)
  assert set(_init(c, "mlm")[1]) == {"embeddings", "discriminator", "discriminator_mlm_head"}


def test_bad_model_configs_fail_clearly():
  c = config_lib.base("tiny")
  c.data.seq_len = 1024
  with pytest.raises(ValueError, match="position table"):
    modeling.ModelConfig.from_config(c)
  c = config_lib.base("tiny")
  c.objective.embedding_sharing = "all"
  with pytest.raises(ValueError, match="generator_fraction=1.0"):
    modeling.ModelConfig.from_config(c)


@functools.lru_cache(maxsize=None)
def _tiny(sharing="shared"):
  """A tiny experiment on one device, its initial params, and its loss metrics jitted as f(params, batch)."""
  c = config_lib.base("tiny")
  c.data.update(vocab_size=64, seq_len=16)
  c.train.update(batch_size=8, num_steps=10, warmup_steps=2)
  c.objective.embedding_sharing = sharing
  c.mesh.update(data=1, fsdp=1)
  exp = experiment.create(c, SpecialIds(), devices=jax.devices()[:1])
  metrics = jax.jit(lambda p, b: objectives.compute_loss(exp.model, p, b, jax.random.key(3), c.objective,
                                                         exp.special)[1])
  return exp, exp.sharded.init(jax.random.key(0)).params, metrics


def _batch(token=7):
  ids = np.full((8, 16), token, np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  ids[:4, 10:] = 0
  return {"input_ids": jnp.asarray(ids), "segment_ids": jnp.zeros((8, 16), jnp.int32)}


def _all_zero(tree):
  return all(not np.any(np.asarray(x)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("sharing", ["shared", "untied", "gdes"])
def test_discriminator_loss_never_reaches_the_generator(sharing):
  _, params, metrics = _tiny(sharing)
  grads = jax.grad(lambda p: metrics(p, _batch())["disc_loss"])(params)
  assert _all_zero(grads["generator"]) and _all_zero(grads["generator_head"])
  assert not _all_zero(grads["discriminator"])
  if sharing == "gdes":  # E_G is trained by the MLM loss only; D learns through its zero-initialised delta
    assert _all_zero(grads["generator_embeddings"])
    assert not _all_zero(grads["discriminator_embeddings"]["word_embeddings_delta"])
    np.testing.assert_array_equal(params["discriminator_embeddings"]["word_embeddings_delta"], 0)


@pytest.mark.parametrize("favoured,replaced", [(7, False), (8, True)])
def test_a_correct_sample_is_labelled_real(favoured, replaced):
  _, params, metrics = _tiny()
  # Make the generator certain of one token: the original (7) or another (8).
  params = dict(params, generator_head=dict(params["generator_head"],
                                            bias=params["generator_head"]["bias"].at[favoured].set(1e4)))
  fraction = float(metrics(params, _batch(7))["replaced_fraction"])
  if replaced:
    assert fraction > 0.05
  else:
    assert fraction == 0.0
