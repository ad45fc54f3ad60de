"""Random draws keyed per row, and the generator's samples: one token per masked position from
softmax(logits / temperature)."""
import math

import jax
import jax.numpy as jnp

SAMPLE_BLOCK = 128  # vocabulary entries per block of the two-level inverse CDF (about sqrt(V); a TPU lane row)


def keys(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Keys of `shape` from `rng`, each its flat index folded in: one GPU kernel, where jax.random.split takes two."""
  flat = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(math.prod(shape)))
  return flat.reshape(shape + flat.shape[1:])


def per_row(draw, rng: jax.Array, shape: tuple[int, ...], rows: jax.Array | None = None, **kwargs) -> jax.Array:
  """draw(key, shape[1:], **kwargs) for each row, `rng` folded with its index in the global batch (`rows`)."""
  rows = jnp.arange(shape[0]) if rows is None else rows
  return jax.vmap(lambda r: draw(jax.random.fold_in(rng, r), shape[1:], **kwargs))(rows)


def _cumsum(x: jax.Array) -> jax.Array:
  """Cumulative sum over the last (short) axis as a matmul with a triangular matrix (faster than XLA:CPU's scan)."""
  upper = jnp.triu(jnp.ones((x.shape[-1],) * 2, x.dtype))  # upper[k, i] = 1 for k <= i
  return jnp.einsum("...k,ki->...i", x, upper, precision=jax.lax.Precision.HIGHEST)


def sample(rng: jax.Array, logits: jax.Array, temperature: float, block: int = 0,
           rows: jax.Array | None = None) -> jax.Array:
  """One draw from softmax(logits / temperature) over the last axis at each position, keyed per row (`rows`), by
  inverse CDF (one uniform a draw, not Gumbel noise a vocabulary entry) in two levels: block sums (`block` entries,
  default SAMPLE_BLOCK) pick the block holding u, the cumulative sum within it the entry (docs/tpu.md)."""
  x = logits.astype(jnp.float32)
  if temperature != 1.0:
    x = x / temperature
  vocab = x.shape[-1]
  block = min(block or SAMPLE_BLOCK, vocab)
  nb = -(-vocab // block)
  top = x.max(axis=-1, keepdims=True)
  window = (1,) * (x.ndim - 1) + (block,)
  padding = ((0, 0),) * (x.ndim - 1) + ((0, nb * block - vocab),)
  sums = jax.lax.reduce_window(jnp.exp(x - top), 0.0, jax.lax.add, window, window, padding)  # [..., nb]
  cdf = _cumsum(sums)
  u = per_row(jax.random.uniform, rng, logits.shape[:-1] + (1,), rows) * cdf[..., -1:]  # the total: unnormalised
  j = jnp.minimum((cdf <= u).sum(axis=-1), nb - 1)  # the block holding u
  before = jnp.take_along_axis(cdf - sums, j[..., None], axis=-1)  # the weight of the blocks before it
  start = jnp.minimum(j * block, vocab - block)  # a shorter last block is read as the last `block` entries
  ids = start[..., None] + jnp.arange(block)
  weights = jnp.where(ids >= (j * block)[..., None], jnp.exp(_slices(x, start, block) - top), 0.0)
  i = jnp.minimum((before + _cumsum(weights) <= u).sum(axis=-1), block - 1)
  return (start + i).astype(jnp.int32)


def _slices(x: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """x[..., start:start + size] at each position of the leading axes, vmapped (flattening them copies x on TPU)."""
  take = lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size)
  for _ in range(x.ndim - 1):
    take = jax.vmap(take)
  return take(x, start)
