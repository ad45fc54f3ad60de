"""The optimiser of pre-training and fine-tuning, one of two recipes (train.optimizer), both Adam (β=(0.9, 0.999),
ε=1e-6) with decoupled weight decay 0.01 except on LayerNorm and biases and global-norm clipping at 1.0:

  adamw     optax's AdamW: bias-corrected Adam, a linear warm-up that hands over to a linear decay to 0;
  official  the official ELECTRA code's (model/optimization.py): Adam without bias correction
            (AdamWeightDecayOptimizer) and lr = peak · min(1, step / warmup) · (1 - step / total)^1, the warm-up
            factor multiplying a decay that starts at step 0.

The two differ mostly in the first few thousand steps: without bias correction Adam's first steps are larger (m is
small, √v smaller still), and the overlapping factors put the official peak slightly below `peak`.

Either can run clipping and Adam over one flat vector of all weights (train.flat_update, where the mesh does not split
the weights, on GPUs and CPUs; optax.flatten): the gradient's global norm is one reduction and Adam's moments a few
kernels over all weights, not a few per weight array (an encoder has hundreds); on a GPU, where each kernel costs a
launch, that is most of the update's time. The moments are then two flat vectors in the checkpoint, a layout of its own
(checkpoints.py names the switch when they differ).
"""
import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

OPTIMIZERS = ("adamw", "official")


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """adamw's: linear warm-up to `peak`, then linear decay to 0 at total_steps."""
  warmup_steps = max(1, min(warmup_steps, total_steps))
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup_steps),
       optax.linear_schedule(peak, 0.0, max(1, total_steps - warmup_steps))],
      [warmup_steps])


def official_schedule(peak: float, warmup_steps: float, total_steps: int, power: float = 1.0) -> optax.Schedule:
  """The official one: tf.train.polynomial_decay(peak, step, total_steps, 0, power) times min(1, step / warmup_steps)
  (warmup_steps unrounded, as total · warmup_proportion is there; 0: no warm-up)."""
  decay = optax.polynomial_schedule(peak, 0.0, power, total_steps)

  def schedule(count):
    return decay(count) * (jnp.minimum(1.0, count / warmup_steps) if warmup_steps > 0 else 1.0)
  return schedule


def decay_mask(params):
  """True for weights that decay: every kernel and embedding table, not LayerNorm parameters nor biases (the
  official code excludes names matching LayerNorm|layer_norm|bias; ours are HF's names, the same split)."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {path: not (path[-1] in ("bias", "scale") or "LayerNorm" in path[-2]) for path in flat})


def scale_by_adam_uncorrected(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's direction m / (√v + ε) without bias correction, as the official AdamWeightDecayOptimizer (optax's
  scale_by_adam always corrects). Its state is optax's ScaleByAdamState, so that two_stage's Adam restart finds it."""
  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    return (jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu),
            optax.ScaleByAdamState(count=state.count + 1, mu=mu, nu=nu))
  return optax.GradientTransformation(init, update)


def flat_update(wanted: bool, mesh: jax.sharding.Mesh) -> bool:
  """Whether the update runs flat: as train.flat_update (`wanted`) asks, where every device holds the whole weights
  (mesh.fsdp 1; a flat vector cannot follow the weights' split over fsdp), and not on TPUs, where XLA fuses the
  per-array update well and the flat one's copies cost more (by the v3-8 cost model, Small's data-parallel step takes
  8.9 ms flat against 7.4 per array: docs/tpu.md)."""
  return bool(wanted) and mesh.shape["fsdp"] == 1 and mesh.devices.flat[0].platform != "tpu"


def build(train: ml_collections.ConfigDict, warmup_steps: float, total_steps: int, mask=decay_mask,
          flat: bool = False):
  """(optimiser, learning-rate schedule) of train.optimizer's recipe over total_steps; over one flat vector if
  `flat` (flat_update)."""
  # .get: config.json of workdirs from before the key was added lacks it.
  name = train.get("optimizer", "adamw")
  if name not in OPTIMIZERS:
    raise ValueError(f"train.optimizer={name!r}: expected one of {', '.join(OPTIMIZERS)}")
  if name == "adamw":  # optax.adamw's chain, spelt out so the flat update can take its direction alone
    schedule = learning_rate_schedule(train.learning_rate, int(warmup_steps), total_steps)
    direction = optax.scale_by_adam(train.adam_b1, train.adam_b2, train.adam_eps)
  else:
    schedule = official_schedule(train.learning_rate, warmup_steps, total_steps)
    direction = scale_by_adam_uncorrected(train.adam_b1, train.adam_b2, train.adam_eps)
  clip = optax.clip_by_global_norm(train.clip_norm)
  decay_and_rate = (optax.add_decayed_weights(train.weight_decay, mask), optax.scale_by_learning_rate(schedule))
  if flat:  # the decay and the rate per array, where they fuse with the weights' own update
    return optax.chain(optax.flatten(optax.chain(clip, direction)), *decay_and_rate), schedule
  return optax.chain(clip, optax.chain(direction, *decay_and_rate)), schedule


def global_norm(grads, flat: bool) -> jax.Array:
  """The gradient's global norm (the steps' grad_norm), as the update takes it: with the flat update, of the one
  vector it concatenates (the same concatenation, which XLA computes once), in one reduction. The barrier keeps that
  vector whole: XLA would split a reduction over a concatenation back into one per array, hundreds of small kernels
  (a quarter of the Small step's fusions on a CPU)."""
  if not flat:
    return optax.global_norm(grads)
  return jnp.linalg.norm(jax.lax.optimization_barrier(jnp.concatenate([jnp.ravel(g) for g in jax.tree.leaves(grads)])))


def pretraining(train: ml_collections.ConfigDict, flat: bool = False):
  """The pre-training optimiser and its schedule (the schedule is also logged)."""
  return build(train, train.warmup_steps, train.num_steps, flat=flat)
