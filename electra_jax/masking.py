"""Dynamic masking: which positions of a batch the generator (or BERT) predicts, and what stands in them."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from electra_jax.special_ids import SpecialIds

MASK_TOKEN_FRACTION = 0.85  # ELECTRA: of the chosen positions, 85% become [MASK] and 15% stay (no random tokens)


def max_predictions(mask_prob: float, seq_len: int) -> int:
  return int((mask_prob + 0.005) * seq_len)


class Masked(NamedTuple):
  input_ids: jax.Array  # [B, L] the generator's (or BERT's) input
  positions: jax.Array  # [B, P] chosen positions; slots past a row's count point anywhere and have weight 0
  targets: jax.Array  # [B, P] original ids at `positions`
  weights: jax.Array  # [B, P] 1.0 for a chosen position, 0.0 for an unused slot


def scatter(ids: jax.Array, positions: jax.Array, values: jax.Array, weights: jax.Array) -> jax.Array:
  """ids with ids[b, positions[b, p]] = values[b, p] wherever weights[b, p] > 0 (positions in a row are distinct)."""
  rows = jnp.arange(ids.shape[0])[:, None]
  values = jnp.where(weights > 0, values, ids[rows, positions])
  return ids.at[rows, positions].set(values)


def mask_tokens(rng: jax.Array, input_ids: jax.Array, special: SpecialIds, mask_prob: float, vocab_size: int,
                bert_recipe: bool = False) -> Masked:
  """Choose round(mask_prob · n) of each row's n maskable tokens (never [CLS]/[SEP]/pad), at least one and at most
  max_predictions, uniformly without replacement; replace them by [MASK] (85%) or keep them (15%). With
  `bert_recipe`, 80% [MASK] / 10% a random token / 10% kept instead."""
  batch, seq_len = input_ids.shape
  p = max_predictions(mask_prob, seq_len)
  k_choose, k_mask, k_random = jax.random.split(rng, 3)
  candidate = (input_ids != special.pad) & (input_ids != special.cls) & (input_ids != special.sep)
  num_candidates = candidate.sum(axis=1)
  num_chosen = jnp.clip(jnp.round(num_candidates * mask_prob), 1, p).astype(jnp.int32)
  num_chosen = jnp.where(num_candidates > 0, num_chosen, 0)
  # Random scores in (0, 1) for candidates, -1 elsewhere: the top-p are a uniform sample of the candidates.
  scores = jnp.where(candidate, jax.random.uniform(k_choose, (batch, seq_len)), -1.0)
  _, positions = jax.lax.top_k(scores, p)
  weights = (jnp.arange(p)[None, :] < num_chosen[:, None]).astype(jnp.float32)
  targets = jnp.take_along_axis(input_ids, positions, axis=1)
  u = jax.random.uniform(k_mask, (batch, p))
  if bert_recipe:
    random_ids = jax.random.randint(k_random, (batch, p), 0, vocab_size)
    values = jnp.where(u < 0.8, special.mask, jnp.where(u < 0.9, random_ids, targets))
  else:
    values = jnp.where(u < MASK_TOKEN_FRACTION, special.mask, targets)
  return Masked(scatter(input_ids, positions, values, weights), positions, targets, weights)


def check_masking(config: ml_collections.ConfigDict):
  """objective.mask_prob must mask something, and not everything (that leaves the generator no context), at seq_len."""
  p, seq_len = config.objective.mask_prob, config.data.seq_len
  if not 0 < p < 1:
    raise ValueError(f"objective.mask_prob={p} must be in (0, 1)")
  if max_predictions(p, seq_len) < 1:
    raise ValueError(f"objective.mask_prob={p} masks no token of a data.seq_len={seq_len} sequence (max_predictions "
                     "is 0): raise objective.mask_prob or data.seq_len")
