"""Gradient accumulation: one step's gradient from k micro-batches of the global batch, run one after another inside
the jitted step (a lax.scan: one micro-batch's activations live at a time) before the one optimiser update.
Pre-training's and fine-tuning's steps use it (train.grad_accum_steps in both configs)."""
import flax.linen as nn
import jax
import jax.numpy as jnp


def check(batch_size: int, k: int, data_parallel: int):
  """k must cut the global batch into equal micro-batches that still split over the data-parallel devices."""
  if k < 1 or batch_size % k or batch_size // k % data_parallel:
    raise ValueError(f"train.grad_accum_steps={k} must be >= 1 and divide train.batch_size={batch_size} into "
                     f"micro-batches that split over the {data_parallel} data-parallel devices")


def gradients(loss_and_grad, batch, k: int, summed=()):
  """loss_and_grad(micro_batch, rows) -> ((loss, metrics), grads) over k micro-batches of `batch` (a tree of [B, ...]
  arrays), returned as one batch's: loss, metrics and gradients are the micro-batches' means, except the metrics
  named in `summed` (counts), which add up. `rows` ([B/k]) are the micro-batch's rows' indices in `batch`: what a
  row's random draws key on, so that they do not depend on k. Each micro-batch's loss is its own mean: the result is
  the whole batch's when every micro-batch weighs as many tokens, and otherwise weighs micro-batches equally.

  Micro-batch j holds the rows r with r % k == j: with the batch split over devices in blocks of a multiple of k rows
  (accumulate.check), each device keeps its own rows and no data moves."""
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
