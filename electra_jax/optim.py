"""The optimiser recipe of the paper: AdamW (β=(0.9, 0.999), ε=1e-6), decoupled weight decay 0.01 except on
LayerNorm and biases, global-norm clipping at 1.0, linear warm-up then linear decay to 0.

We use optax's standard pieces: bias-corrected Adam and a warm-up that hands over to the decay (the official code
multiplies an overlapping warm-up and decay and has no bias correction; the difference matters only in the first
few thousand steps).
"""
import flax
import ml_collections
import optax


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  warmup_steps = max(1, min(warmup_steps, total_steps))
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup_steps),
       optax.linear_schedule(peak, 0.0, max(1, total_steps - warmup_steps))],
      [warmup_steps])


def decay_mask(params):
  """True for weights that decay: every kernel and embedding table, not LayerNorm parameters nor biases."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {path: not (path[-1] in ("bias", "scale") or "LayerNorm" in path[-2]) for path in flat})


def adamw(schedule: optax.Schedule, train: ml_collections.ConfigDict, mask=decay_mask) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(train.clip_norm),
      optax.adamw(schedule, b1=train.adam_b1, b2=train.adam_b2, eps=train.adam_eps,
                  weight_decay=train.weight_decay, mask=mask),
  )


def create(train: ml_collections.ConfigDict):
  """The pre-training optimiser and its schedule (the schedule is also logged)."""
  schedule = learning_rate_schedule(train.learning_rate, train.warmup_steps, train.num_steps)
  return adamw(schedule, train), schedule
