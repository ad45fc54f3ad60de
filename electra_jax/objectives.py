"""What ELECTRA trains on: dynamic masking, sampling, corruption, labels, and the losses of ELECTRA and of the paper's
baselines and ablations. OBJECTIVES holds one entry per objective.name: its loss, the parameters it initialises and
the FLOPs of its step; adding an objective is an entry here (and a test).

  electra         L_MLM(G) + λ·L_Disc(D), the discriminator loss over every non-pad token
  electra_15      as electra, but L_Disc only over the masked positions
  mlm             BERT: D-sized masked LM with the 80/10/10 recipe; no generator
  replace_mlm     G as in electra; D is a masked LM whose masked inputs are G's samples instead of [MASK]
  all_tokens_mlm  as replace_mlm, but D predicts every token, with the paper's copy mechanism
  two_stage       the paper's two-stage ELECTRA (Sec. 3.2): L_MLM(G) alone for the first two_stage_fraction of the
                  steps; then D starts as a copy of G and trains with λ·L_Disc on the samples of the frozen G
  uniform_replacement  λ·L_Disc(D) on tokens drawn uniformly from the vocabulary: no generator
"""
import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from electra_jax import metrics, modeling
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


SAMPLE_BLOCK = 128  # vocabulary entries per block of the two-level inverse CDF (about sqrt(V) for V ~ 16k)


def _sample_block(vocab: int) -> int:
  """The divisor of `vocab` in [64, 256] nearest SAMPLE_BLOCK (no slice of the logits is then copied: 125 for the
  demo's 8000), or SAMPLE_BLOCK when there is none (30522: a shorter last block)."""
  divisors = [b for b in range(64, 257) if vocab % b == 0]
  return min(divisors, key=lambda b: abs(b - SAMPLE_BLOCK)) if divisors else SAMPLE_BLOCK


def _cumsum(x: jax.Array) -> jax.Array:
  """Cumulative sum over the last (short) axis as a matmul with a triangular matrix: XLA:CPU's scan for cumsum is
  several times slower."""
  upper = jnp.triu(jnp.ones((x.shape[-1],) * 2, x.dtype))  # upper[k, i] = 1 for k <= i
  return jnp.einsum("...k,ki->...i", x, upper, precision=jax.lax.Precision.HIGHEST)


def sample(rng: jax.Array, logits: jax.Array, temperature: float, block: int = 0) -> jax.Array:
  """One draw per row from softmax(logits / temperature), by inverse CDF: a single uniform per row instead of the
  Gumbel-argmax trick's noise per vocabulary entry (the same distribution; on CPU the Gumbel noise of a demo step
  cost more than the generator's head).

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
  u = jax.random.uniform(rng, logits.shape[:-1] + (1,)) * cdf[..., -1:]  # scaled: the total is unnormalised
  j = jnp.minimum((cdf <= u).sum(axis=-1), sums.shape[-1] - 1)  # the block holding u
  start = jnp.take_along_axis(cdf - sums, j[..., None], axis=-1)  # the weight of the blocks before it
  # Gather the block's logits, not its weights: XLA would recompute the whole row's exp for each gathered element.
  within = jnp.take_along_axis(main, jnp.minimum(j, nb - 1)[..., None, None], axis=-2)[..., 0, :] if nb else tail
  if rest and nb:
    within = jnp.where((j == nb)[..., None], tail, within)
  i = jnp.minimum((start + _cumsum(jnp.exp(within - top)) <= u).sum(axis=-1), block - 1)
  return jnp.minimum(j * block + i, vocab - 1).astype(jnp.int32)


def _weighted_mean(x, w):
  return (x * w).sum() / (w.sum() + 1e-6)


def mlm_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Mean cross-entropy and accuracy over the weighted positions."""
  nll = jax.nn.logsumexp(logits, axis=-1) - _target_logit(logits, targets)
  return _weighted_mean(nll, weights), _weighted_mean(top1_correct(logits, targets), weights)


def _target_logit(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """logits[..., targets] as a masked sum: its gradient is a fused select, where take_along_axis's is a scatter over
  the vocabulary (on XLA:CPU, log_softmax + take_along_axis with its gradient took ~4x as long at [32, 19, 8000])."""
  return jnp.where(jnp.arange(logits.shape[-1]) == targets[..., None], logits, 0.0).sum(axis=-1)


def top1_correct(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """1.0 where the first maximum of `logits` is at `targets` (what top_k(logits, 1) and argmax pick), else 0.0: two
  fused reductions, where XLA:CPU's TopK and argmax are slow over a vocabulary."""
  logits = jax.lax.stop_gradient(logits)
  top = logits.max(axis=-1, keepdims=True)
  earlier_tie = ((logits == top) & (jnp.arange(logits.shape[-1]) < targets[..., None])).any(axis=-1)
  return ((_target_logit(logits, targets) == top[..., 0]) & ~earlier_tie).astype(jnp.float32)


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


class Batch(NamedTuple):
  """What every objective's loss reads: the model and its parameters, one batch, and its masking."""
  model: modeling.Electra
  params: dict
  input_ids: jax.Array  # [B, L] the original tokens
  segment_ids: jax.Array
  special: SpecialIds
  masked: Masked
  non_pad: jax.Array  # [B, L] 1.0 at real tokens
  keys: dict  # "sample", "generator", "discriminator": the step's randomness, split once
  deterministic: bool
  objective: ml_collections.ConfigDict

  def apply(self, method, *args, key: str, params=None, **kwargs):
    return self.model.apply({"params": self.params if params is None else params}, *args,
                            deterministic=self.deterministic, rngs={"dropout": self.keys[key]}, method=method,
                            **kwargs)


def _generator(b: Batch, params=None):
  """G's MLM loss, its metrics and its logits at the masked positions."""
  logits = b.apply(modeling.Electra.generator_logits, b.masked.input_ids, b.segment_ids, b.masked.positions,
                   key="generator", params=params)
  loss, accuracy = mlm_loss(logits, b.masked.targets, b.masked.weights)
  return loss, dict(mlm_loss=loss, mlm_accuracy=accuracy), logits


def _corrupt(b: Batch, g_logits):
  """The ORIGINAL input with every masked position replaced by a generator sample, and which tokens differ (a sample
  equal to the original counts as real). stop_gradient makes explicit that D's loss never reaches G (sampling is
  discrete anyway)."""
  sampled = sample(b.keys["sample"], jax.lax.stop_gradient(g_logits), b.objective.temperature)
  corrupted = jax.lax.stop_gradient(scatter(b.input_ids, b.masked.positions, sampled, b.masked.weights))
  replaced = corrupted != b.input_ids
  return corrupted, replaced, dict(replaced_fraction=_weighted_mean(replaced.astype(jnp.float32), b.non_pad))


def _replaced_token_detection(b: Batch, corrupted, replaced, weights):
  """D's sigmoid loss over `weights`' positions and its metrics (the ROC AUC's histogram in evaluation only: training
  steps skip its scatter)."""
  logits = b.apply(modeling.Electra.discriminator_logits, corrupted, b.segment_ids, key="discriminator")
  loss, accuracy, counts = disc_loss(logits, replaced, weights)
  out = dict(counts, disc_loss=loss, disc_accuracy=accuracy)
  if b.deterministic:
    out["disc_auc_histogram"] = auc_histogram(logits, replaced, weights)
  return loss, out


def electra_loss(b: Batch, *, masked_only: bool = False):
  """L_MLM(G) + λ·L_Disc(D), D's loss over every non-pad token (or only the masked positions: ELECTRA 15%)."""
  g_loss, out, g_logits = _generator(b)
  corrupted, replaced, more = _corrupt(b, g_logits)
  weights = b.non_pad
  if masked_only:
    weights = scatter(jnp.zeros_like(b.input_ids), b.masked.positions, jnp.ones_like(b.masked.positions),
                      b.masked.weights).astype(jnp.float32)
  d_loss, d_out = _replaced_token_detection(b, corrupted, replaced, weights)
  return g_loss + b.objective.disc_weight * d_loss, out | more | d_out


def mlm_loss_bert(b: Batch):
  """BERT: the discriminator-sized network as a masked LM on the 80/10/10-masked input."""
  logits = b.apply(modeling.Electra.discriminator_mlm_logits, b.masked.input_ids, b.segment_ids, b.masked.positions,
                   key="discriminator")
  loss, accuracy = mlm_loss(logits, b.masked.targets, b.masked.weights)
  return loss, dict(mlm_loss=loss, mlm_accuracy=accuracy)


def replace_mlm_loss(b: Batch):
  """G as in ELECTRA; D a masked LM whose masked inputs are G's samples instead of [MASK]. Two MLM losses,
  unweighted."""
  g_loss, out, g_logits = _generator(b)
  corrupted, _, more = _corrupt(b, g_logits)
  logits = b.apply(modeling.Electra.discriminator_mlm_logits, corrupted, b.segment_ids, b.masked.positions,
                   key="discriminator")
  d_loss, accuracy = mlm_loss(logits, b.masked.targets, b.masked.weights)
  return g_loss + d_loss, out | more | dict(disc_loss=d_loss, disc_accuracy=accuracy)


def all_tokens_mlm_loss(b: Batch):
  """As Replace MLM, but D predicts every token with the paper's copy mechanism:
  p(x_t) = σ(c_t)·[x_t = x̂_t] + (1 − σ(c_t))·softmax(D(x̂)_t)[x_t] at every non-pad token."""
  g_loss, out, g_logits = _generator(b)
  corrupted, _, more = _corrupt(b, g_logits)
  logits, copy_logits = b.apply(modeling.Electra.discriminator_mlm_logits, corrupted, b.segment_ids, None, copy=True,
                                key="discriminator")
  ids = b.input_ids
  logp = _target_logit(logits, ids) - jax.nn.logsumexp(logits, axis=-1)
  log_copy = jnp.where(corrupted == ids, jax.nn.log_sigmoid(copy_logits), -jnp.inf)
  d_loss = _weighted_mean(-jnp.logaddexp(log_copy, jax.nn.log_sigmoid(-copy_logits) + logp), b.non_pad)
  return g_loss + d_loss, out | more | dict(disc_loss=d_loss,
                                            disc_accuracy=_weighted_mean(top1_correct(logits, ids), b.non_pad))


def two_stage_loss(b: Batch, *, stage: int = 2):
  """Stage 1: L_MLM(G) alone, without running D. Stage 2: λ·L_Disc alone, G sampling through stop_gradient (no
  backward pass through G; its loss only reported). Evaluation uses 2, which reports both networks. Both stages
  return the same metric keys (0 where stage 1 computes nothing), so that lax.cond can pick one."""
  if stage == 1:
    g_loss, out, _ = _generator(b)
    stage2 = jax.eval_shape(lambda: two_stage_loss(b))[1]  # stage 2's metric keys, traced for shapes only
    return g_loss, {k: jnp.zeros(v.shape, v.dtype) for k, v in stage2.items()} | out
  # G's forward reads only G's params, so stop_gradient on the whole tree freezes exactly G.
  _, out, g_logits = _generator(b, params=jax.lax.stop_gradient(b.params))
  corrupted, replaced, more = _corrupt(b, g_logits)
  d_loss, d_out = _replaced_token_detection(b, corrupted, replaced, b.non_pad)
  return b.objective.disc_weight * d_loss, out | more | d_out


def uniform_replacement_loss(b: Batch):
  """λ·L_Disc(D) alone, on replacements drawn uniformly from the vocabulary (special ids leave the token as it was):
  replaced-token detection without a generator, the floor of the paper's generator-size study."""
  drawn = jax.random.randint(b.keys["sample"], b.masked.positions.shape, 0, b.model.config.vocab_size)
  originals = jnp.take_along_axis(b.input_ids, b.masked.positions, axis=1)
  drawn = jnp.where(jnp.isin(drawn, jnp.asarray(b.special)), originals, drawn)
  corrupted = scatter(b.input_ids, b.masked.positions, drawn, b.masked.weights)
  replaced = corrupted != b.input_ids
  d_loss, out = _replaced_token_detection(b, corrupted, replaced, b.non_pad)
  return b.objective.disc_weight * d_loss, out | dict(
      replaced_fraction=_weighted_mean(replaced.astype(jnp.float32), b.non_pad))


def _init_discriminator(m: modeling.Electra, ids, seg, positions):
  del positions
  return m.discriminator_logits(ids, seg)


# What init runs, so that it creates exactly the parameters an objective trains (objective=mlm carries no generator).
def _init_replaced_token_detection(m: modeling.Electra, ids, seg, positions):
  return m.generator_logits(ids, seg, positions), m.discriminator_logits(ids, seg)


def _init_bert(m: modeling.Electra, ids, seg, positions):
  return m.discriminator_mlm_logits(ids, seg, positions)


def _init_replace_mlm(m: modeling.Electra, ids, seg, positions):
  return m.generator_logits(ids, seg, positions), m.discriminator_mlm_logits(ids, seg, positions)


def _init_all_tokens_mlm(m: modeling.Electra, ids, seg, positions):
  return m.generator_logits(ids, seg, positions), m.discriminator_mlm_logits(ids, seg, None, copy=True)


class Costs(NamedTuple):
  """FLOPs of the pieces of one training step (metrics.py's accounting) that objectives add up."""
  generator: float  # G's encoder and MLM head at the masked positions, trained
  discriminator: float  # D's encoder
  rtd_head: float  # D's replaced-token head over every token
  d_mlm_masked: float  # D's MLM head at the masked positions
  d_mlm_all: float  # D's MLM head at every position, and the copy gate
  stage_fraction: float  # two_stage_fraction


@dataclasses.dataclass(frozen=True)
class Objective:
  loss: Callable  # (Batch) -> (loss, metrics)
  init: Callable  # (module, input_ids, segment_ids, positions): the forward passes whose parameters it trains
  flops: Callable[[Costs], float]  # one training step's FLOPs from its pieces
  bert_masking: bool = False  # mask 80/10/10 (BERT) instead of ELECTRA's 85/15
  staged: bool = False  # two_stage: a different loss before and after two_stage_switch_step


OBJECTIVES = {
    "electra": Objective(electra_loss, _init_replaced_token_detection,
                         lambda c: c.generator + c.discriminator + c.rtd_head),
    "electra_15": Objective(functools.partial(electra_loss, masked_only=True), _init_replaced_token_detection,
                            lambda c: c.generator + c.discriminator + c.rtd_head),
    "mlm": Objective(mlm_loss_bert, _init_bert, lambda c: c.discriminator + c.d_mlm_masked, bert_masking=True),
    "replace_mlm": Objective(replace_mlm_loss, _init_replace_mlm,
                             lambda c: c.generator + c.discriminator + c.d_mlm_masked),
    "all_tokens_mlm": Objective(all_tokens_mlm_loss, _init_all_tokens_mlm,
                                lambda c: c.generator + c.discriminator + c.d_mlm_all),
    # The run's mean step: f of G's training, then 1 − f of G's forward (a third of its training) and D's training.
    "two_stage": Objective(two_stage_loss, _init_replaced_token_detection,
                           lambda c: c.stage_fraction * c.generator + (1 - c.stage_fraction) * (
                               c.generator / 3 + c.discriminator + c.rtd_head), staged=True),
    "uniform_replacement": Objective(uniform_replacement_loss, _init_discriminator,
                                     lambda c: c.discriminator + c.rtd_head),
}


def get(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise ValueError(f"objective.name={name!r}: expected one of {', '.join(OBJECTIVES)}")
  return OBJECTIVES[name]


def compute_loss(model: modeling.Electra, params, batch, rng: jax.Array, objective: ml_collections.ConfigDict,
                 special: SpecialIds, *, deterministic: bool = False, stage: int = 2):
  """The training loss of `objective.name` for one batch ({'input_ids', 'segment_ids'}: int32 [B, L]) and the
  metrics that come with it. Pure: all randomness derives from `rng`. `stage` matters to two_stage only."""
  entry = get(objective.name)
  ids = batch["input_ids"]
  k_mask, k_sample, k_gen, k_disc = jax.random.split(rng, 4)
  masked = mask_tokens(k_mask, ids, special, objective.mask_prob, model.config.vocab_size,
                       bert_recipe=entry.bert_masking)
  b = Batch(model, params, ids, batch["segment_ids"], special, masked, (ids != special.pad).astype(jnp.float32),
            dict(sample=k_sample, generator=k_gen, discriminator=k_disc), deterministic, objective)
  return entry.loss(b, stage=stage) if entry.staged else entry.loss(b)


def check_masking(config: ml_collections.ConfigDict):
  """objective.mask_prob must mask something, and not everything (that leaves the generator no context), at seq_len."""
  p, seq_len = config.objective.mask_prob, config.data.seq_len
  if not 0 < p < 1:
    raise ValueError(f"objective.mask_prob={p} must be in (0, 1)")
  if max_predictions(p, seq_len) < 1:
    raise ValueError(f"objective.mask_prob={p} masks no token of a data.seq_len={seq_len} sequence (max_predictions "
                     "is 0): raise objective.mask_prob or data.seq_len")


def init_params(model: modeling.Electra, config: ml_collections.ConfigDict, rng: jax.Array):
  """The boxed parameters `config.objective.name` trains, at the config's sequence length."""
  check_masking(config)  # before the positions' shape is built from it
  seq_len = config.data.seq_len
  ids = jnp.ones((1, seq_len), jnp.int32)
  positions = jnp.zeros((1, max_predictions(config.objective.mask_prob, seq_len)), jnp.int32)
  return model.init(rng, ids, jnp.zeros_like(ids), positions, method=get(config.objective.name).init)["params"]


def step_flops(config: ml_collections.ConfigDict, two_stage_fraction: float | None = None) -> float:
  """FLOPs of one training step of the config's objective at its global batch × seq_len (two_stage: the run's mean;
  `two_stage_fraction` 1 gives stage 1's step, 0 stage 2's)."""
  mc = modeling.ModelConfig.from_config(config)
  d, g = mc.discriminator, mc.generator
  batch, seq_len = config.train.batch_size, config.data.seq_len
  masked = batch * max_predictions(config.objective.mask_prob, seq_len)
  f = config.objective.two_stage_fraction if two_stage_fraction is None else two_stage_fraction
  costs = Costs(
      generator=metrics.encoder_flops(mc, g, batch, seq_len) + metrics.mlm_head_flops(mc, g.hidden_size, masked),
      discriminator=metrics.encoder_flops(mc, d, batch, seq_len),
      rtd_head=6 * (d.hidden_size ** 2 + d.hidden_size) * batch * seq_len,
      d_mlm_masked=metrics.mlm_head_flops(mc, d.hidden_size, masked),
      d_mlm_all=metrics.mlm_head_flops(mc, d.hidden_size, batch * seq_len) + 6 * d.hidden_size ** 2 * batch * seq_len,
      stage_fraction=f)
  return get(config.objective.name).flops(costs)


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
