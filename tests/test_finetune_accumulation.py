"""Fine-tuning with train.grad_accum_steps: k micro-batches of B/k give the update one batch of B gives (dropout off),
for a sequence and a token classifier, on 8 devices."""
import functools

import jax
import ml_collections
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax.finetune import experiment, heads, token_tasks
from electra_jax.finetune import model as model_lib
from electra_jax.model import modeling
from electra_jax.parallel import optim, sharding
from electra_jax.parallel import update as update_lib


def _steps(head: str, k: int, mesh=(8, 1), steps=3, batch_size=16):
  c = config_lib.base("tiny")
  c.data.vocab_size = 256
  c.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)
  mc = modeling.ModelConfig.from_config(c)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 256, (batch_size, 24)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  if head == "tokens":
    model, loss = model_lib.TokenClassifier(mc, 5), token_tasks.loss
    labels = rng.integers(0, 5, (batch_size, 24)).astype(np.int32)
    labels[:, ::3] = -100  # pieces that carry no tag: the micro-batches hold unequal counts of labelled pieces
    labels[::2, 1::3] = -100
  else:
    model, loss = model_lib.Classifier(mc, 3), heads.Classification(["a", "b", "c"]).loss
    labels = rng.integers(0, 3, batch_size).astype(np.int32)
  train = ml_collections.ConfigDict(dict(learning_rate=1e-3, warmup_fraction=0.0, layer_decay=0.8, weight_decay=0.01,
                                         adam_b1=0.9, adam_b2=0.999, adam_eps=1e-6, clip_norm=1.0,
                                         optimizer="adamw", flat_update=False))
  mesh = sharding.create_mesh(*mesh)
  sharding.check_batch(batch_size, mesh, k)
  optimizer = optim.build(experiment.recipe(train, 10, mc.discriminator.num_layers))
  sharded = sharding.create_state(lambda r: model.init(r, ids[:1], ids[:1])["params"], optimizer, mesh)
  step = sharded.jit_step(functools.partial(update_lib.step, update_lib.Update(optimizer, k), loss_fn=functools.partial(
      experiment.train_loss, model=model, loss=loss)))
  batch = jax.device_put({"input_ids": ids, "segment_ids": np.zeros_like(ids), "labels": labels}, sharded.batch)
  state = sharded.init(jax.random.key(0))
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch, jax.random.key(1))
    losses.append(float(metrics["loss"]))
  return jax.device_get(state.params), losses


def test_accumulated_classifier_step_equals_whole_batch():
  whole, whole_losses = _steps("sequence", 1)
  for k, mesh in [(2, (8, 1)), (2, (4, 2))]:
    params, losses = _steps("sequence", k, mesh)
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4), params, whole)


def test_accumulated_tagger_weighs_micro_batches_equally():
  """Token losses are each micro-batch's mean over its labelled pieces: with unequal counts the accumulated loss is
  the mean of the micro-batches' means, not the whole batch's mean (what the config comment says)."""
  _, whole_losses = _steps("tokens", 1, steps=1)
  _, losses = _steps("tokens", 2, steps=1)
  assert losses[0] != pytest.approx(whole_losses[0], rel=1e-6)
  assert losses[0] == pytest.approx(whole_losses[0], rel=0.05)  # close: the same rows, other weights
