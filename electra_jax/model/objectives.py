"""The losses of ELECTRA and of the paper's baselines and ablations (docs/pretraining_features.md, "Objectives"), made
of losses.py's pieces. OBJECTIVES holds one entry per objective.name (its loss, the parameters it initialises, its
step's FLOPs); ObjectiveConfig is the objective section as the step reads it."""
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import losses, masking, modeling, sampling, two_stage


def electra_loss(b: losses.Batch, *, masked_only: bool = False):
  """L_MLM(G) + λ·L_Disc(D), D's loss over every non-pad token (or only the masked positions: ELECTRA 15%)."""
  g_loss, out, g_logits = losses.generator_mlm(b)
  corrupted, replaced, more = losses.corrupt(b, g_logits)
  weights = b.non_pad
  if masked_only:
    weights = masking.scatter(jnp.zeros_like(b.input_ids), b.masked.positions, jnp.ones_like(b.masked.positions),
                              b.masked.weights).astype(jnp.float32)
  d_loss, d_out = losses.replaced_token_detection(b, corrupted, replaced, weights)
  return g_loss + b.objective.disc_weight * d_loss, out | more | d_out


def mlm_loss_bert(b: losses.Batch):
  """BERT: the discriminator-sized network as a masked LM on the 80/10/10-masked input."""
  logits = b.apply(modeling.Electra.discriminator_mlm_logits, b.masked.input_ids, b.segment_ids, b.masked.positions,
                   key="discriminator")
  loss, accuracy = losses.mlm_loss(logits, b.masked.targets, b.masked.weights)
  return loss, dict(mlm_loss=loss, mlm_accuracy=accuracy)


def replace_mlm_loss(b: losses.Batch):
  """G as in ELECTRA; D a masked LM on G's samples instead of [MASK]. Two MLM losses, unweighted."""
  g_loss, out, g_logits = losses.generator_mlm(b)
  corrupted, _, more = losses.corrupt(b, g_logits)
  logits = b.apply(modeling.Electra.discriminator_mlm_logits, corrupted, b.segment_ids, b.masked.positions,
                   key="discriminator")
  d_loss, accuracy = losses.mlm_loss(logits, b.masked.targets, b.masked.weights)
  return g_loss + d_loss, out | more | dict(disc_loss=d_loss, disc_accuracy=accuracy)


def all_tokens_mlm_loss(b: losses.Batch):
  """As Replace MLM, but D predicts every token with the paper's copy mechanism:
  p(x_t) = σ(c_t)·[x_t = x̂_t] + (1 − σ(c_t))·softmax(D(x̂)_t)[x_t] at every non-pad token."""
  g_loss, out, g_logits = losses.generator_mlm(b)
  corrupted, _, more = losses.corrupt(b, g_logits)
  logits, copy_logits = b.apply(modeling.Electra.discriminator_mlm_logits, corrupted, b.segment_ids, None, copy=True,
                                key="discriminator")
  ids = b.input_ids
  logp = losses.target_logit(logits, ids) - jax.nn.logsumexp(logits, axis=-1)
  log_copy = jnp.where(corrupted == ids, jax.nn.log_sigmoid(copy_logits), -jnp.inf)
  d_loss = losses.weighted_mean(-jnp.logaddexp(log_copy, jax.nn.log_sigmoid(-copy_logits) + logp), b.non_pad)
  accuracy = losses.weighted_mean(losses.top1_correct(logits, ids), b.non_pad)
  return g_loss + d_loss, out | more | dict(disc_loss=d_loss, disc_accuracy=accuracy)


def uniform_replacement_loss(b: losses.Batch):
  """λ·L_Disc(D) on uniform replacements (special ids keep the token): the paper's generator-size study's floor."""
  drawn = sampling.per_row(jax.random.randint, b.keys["sample"], b.masked.positions.shape, b.rows, minval=0,
                          maxval=b.model.config.vocab_size)
  originals = jnp.take_along_axis(b.input_ids, b.masked.positions, axis=1)
  drawn = jnp.where(jnp.isin(drawn, jnp.asarray(b.special)), originals, drawn)
  corrupted = masking.scatter(b.input_ids, b.masked.positions, drawn, b.masked.weights)
  replaced = corrupted != b.input_ids
  d_loss, out = losses.replaced_token_detection(b, corrupted, replaced, b.non_pad)
  return b.objective.disc_weight * d_loss, out | dict(
      replaced_fraction=losses.weighted_mean(replaced.astype(jnp.float32), b.non_pad))


# What init runs, so that it creates exactly the parameters an objective trains (objective=mlm carries no generator).
def _init_replaced_token_detection(m: modeling.Electra, ids, seg, positions):
  return m.generator_logits(ids, seg, positions), m.discriminator_logits(ids, seg)


@dataclasses.dataclass(frozen=True)
class Objective:
  loss: Callable  # (Batch, [stage=1 or 2: two_stage's]) -> (loss, metrics)
  init: Callable  # (module, input_ids, segment_ids, positions): the forward passes whose parameters it trains
  flops: Callable[..., float]  # (flops.Costs) -> one training step's FLOPs, from its pieces
  bert_masking: bool = False  # mask 80/10/10 (BERT) instead of ELECTRA's 85/15


OBJECTIVES = {
    "electra": Objective(electra_loss, _init_replaced_token_detection,
                         lambda c: c.generator + c.discriminator + c.rtd_head),
    "electra_15": Objective(functools.partial(electra_loss, masked_only=True), _init_replaced_token_detection,
                            lambda c: c.generator + c.discriminator + c.rtd_head),
    "mlm": Objective(mlm_loss_bert, lambda m, ids, seg, pos: m.discriminator_mlm_logits(ids, seg, pos),
                     lambda c: c.discriminator + c.d_mlm_masked, bert_masking=True),
    "replace_mlm": Objective(replace_mlm_loss, lambda m, ids, seg, pos: (
                                 m.generator_logits(ids, seg, pos), m.discriminator_mlm_logits(ids, seg, pos)),
                             lambda c: c.generator + c.discriminator + c.d_mlm_masked),
    "all_tokens_mlm": Objective(all_tokens_mlm_loss, lambda m, ids, seg, pos: (
                                    m.generator_logits(ids, seg, pos), m.discriminator_mlm_logits(ids, seg, copy=True)),
                                lambda c: c.generator + c.discriminator + c.d_mlm_all),
    # The run's mean step: f of G's training, then 1 − f of G's forward (a third of its training) and D's training.
    "two_stage": Objective(two_stage.loss, _init_replaced_token_detection,
                           lambda c: c.stage_fraction * c.generator + (1 - c.stage_fraction) * (
                               c.generator / 3 + c.discriminator + c.rtd_head)),
    "uniform_replacement": Objective(uniform_replacement_loss,
                                     lambda m, ids, seg, pos: m.discriminator_logits(ids, seg),
                                     lambda c: c.discriminator + c.rtd_head),
}


def get(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise ValueError(f"objective.name={name!r}: expected one of {', '.join(OBJECTIVES)}")
  return OBJECTIVES[name]


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """The objective section as the step reads it, checked; for two_stage the step that starts stage 2 (switch_step)."""
  name: str
  mask_prob: float
  disc_weight: float
  temperature: float
  two_stage_fraction: float
  whole_word_masking: bool = False
  switch_step: int = 0

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "ObjectiveConfig":
    o = config.objective
    get(o.name)
    switch = 0
    if o.name == "two_stage":  # D starts as a copy of G, so both need the same sizes and their own weights
      if config.model.generator_fraction != 1.0:
        raise ValueError(f"objective.name=two_stage initialises D from G, so it needs model.generator_fraction=1.0 "
                         f"(got {config.model.generator_fraction})")
      if o.embedding_sharing != "untied":
        raise ValueError("objective.name=two_stage needs separate G and D weights: objective.embedding_sharing=untied "
                         f"(got {o.embedding_sharing!r})")
      if not 0 < o.two_stage_fraction < 1:
        raise ValueError(f"objective.two_stage_fraction={o.two_stage_fraction} must be in (0, 1)")
      switch = max(1, round(o.two_stage_fraction * config.train.num_steps))
    return cls(o.name, o.mask_prob, o.disc_weight, o.temperature, o.two_stage_fraction, o.whole_word_masking, switch)


def compute_loss(model: modeling.Electra, params, batch, rng: jax.Array, objective: ObjectiveConfig,
                 special: SpecialIds, word_starts=None, *, rows: jax.Array | None = None, deterministic: bool = False,
                 **loss_args):
  """The loss of `objective.name` for one batch ({'input_ids', 'segment_ids'}: int32 [B, L]) and its metrics, all
  randomness from `rng`, keyed per row on `rows` (each row's index in the global batch, so that micro-batches draw as
  the whole batch). `word_starts`: the tokenizer's; `loss_args` go to the objective's loss (two_stage's stage)."""
  entry = get(objective.name)
  ids = batch["input_ids"]
  rows = jnp.arange(ids.shape[0]) if rows is None else rows
  k_mask, k_sample, k_gen, k_disc = sampling.keys(rng, (4,))
  # Dropout draws a whole (micro-)batch's mask from one key: each micro-batch folds in its first row to differ.
  k_gen, k_disc = (jax.random.fold_in(k, rows[0]) for k in (k_gen, k_disc))
  mask = (functools.partial(masking.mask_words, word_starts=word_starts) if objective.whole_word_masking
          else masking.mask_tokens)
  masked = mask(k_mask, ids, special, objective.mask_prob, model.config.vocab_size, bert_recipe=entry.bert_masking,
                rows=rows)
  b = losses.Batch(model, params, ids, batch["segment_ids"], special, masked, (ids != special.pad).astype(jnp.float32),
                   dict(sample=k_sample, generator=k_gen, discriminator=k_disc), rows, deterministic, objective)
  return entry.loss(b, **loss_args)


def init_params(model: modeling.Electra, objective: str, seq_len: int, rng: jax.Array):
  """The boxed parameters `objective` (an objective.name) trains, at sequence length `seq_len`."""
  ids = jnp.ones((1, seq_len), jnp.int32)
  return model.init(rng, ids, jnp.zeros_like(ids), jnp.zeros((1, 1), jnp.int32), method=get(objective).init)["params"]
