"""What ELECTRA trains on: dynamic masking, Gumbel sampling, corruption, labels, and the losses of ELECTRA and of the
paper's baselines and ablations (objective.name):

  electra         L_MLM(G) + λ·L_Disc(D), the discriminator loss over every non-pad token
  electra_15      as electra, but L_Disc only over the masked positions
  mlm             BERT: D-sized masked LM with the 80/10/10 recipe; no generator
  replace_mlm     G as in electra; D is a masked LM whose masked inputs are G's samples instead of [MASK]
  all_tokens_mlm  as replace_mlm, but D predicts every token, with the paper's copy mechanism
  two_stage       the paper's two-stage ELECTRA (Sec. 3.2): L_MLM(G) alone for the first two_stage_fraction of the
                  steps; then D starts as a copy of G and trains with λ·L_Disc on the samples of the frozen G
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from electra_jax import modeling
from electra_jax.special_ids import SpecialIds

OBJECTIVES = ("electra", "electra_15", "mlm", "replace_mlm", "all_tokens_mlm", "two_stage")
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


def sample(rng: jax.Array, logits: jax.Array, temperature: float) -> jax.Array:
  """One draw per row from softmax(logits / temperature), by inverse CDF: a single uniform per row instead of the
  Gumbel-argmax trick's noise per vocabulary entry (the same distribution; on CPU the Gumbel noise of a demo step
  cost more than the generator's head)."""
  cdf = jnp.cumsum(jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1), axis=-1)
  u = jax.random.uniform(rng, logits.shape[:-1] + (1,)) * cdf[..., -1:]  # scaled: the sum may round below 1
  return jnp.minimum((cdf <= u).sum(axis=-1), logits.shape[-1] - 1).astype(jnp.int32)


def _weighted_mean(x, w):
  return (x * w).sum() / (w.sum() + 1e-6)


def mlm_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Mean cross-entropy and accuracy over the weighted positions."""
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  correct = (jax.lax.top_k(logits, 1)[1][..., 0] == targets).astype(jnp.float32)
  return _weighted_mean(nll, weights), _weighted_mean(correct, weights)


def disc_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array):
  """Sigmoid cross-entropy over the weighted positions, its accuracy, and the counts for precision/recall."""
  labels_f = labels.astype(jnp.float32)
  nll = -(labels_f * jax.nn.log_sigmoid(logits) + (1 - labels_f) * jax.nn.log_sigmoid(-logits))
  predicted = logits > 0
  counts = dict(
      disc_true_positives=((predicted & labels) * weights).sum(),
      disc_predicted_positives=(predicted * weights).sum(),
      disc_label_positives=(labels * weights).sum(),
  )
  return _weighted_mean(nll, weights), _weighted_mean((predicted == labels).astype(jnp.float32), weights), counts


AUC_BINS = 2048  # histogram resolution of the ROC AUC: ties within a bin count half, as in the exact statistic


def auc_histogram(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """[2, AUC_BINS] weighted counts of original (row 0) and replaced (row 1) tokens by predicted probability: sums over
  batches, so evaluation accumulates it on device and `roc_auc` reads the area once."""
  bins = jnp.clip((jax.nn.sigmoid(logits) * AUC_BINS).astype(jnp.int32), 0, AUC_BINS - 1)
  rows = labels.astype(jnp.int32)
  return jnp.zeros((2, AUC_BINS), jnp.float32).at[rows.ravel(), bins.ravel()].add(weights.ravel())


def roc_auc(histogram) -> float:
  """The probability that a replaced token scores above an original one (ties half): the discriminator's ROC AUC."""
  negatives, positives = np.asarray(histogram, np.float64)
  below = np.cumsum(negatives) - negatives
  pairs = positives.sum() * negatives.sum()
  return float((positives * (below + 0.5 * negatives)).sum() / pairs) if pairs > 0 else float("nan")


def _corrupt(rng, masked: Masked, input_ids, g_logits, temperature):
  """Replace every chosen position of the ORIGINAL input by a generator sample. stop_gradient makes explicit that
  D's loss never reaches G (sampling is discrete anyway)."""
  sampled = sample(rng, jax.lax.stop_gradient(g_logits), temperature)
  return jax.lax.stop_gradient(scatter(input_ids, masked.positions, sampled, masked.weights))


def compute_loss(model: modeling.Electra, params, batch, rng: jax.Array, objective: ml_collections.ConfigDict,
                 special: SpecialIds, *, deterministic: bool = False, stage: int = 2):
  """The training loss of `objective.name` for one batch ({'input_ids', 'segment_ids'}: int32 [B, L]) and the
  metrics that come with it. Pure: all randomness derives from `rng`.

  `stage` (a Python int) matters to two_stage only: 1 is L_MLM(G) alone, without running D; 2 is λ·L_Disc alone, G
  sampling through stop_gradient (no backward pass through G) — evaluation uses 2, which reports both networks.
  Both stages return the same metric keys (0 where stage 1 computes nothing), so that lax.cond can pick one."""
  name = objective.name
  if name not in OBJECTIVES:
    raise ValueError(f"objective.name={name!r}: expected one of {', '.join(OBJECTIVES)}")
  ids, seg = batch["input_ids"], batch["segment_ids"]
  k_mask, k_sample, k_gen, k_disc = jax.random.split(rng, 4)
  v = {"params": params}
  vocab = model.config.vocab_size
  masked = mask_tokens(k_mask, ids, special, objective.mask_prob, vocab, bert_recipe=name == "mlm")
  non_pad = (ids != special.pad).astype(jnp.float32)
  metrics = {}

  if name == "mlm":
    logits = model.apply(v, masked.input_ids, seg, masked.positions, deterministic=deterministic,
                         rngs={"dropout": k_disc}, method=modeling.Electra.discriminator_mlm_logits)
    loss, metrics["mlm_accuracy"] = mlm_loss(logits, masked.targets, masked.weights)
    metrics["mlm_loss"] = loss
    return loss, metrics

  # G's forward reads only G's params, so stop_gradient on the whole tree freezes exactly G.
  g_vars = {"params": jax.lax.stop_gradient(params)} if name == "two_stage" and stage == 2 else v
  g_logits = model.apply(g_vars, masked.input_ids, seg, masked.positions, deterministic=deterministic,
                         rngs={"dropout": k_gen}, method=modeling.Electra.generator_logits)
  g_loss, metrics["mlm_accuracy"] = mlm_loss(g_logits, masked.targets, masked.weights)
  metrics["mlm_loss"] = g_loss
  if name == "two_stage" and stage == 1:  # stage 2's metric keys, traced for shapes only; D's are 0 here
    stage2 = jax.eval_shape(functools.partial(compute_loss, model, objective=objective, special=special),
                            params, batch, rng)[1]
    return g_loss, {k: jnp.zeros(s.shape, s.dtype) for k, s in stage2.items()} | metrics
  corrupted = _corrupt(k_sample, masked, ids, g_logits, objective.temperature)
  replaced = corrupted != ids  # a chosen position whose sample equals the original counts as real
  metrics["replaced_fraction"] = _weighted_mean(replaced.astype(jnp.float32), non_pad)
  d_kwargs = dict(deterministic=deterministic, rngs={"dropout": k_disc})

  if name in ("electra", "electra_15", "two_stage"):
    d_logits = model.apply(v, corrupted, seg, method=modeling.Electra.discriminator_logits, **d_kwargs)
    if name == "electra_15":  # only the chosen positions
      d_weights = scatter(jnp.zeros_like(ids), masked.positions, jnp.ones_like(masked.positions),
                          masked.weights).astype(jnp.float32)
    else:
      d_weights = non_pad
    d_loss, metrics["disc_accuracy"], counts = disc_loss(d_logits, replaced, d_weights)
    metrics.update(counts)
    if deterministic:  # evaluation: the ROC AUC's histogram (training steps skip its scatter)
      metrics["disc_auc_histogram"] = auc_histogram(d_logits, replaced, d_weights)
  elif name == "replace_mlm":
    d_logits = model.apply(v, corrupted, seg, masked.positions, method=modeling.Electra.discriminator_mlm_logits,
                           **d_kwargs)
    d_loss, metrics["disc_accuracy"] = mlm_loss(d_logits, masked.targets, masked.weights)
  else:  # all_tokens_mlm: p(x_t) = σ(c_t)·[x_t = x̂_t] + (1 − σ(c_t))·softmax(D(x̂)_t)[x_t] at every non-pad token
    d_logits, copy_logits = model.apply(v, corrupted, seg, None, copy=True,
                                        method=modeling.Electra.discriminator_mlm_logits, **d_kwargs)
    logp = jnp.take_along_axis(jax.nn.log_softmax(d_logits), ids[..., None], axis=-1)[..., 0]
    log_copy = jnp.where(corrupted == ids, jax.nn.log_sigmoid(copy_logits), -jnp.inf)
    nll = -jnp.logaddexp(log_copy, jax.nn.log_sigmoid(-copy_logits) + logp)
    d_loss = _weighted_mean(nll, non_pad)
    correct = (jax.lax.top_k(d_logits, 1)[1][..., 0] == ids).astype(jnp.float32)
    metrics["disc_accuracy"] = _weighted_mean(correct, non_pad)

  metrics["disc_loss"] = d_loss
  # λ balances the per-token binary loss against the MLM loss; the MLM ablations add two MLM losses unweighted.
  if name == "two_stage":  # stage 2: G is frozen, so its loss is only reported
    return objective.disc_weight * d_loss, metrics
  weight = objective.disc_weight if name in ("electra", "electra_15") else 1.0
  return g_loss + weight * d_loss, metrics


def two_stage_switch_step(config: ml_collections.ConfigDict) -> int:
  """two_stage: the step (counting from 0) that starts stage 2, after a config check. D starts as a copy of G, so
  both need the same sizes and their own weights."""
  o, f = config.objective, config.model.generator_fraction
  if f != 1.0:
    raise ValueError(f"objective.name=two_stage initialises D from G, so it needs model.generator_fraction=1.0 "
                     f"(got {f})")
  if o.embedding_sharing != "untied":
    raise ValueError(f"objective.name=two_stage needs separate G and D weights: objective.embedding_sharing=untied "
                     f"(got {o.embedding_sharing!r})")
  if not 0 < o.two_stage_fraction < 1:
    raise ValueError(f"objective.two_stage_fraction={o.two_stage_fraction} must be in (0, 1)")
  return max(1, round(o.two_stage_fraction * config.train.num_steps))


def discriminator_from_generator(params):
  """params with D's embeddings and encoder replaced by G's: how two_stage's stage 2 begins. D's replaced-token head
  has no counterpart in G and keeps its own weights."""
  return dict(params, discriminator_embeddings=params["generator_embeddings"], discriminator=params["generator"])


def freeze_untrained(new_params, old_params, stage2: jax.Array):
  """new_params, except that the network the current stage does not train (D in stage 1, G in stage 2) keeps
  old_params bitwise: AdamW's momentum and weight decay would move it even with zero gradients."""
  def keep(name, new, old):
    frozen = stage2 == name.startswith("generator")
    return jax.tree.map(lambda n, o: jnp.where(frozen, o, n), new, old)
  return {k: keep(k, v, old_params[k]) for k, v in new_params.items()}
