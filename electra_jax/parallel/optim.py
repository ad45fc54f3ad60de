"""The optimiser of pre-training and fine-tuning (train.optimizer): adamw, optax's AdamW with a linear warm-up and decay,
or official, the official ELECTRA code's (Adam without bias correction, its schedule; docs/fidelity.md); both decay
every weight but LayerNorm's and biases and clip the global norm, per array or over flat vectors of all weights
(train.flat_update; FlatLayout). Recipe (a train section, frozen) and build make it; layer-wise rates too."""
import dataclasses
import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "official")


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """adamw's: linear warm-up to `peak`, then linear decay to 0 at total_steps."""
  warmup_steps = max(1, min(warmup_steps, total_steps))
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps),
                               optax.linear_schedule(peak, 0.0, max(1, total_steps - warmup_steps))], [warmup_steps])


def official_schedule(peak: float, warmup_steps: float, total_steps: int, power: float = 1.0) -> optax.Schedule:
  """The official tf.train.polynomial_decay(peak, step, total_steps, 0, power) · min(1, step / warmup_steps) (0: no
  warm-up; warmup_steps unrounded, as total · warmup_proportion is there)."""
  decay = optax.polynomial_schedule(peak, 0.0, power, total_steps)

  def schedule(count):
    return decay(count) * (jnp.minimum(1.0, count / warmup_steps) if warmup_steps > 0 else 1.0)
  return schedule


def decay_mask(params):
  """True for weights that decay: every kernel and table, not LayerNorm parameters nor biases (the official split)."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {path: not (path[-1] in ("bias", "scale") or "LayerNorm" in path[-2]) for path in flat})


def scale_by_adam_uncorrected(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's m / (√v + ε) without bias correction (the official code's), in the state scale_by_adam keeps."""
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


class FlatLayout:
  """Where each weight array goes in the flat update: an array the mesh splits over fsdp into its rows of one
  [fsdp, n] matrix split the same way (row k: device k's shard), so no data moves; every other array into one vector
  (alone without fsdp, as optax.flatten's). sharding.create_state sets `fsdp` and `split` before the init."""

  def __init__(self):
    self.fsdp = 1  # the mesh's fsdp size: over 1, the arrays it splits go in the matrix
    self.split = None  # per weight array (tree order), the dimension split over fsdp or None

  def flatten(self, tree):
    """`tree`'s arrays as the vector, or (the matrix, the vector) where the layout splits some."""
    leaves = jax.tree.leaves(tree)
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
    boxed = any(map(is_box, jax.tree.leaves(tree, is_leaf=is_box)))
    if self.fsdp == 1:
      self.split = [None] * len(leaves)
    whole = jnp.concatenate([jnp.ravel(x) for x, d in zip(leaves, self.split) if d is None] or [jnp.zeros([0])])
    rows = [self._rows(x, d) for x, d in zip(leaves, self.split) if d is not None]
    if not rows:
      return whole
    matrix = jnp.concatenate(rows, axis=1)
    return (nn.LogicallyPartitioned(matrix, ("shards", None)) if boxed else matrix), whole

  def gradient(self, tree):
    """flatten(tree) behind a barrier, without which XLA splits a reduction of it into one per array."""
    return jax.lax.optimization_barrier(self.flatten(tree))

  def unflatten(self, flat, like):
    """`flat` (as flatten lays it out) as arrays of `like`'s shapes."""
    leaves, treedef = jax.tree.flatten(like)
    matrix, whole = flat if isinstance(flat, tuple) else (None, flat)
    out, at, column = [], 0, 0
    for x, d in zip(leaves, self.split):
      if d is None:
        out.append(whole[at:at + x.size].reshape(x.shape))
        at += x.size
      else:
        n = x.size // self.fsdp
        out.append(self._array(matrix[:, column:column + n], x.shape, d))
        column += n
    return jax.tree.unflatten(treedef, out)

  def _rows(self, x, d):
    """x, split along d, as [fsdp, x.size / fsdp]: row k device k's shard."""
    f = self.fsdp
    return jnp.moveaxis(x.reshape(x.shape[:d] + (f, x.shape[d] // f) + x.shape[d + 1:]), d, 0).reshape(f, -1)

  def _array(self, rows, shape, d):
    f = self.fsdp
    return jnp.moveaxis(rows.reshape((f,) + shape[:d] + (shape[d] // f,) + shape[d + 1:]), 0, d).reshape(shape)


def flatten(inner: optax.GradientTransformation, layout: FlatLayout) -> optax.GradientTransformation:
  """`inner` over the weights flattened by `layout` (optax.flatten, with the weights' split over devices kept)."""
  def init(params):
    return inner.init(layout.flatten(params))

  def update(updates, state, params=None):
    flat, state = inner.update(layout.gradient(updates), state, None if params is None else layout.flatten(params))
    return layout.unflatten(flat, updates), state
  return optax.GradientTransformation(init, update)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One run's optimiser, from its train section; with a `layer_decay`, layer-wise rates (lr_multiplier)."""
  optimizer: str
  learning_rate: float
  warmup_steps: float
  total_steps: int
  adam_b1: float
  adam_b2: float
  adam_eps: float
  weight_decay: float
  clip_norm: float
  flat_update: bool
  layer_decay: float | None = None
  num_layers: int = 0

  KEYS = ("optimizer", "learning_rate", "adam_b1", "adam_b2", "adam_eps", "weight_decay", "clip_norm", "flat_update")

  def __post_init__(self):
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"train.optimizer={self.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """A recipe built: the optax transformation, its learning-rate schedule and the flat layout (None: per array)."""
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  flat: FlatLayout | None

  def restart(self, opt_state, params):
    """opt_state with Adam's state (ScaleByAdamState) as at init, the rest (the schedule's count) as it was."""
    is_adam = lambda s: isinstance(s, optax.ScaleByAdamState)
    return jax.tree.map(lambda s, f: f if is_adam(s) else s, opt_state, self.tx.init(params), is_leaf=is_adam)


def build(recipe: Recipe, devices=None) -> Optimizer:
  """`recipe`'s optimiser on `devices` (default: this host's); sharding.create_state sets a flat update's layout."""
  if recipe.optimizer == "adamw":  # optax.adamw's chain, spelt out so the flat update can take its direction alone
    schedule = learning_rate_schedule(recipe.learning_rate, int(recipe.warmup_steps), recipe.total_steps)
    direction = optax.scale_by_adam(recipe.adam_b1, recipe.adam_b2, recipe.adam_eps)
  else:
    schedule = official_schedule(recipe.learning_rate, recipe.warmup_steps, recipe.total_steps)
    direction = scale_by_adam_uncorrected(recipe.adam_b1, recipe.adam_b2, recipe.adam_eps)
  clip = optax.clip_by_global_norm(recipe.clip_norm)
  decay_and_rate = (optax.add_decayed_weights(recipe.weight_decay, decay_mask), optax.scale_by_learning_rate(schedule))
  # Not on TPUs, where XLA fuses the per-array update well and the flat one's copies cost more (docs/tpu.md).
  on_tpu = (jax.devices() if devices is None else devices)[0].platform == "tpu"
  flat = FlatLayout() if recipe.flat_update and not on_tpu else None
  if flat:  # the decay and the rate per array, where they fuse with the weights' own update
    tx = optax.chain(flatten(optax.chain(clip, direction), flat), *decay_and_rate)
  else:
    tx = optax.chain(clip, optax.chain(direction, *decay_and_rate))
  if recipe.layer_decay is not None:
    tx = optax.chain(tx, layerwise_lr_decay(recipe.num_layers, recipe.layer_decay))
  return Optimizer(tx, schedule, flat)


def global_norm(grads, flat: FlatLayout | None) -> jax.Array:
  """The gradient's global norm (grad_norm) as the clipping takes it, so that XLA computes it once."""
  return optax.global_norm(flat.gradient(grads) if flat else grads)


def lr_multiplier(path, num_layers: int, decay: float) -> float:
  """Layer-wise LR decay as the official _get_layer_lrs: depth 0 for the embeddings (and their projection), i + 1
  for encoder layer i, L + 2 for the task head, and lr · decay^(L + 2 - depth): the embeddings decay^(L+2), layer i
  decay^(L+1-i), the head 1. The encoder is what sits under an `electra` module (fine-tuning's models)."""
  names = [getattr(k, "key", str(k)) for k in path]
  if "electra" not in names:
    return 1.0
  layer = [int(n[len("layer_"):]) for n in names if re.fullmatch(r"layer_\d+", n)]
  return decay ** (num_layers + 1 - layer[0] if layer else num_layers + 2)


def layerwise_lr_decay(num_layers: int, decay: float) -> optax.GradientTransformation:
  """Each update scaled by lr_multiplier: after the optimiser, a per-layer rate (weight decay included, as official)."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * lr_multiplier(p, num_layers, decay), updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
