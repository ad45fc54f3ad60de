"""The pieces every objective's loss is made of: what a loss reads (Batch), G's masked-LM loss, corruption by G's
samples, D's replaced-token loss, and their metrics (top-1 accuracy, precision/recall counts, ROC AUC)."""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import masking, modeling, sampling


class Batch(NamedTuple):
  """What every objective's loss reads: the model and its parameters, one batch, and its masking."""
  model: modeling.Electra
  params: dict
  input_ids: jax.Array  # [B, L] the original tokens
  segment_ids: jax.Array
  special: SpecialIds
  masked: masking.Masked
  non_pad: jax.Array  # [B, L] 1.0 at real tokens
  keys: dict  # "sample", "generator", "discriminator": the step's randomness, split once
  rows: jax.Array  # [B] each row's index in the global batch: what its random draws are keyed on (sampling.per_row)
  deterministic: bool
  objective: Any  # objectives.ObjectiveConfig

  def apply(self, method, *args, key: str, params=None, **kwargs):
    return self.model.apply({"params": self.params if params is None else params}, *args,
                            deterministic=self.deterministic, rngs={"dropout": self.keys[key]}, method=method,
                            **kwargs)


# Metrics that are sums over tokens, not means: batches (and micro-batches) add them up.
SUMMED_METRICS = ("disc_true_positives", "disc_predicted_positives", "disc_label_positives", "disc_auc_histogram")


def weighted_mean(x, w):
  return (x * w).sum() / (w.sum() + 1e-6)


def mlm_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Mean cross-entropy and accuracy over the weighted positions."""
  nll = jax.nn.logsumexp(logits, axis=-1) - target_logit(logits, targets)
  return weighted_mean(nll, weights), weighted_mean(top1_correct(logits, targets), weights)


def target_logit(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """logits[..., targets] as a masked sum: its gradient is a fused select, where take_along_axis's is a scatter."""
  return jnp.where(jnp.arange(logits.shape[-1]) == targets[..., None], logits, 0.0).sum(axis=-1)


def top1_correct(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """1.0 where the first maximum of `logits` is at `targets` (argmax's pick), else 0.0, as two fused reductions; the
  maxima before the target summed as floats, so a TPU reads the logits in the loss's pass (docs/tpu.md)."""
  logits = jax.lax.stop_gradient(logits)
  top = logits.max(axis=-1, keepdims=True)
  earlier_ties = jnp.where((logits == top) & (jnp.arange(logits.shape[-1]) < targets[..., None]), 1.0, 0.0).sum(-1)
  return ((target_logit(logits, targets) == top[..., 0]) & (earlier_ties == 0)).astype(jnp.float32)


def disc_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array):
  """Sigmoid cross-entropy over the weighted positions, its accuracy, and the counts for precision/recall."""
  labels_f = labels.astype(jnp.float32)
  nll = -(labels_f * jax.nn.log_sigmoid(logits) + (1 - labels_f) * jax.nn.log_sigmoid(-logits))
  predicted = logits > 0
  counts = dict(disc_true_positives=((predicted & labels) * weights).sum(),
                disc_predicted_positives=(predicted * weights).sum(), disc_label_positives=(labels * weights).sum())
  return weighted_mean(nll, weights), weighted_mean((predicted == labels).astype(jnp.float32), weights), counts


AUC_BINS = 2048  # histogram resolution of the ROC AUC: ties within a bin count half, as in the exact statistic


def auc_histogram(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """[2, AUC_BINS] weighted counts of original (row 0) and replaced (row 1) tokens by predicted probability."""
  bins = jnp.clip((jax.nn.sigmoid(logits) * AUC_BINS).astype(jnp.int32), 0, AUC_BINS - 1)
  rows = labels.astype(jnp.int32)
  return jnp.zeros((2, AUC_BINS), jnp.float32).at[rows.ravel(), bins.ravel()].add(weights.ravel())


def roc_auc(histogram) -> float:
  """The probability that a replaced token scores above an original one (ties half): the discriminator's ROC AUC."""
  negatives, positives = np.asarray(histogram, np.float64)
  below = np.cumsum(negatives) - negatives
  pairs = positives.sum() * negatives.sum()
  return float((positives * (below + 0.5 * negatives)).sum() / pairs) if pairs > 0 else float("nan")


def generator_mlm(b: Batch, params=None):
  """G's MLM loss, its metrics and its logits at the masked positions."""
  logits = b.apply(modeling.Electra.generator_logits, b.masked.input_ids, b.segment_ids, b.masked.positions,
                   key="generator", params=params)
  loss, accuracy = mlm_loss(logits, b.masked.targets, b.masked.weights)
  return loss, dict(mlm_loss=loss, mlm_accuracy=accuracy), logits


def corrupt(b: Batch, g_logits):
  """The input with G's samples at the masked positions, and which tokens differ; D's loss never reaches G."""
  sampled = sampling.sample(b.keys["sample"], jax.lax.stop_gradient(g_logits), b.objective.temperature, rows=b.rows)
  corrupted = jax.lax.stop_gradient(masking.scatter(b.input_ids, b.masked.positions, sampled, b.masked.weights))
  replaced = corrupted != b.input_ids
  return corrupted, replaced, dict(replaced_fraction=weighted_mean(replaced.astype(jnp.float32), b.non_pad))


def replaced_token_detection(b: Batch, corrupted, replaced, weights):
  """D's sigmoid loss over `weights`' positions and its metrics (the ROC AUC's histogram in evaluation only)."""
  logits = b.apply(modeling.Electra.discriminator_logits, corrupted, b.segment_ids, key="discriminator")
  loss, accuracy, counts = disc_loss(logits, replaced, weights)
  out = dict(counts, disc_loss=loss, disc_accuracy=accuracy)
  if b.deterministic:
    out["disc_auc_histogram"] = auc_histogram(logits, replaced, weights)
  return loss, out

