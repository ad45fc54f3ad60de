"""The one optimiser update of pre-training and fine-tuning: the gradient of k micro-batches, one after another in the
jitted step (a lax.scan), then one optax update applied only where finite; optionally in two stages (two_stage's)."""
import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from electra_jax.parallel import optim
from electra_jax.parallel.state import TrainState


@dataclasses.dataclass(frozen=True)
class Stages:
  """Two stages: step `switch` starts stage 2 from `start(params)` with Adam restarted; stage 1 trains the top-level
  parameters `first(name)` picks, stage 2 the others, the rest kept bitwise (AdamW would move them)."""
  switch: int
  start: Callable[[Any], Any]
  first: Callable[[str], bool]


@dataclasses.dataclass(frozen=True)
class Update:
  """How a step updates the state; `summed`: metrics added over micro-batches; `nan_at_step`: that step's loss NaN."""
  optimizer: optim.Optimizer
  micro_batches: int = 1
  summed: tuple[str, ...] = ()
  stages: Stages | None = None
  nan_at_step: int = 0


def step(update: Update, state: TrainState, batch, rng: jax.Array, loss_fn: Callable) -> tuple[TrainState, dict]:
  """`state` after one update by the gradient of loss_fn(params, micro_batch, rows, rng, [stage=]) -> (loss, metrics)
  over `batch` (`rows`: the micro-batch's rows in it), applied only where the loss and the gradient's norm are finite
  (as optax's apply_if_finite). Metrics: the loss's, loss, grad_norm and skipped (1: not applied)."""
  opt, stages = update.optimizer, update.stages
  step_rng = jax.random.fold_in(rng, state.step)
  params, opt_state = state.params, state.opt_state

  def loss(p, micro, rows, **stage):
    value, metrics = loss_fn(p, micro, rows, step_rng, **stage)
    if update.nan_at_step:
      value *= jnp.where(state.step + 1 == update.nan_at_step, jnp.nan, 1.0)
    return value, metrics

  def grad(p, **stage):
    value_and_grad = jax.value_and_grad(loss, has_aux=True)
    return gradients(lambda micro, rows: value_and_grad(p, micro, rows, **stage), batch, update.micro_batches,
                     update.summed)

  if stages is None:
    (value, metrics), grads = grad(params)
  else:  # one stage's gradient a step
    params, opt_state = jax.lax.cond(state.step == stages.switch, lambda p, o: (stages.start(p), opt.restart(o, p)),
                                     lambda p, o: (p, o), params, opt_state)
    stage2 = state.step >= stages.switch
    (value, metrics), grads = jax.lax.cond(stage2, lambda p: grad(p, stage=2), lambda p: grad(p, stage=1), params)

  grad_norm = optim.global_norm(grads, opt.flat)
  ok = jnp.isfinite(value) & jnp.isfinite(grad_norm)
  updates, new_opt_state = opt.tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  if stages is not None:
    new_params = {name: _where(stage2 == stages.first(name), params[name], p) for name, p in new_params.items()}
  new = TrainState(step=state.step + 1, params=_where(ok, new_params, params),
                   opt_state=_where(ok, new_opt_state, opt_state))
  return new, metrics | dict(loss=value, grad_norm=grad_norm, skipped=(~ok).astype(jnp.float32))


def _where(condition, new, old):
  return jax.tree.map(lambda n, o: jnp.where(condition, n, o), new, old)


def gradients(loss_and_grad, batch, k: int, summed=()):
  """loss_and_grad(micro_batch, rows) -> ((loss, metrics), grads) over k micro-batches of `batch`: their means, but
  `summed` metrics add up. Micro-batch j holds the rows r with r % k == j, so each device keeps its own rows."""
  n = jax.tree.leaves(batch)[0].shape[0] // k
  if k == 1:
    return loss_and_grad(batch, jnp.arange(n))
  micro = jax.tree.map(lambda x: _split_rows(x.reshape(n, k, *x.shape[1:]).swapaxes(0, 1), axis=1), batch)

  def add(total, xs):
    j, part = xs
    return jax.tree.map(jnp.add, total, loss_and_grad(jax.tree.map(_split_rows, part), jnp.arange(n) * k + j)), None

  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(loss_and_grad, first, jnp.arange(n)))
  ((loss, metrics), grads), _ = jax.lax.scan(add, zeros, (jnp.arange(k), micro))
  metrics = {name: v if name in summed else v / k for name, v in metrics.items()}
  return (loss / k, metrics), jax.tree.map(lambda g: g / k, grads)


def _split_rows(x: jax.Array, axis: int = 0) -> jax.Array:
  """x with its `axis` (rows) split over the mesh as the batch is (sharding.RULES' "batch")."""
  return nn.with_logical_constraint(x, tuple("batch" if i == axis else None for i in range(x.ndim)))
