"""Random draws keyed per row, and the generator's samples: one token per masked position from
softmax(logits / temperature)."""
import jax
import jax.numpy as jnp

SAMPLE_BLOCK = 128  # vocabulary entries per block of the two-level inverse CDF (about sqrt(V) for V ~ 16k)


def _sample_block(vocab: int) -> int:
  """The divisor of `vocab` in [64, 256] nearest SAMPLE_BLOCK (no slice of the logits is then copied: 125 for the
  demo's 8000), or SAMPLE_BLOCK when there is none (30522: a shorter last block)."""
  divisors = [b for b in range(64, 257) if vocab % b == 0]
  return min(divisors, key=lambda b: abs(b - SAMPLE_BLOCK)) if divisors else SAMPLE_BLOCK


def per_row(draw, rng: jax.Array, shape: tuple[int, ...], rows: jax.Array | None = None, **kwargs) -> jax.Array:
  """draw(key, shape[1:], **kwargs) for each row (the leading axis of `shape`), the key `rng` folded with the row's
  index in the global batch (`rows`; default 0, 1, ...): a row's numbers do not depend on how the batch is cut into
  micro-batches (accumulate.py)."""
  rows = jnp.arange(shape[0]) if rows is None else rows
  return jax.vmap(lambda r: draw(jax.random.fold_in(rng, r), shape[1:], **kwargs))(rows)


def _cumsum(x: jax.Array) -> jax.Array:
  """Cumulative sum over the last (short) axis as a matmul with a triangular matrix: XLA:CPU's scan for cumsum is
  several times slower."""
  upper = jnp.triu(jnp.ones((x.shape[-1],) * 2, x.dtype))  # upper[k, i] = 1 for k <= i
  return jnp.einsum("...k,ki->...i", x, upper, precision=jax.lax.Precision.HIGHEST)


def sample(rng: jax.Array, logits: jax.Array, temperature: float, block: int = 0,
           rows: jax.Array | None = None) -> jax.Array:
  """One draw from softmax(logits / temperature) over the last axis at each position of the others, keyed per batch
  row (the first axis; per_row's `rows`), by inverse CDF: a single uniform per draw instead of the Gumbel-argmax
  trick's noise per vocabulary entry (the same distribution; on CPU the Gumbel noise of a demo step cost more than
  the generator's head).

  The CDF is walked in two levels, with the same distribution and the same uniform as one cumulative sum over the
  vocabulary: the cumulative sums of blocks of `block` entries pick the block holding u, then the cumulative sum
  within that block picks the entry: no vocabulary-long scan (on XLA:CPU the cumsum over 8000 entries of a demo step
  took ~25 ms, the whole two-level draw ~2 ms). Weights are exp(x - max x), unnormalised, and u is scaled by their
  total. When no block size near SAMPLE_BLOCK divides V, the last V mod block entries form a shorter last block (and
  the rest of the logits are sliced, a copy)."""
  x = logits.astype(jnp.float32)
  if temperature != 1.0:
    x = x / temperature
  vocab = x.shape[-1]
  block = block or _sample_block(vocab)
  nb, rest = divmod(vocab, block)
  top = x.max(axis=-1, keepdims=True)
  main = (x[..., :nb * block] if rest else x).reshape(x.shape[:-1] + (nb, block))
  sums = jnp.exp(main - top[..., None]).sum(axis=-1)  # [..., nb]
  tail = None
  if rest:
    tail = jnp.pad(x[..., nb * block:], [(0, 0)] * (x.ndim - 1) + [(0, block - rest)], constant_values=-jnp.inf)
    sums = jnp.concatenate([sums, jnp.exp(tail - top).sum(axis=-1, keepdims=True)], axis=-1)
  cdf = _cumsum(sums)
  u = per_row(jax.random.uniform, rng, logits.shape[:-1] + (1,), rows) * cdf[..., -1:]  # the total: unnormalised
  j = jnp.minimum((cdf <= u).sum(axis=-1), sums.shape[-1] - 1)  # the block holding u
  start = jnp.take_along_axis(cdf - sums, j[..., None], axis=-1)  # the weight of the blocks before it
  # Gather the block's logits, not its weights: XLA would recompute the whole row's exp for each gathered element.
  within = jnp.take_along_axis(main, jnp.minimum(j, nb - 1)[..., None, None], axis=-2)[..., 0, :] if nb else tail
  if rest and nb:
    within = jnp.where((j == nb)[..., None], tail, within)
  i = jnp.minimum((start + _cumsum(jnp.exp(within - top)) <= u).sum(axis=-1), block - 1)
  return jnp.minimum(j * block + i, vocab - 1).astype(jnp.int32)
