"""Dynamic masking: which positions of a batch the generator (or BERT) predicts (tokens, or whole words), and what
stands in them."""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import sampling

MASK_TOKEN_FRACTION = 0.85  # ELECTRA: of the chosen positions, 85% become [MASK] and 15% stay (no random tokens)


def max_predictions(mask_prob: float, seq_len: int) -> int:
  return int((mask_prob + 0.005) * seq_len)


class Masked(NamedTuple):
  input_ids: jax.Array  # [B, L] the generator's (or BERT's) input
  positions: jax.Array  # [B, P] chosen positions; slots past a row's count point anywhere and have weight 0
  targets: jax.Array  # [B, P] original ids at `positions`
  weights: jax.Array  # [B, P] 1.0 for a chosen position, 0.0 for an unused slot


def scatter(ids: jax.Array, positions: jax.Array, values: jax.Array, weights: jax.Array) -> jax.Array:
  """ids with ids[b, positions[b, p]] = values[b, p] where weights > 0, as [B, P, L] selects (cheaper on a TPU)."""
  hit = (positions[..., None] == jnp.arange(ids.shape[1])) & (weights[..., None] > 0)
  return jnp.where(hit.any(axis=1), jnp.where(hit, values[..., None], 0).sum(axis=1).astype(ids.dtype), ids)


def mask_tokens(rng: jax.Array, input_ids: jax.Array, special: SpecialIds, mask_prob: float, vocab_size: int,
                bert_recipe: bool = False, rows: jax.Array | None = None) -> Masked:
  """Choose round(mask_prob · n) of each row's n maskable tokens (never [CLS]/[SEP]/pad; at least 1, at most
  max_predictions) uniformly; replace them by [MASK] (85%) or keep them (15%), or with `bert_recipe` 80% [MASK] / 10%
  a random token / 10% kept. Each row draws with its own key (`rows`; sampling.per_row)."""
  seq_len = input_ids.shape[1]
  p = max_predictions(mask_prob, seq_len)
  k_choose, k_replace = jax.random.split(rng)
  candidate = _candidates(input_ids, special)
  # Random scores in (0, 1) for candidates, -1 elsewhere: the top-p are a uniform sample of the candidates.
  scores = jnp.where(candidate, sampling.per_row(jax.random.uniform, k_choose, input_ids.shape, rows), -1.0)
  _, positions = jax.lax.top_k(scores, p)
  weights = (jnp.arange(p)[None, :] < _budget(candidate, mask_prob, p)[:, None]).astype(jnp.float32)
  return _replace(k_replace, input_ids, positions, weights, special, vocab_size, bert_recipe, rows)


def mask_words(rng: jax.Array, input_ids: jax.Array, special: SpecialIds, mask_prob: float, vocab_size: int,
               bert_recipe: bool = False, rows: jax.Array | None = None, *, word_starts) -> Masked:
  """mask_tokens' budget spent as BERT's whole-word masking does: the row's words in random order, each taken whole
  if it fits in what is left. A word is a piece `word_starts` ([vocab_size] bool) marks, or any piece after a special
  token or padding, with the unmarked pieces that follow (specials are never words)."""
  batch, seq_len = input_ids.shape
  p = max_predictions(mask_prob, seq_len)
  k_choose, k_replace = jax.random.split(rng)
  candidate = _candidates(input_ids, special)
  budget = _budget(candidate, mask_prob, p)
  after_other = jnp.pad(~candidate[:, :-1], ((0, 0), (1, 0)), constant_values=True)
  starts = candidate & (jnp.asarray(word_starts)[input_ids] | after_other)
  word = jnp.where(candidate, jnp.cumsum(starts, axis=1), 0)  # [B, L]: word w's pieces hold w (1, 2, ...), others 0
  row = jnp.arange(batch)[:, None]
  length = jnp.zeros((batch, seq_len + 1), jnp.int32).at[row, word].add(1)[:, 1:]  # [B, L]: word w's at w - 1
  scores = jnp.where(length > 0, sampling.per_row(jax.random.uniform, k_choose, (batch, seq_len), rows), -1.0)
  _, order = jax.lax.top_k(scores, seq_len)  # the words in random order, then the empty slots (length 0)

  def take(used, n):  # one word of each row: taken when it fits in the budget's rest
    fits = (n > 0) & (used + n <= budget)
    return used + jnp.where(fits, n, 0), fits

  _, taken = jax.lax.scan(take, jnp.zeros(batch, jnp.int32), jnp.take_along_axis(length, order, axis=1).T)
  chosen_words = jnp.zeros((batch, seq_len + 1), bool).at[row, order + 1].set(taken.T)  # slot 0: no word
  chosen = jnp.take_along_axis(chosen_words, word, axis=1)
  _, positions = jax.lax.top_k(chosen.astype(jnp.float32), p)  # the chosen positions first (at most p of them)
  weights = (jnp.arange(p)[None, :] < chosen.sum(axis=1)[:, None]).astype(jnp.float32)
  return _replace(k_replace, input_ids, positions, weights, special, vocab_size, bert_recipe, rows)


def _candidates(input_ids: jax.Array, special: SpecialIds) -> jax.Array:
  """[B, L] bool: the maskable tokens (not [CLS], [SEP] or padding)."""
  return (input_ids != special.pad) & (input_ids != special.cls) & (input_ids != special.sep)


def _budget(candidate: jax.Array, mask_prob: float, p: int) -> jax.Array:
  """[B] how many tokens each row masks: round(mask_prob · n) of its n candidates, at least 1 and at most p."""
  num_candidates = candidate.sum(axis=1)
  num_chosen = jnp.clip(jnp.round(num_candidates * mask_prob), 1, p).astype(jnp.int32)
  return jnp.where(num_candidates > 0, num_chosen, 0)


def _replace(rng: jax.Array, input_ids: jax.Array, positions: jax.Array, weights: jax.Array, special: SpecialIds,
             vocab_size: int, bert_recipe: bool, rows: jax.Array | None) -> Masked:
  """The Masked input: at the chosen positions [MASK] (85%) or the token kept (15%), or BERT's 80/10/10."""
  k_mask, k_random = jax.random.split(rng)
  targets = jnp.take_along_axis(input_ids, positions, axis=1)
  u = sampling.per_row(jax.random.uniform, k_mask, positions.shape, rows)
  if bert_recipe:
    random_ids = sampling.per_row(jax.random.randint, k_random, positions.shape, rows, minval=0, maxval=vocab_size)
    values = jnp.where(u < 0.8, special.mask, jnp.where(u < 0.9, random_ids, targets))
  else:
    values = jnp.where(u < MASK_TOKEN_FRACTION, special.mask, targets)
  return Masked(scatter(input_ids, positions, values, weights), positions, targets, weights)


def check_masking(p: float, seq_len: int):
  """objective.mask_prob `p` must mask something at data.seq_len, and not everything (G would have no context)."""
  if not 0 < p < 1:
    raise ValueError(f"objective.mask_prob={p} must be in (0, 1)")
  if max_predictions(p, seq_len) < 1:
    raise ValueError(f"objective.mask_prob={p} masks no token of a data.seq_len={seq_len} sequence (max_predictions "
                     "is 0): raise objective.mask_prob or data.seq_len")
