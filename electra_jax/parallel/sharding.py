"""The device mesh and every sharding of a run, declared once: RULES maps modeling.py's logical axis names onto the
mesh axes (the batch over both, weights over "fsdp", ZeRO-3 style; activations where a step is traced). A dimension
the mesh does not divide stays replicated, so odd vocabularies never break a mesh."""
import contextlib
import dataclasses
import functools
from typing import Any, Callable

import jax
import flax.linen as nn
from absl import logging
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from electra_jax.parallel import optim
from electra_jax.parallel.state import TrainState

MESH_AXES = ("data", "fsdp")
BATCH = ("data", "fsdp")


RULES = (
    ("batch", BATCH),
    ("vocab", "fsdp"), ("hidden", "fsdp"),  # weights
    ("embed", None), ("mlp", None), ("qkv", None), ("length", None), ("act_embed", None), ("act_hidden", None),
    ("shards", "fsdp"),  # the flat update's matrix of weight shards, a row per fsdp device (optim.FlatLayout)
)


def mesh_shape(data: int, fsdp: int, num_devices: int) -> tuple[int, int]:
  """mesh.* as (data, fsdp) sizes over `num_devices`; -1 takes every device the other axis leaves."""
  if data == -1 and fsdp == -1:
    raise ValueError("mesh data=-1 and fsdp=-1: at most one of them can take the devices the other leaves")
  rows = data if data != -1 else num_devices // max(fsdp, 1)
  cols = fsdp if fsdp != -1 else num_devices // max(rows, 1)
  if rows * cols != num_devices or min(rows, cols) < 1:
    raise ValueError(f"mesh data={data} x fsdp={fsdp} does not match the {num_devices} devices "
                     "(set mesh.data=-1 or mesh.fsdp=-1 to use all devices the other axis leaves)")
  return rows, cols


def create_mesh(data: int, fsdp: int, devices=None) -> Mesh:
  """A (data, fsdp) mesh (mesh_shape) over `devices`, default this host's."""
  devices = jax.devices() if devices is None else devices
  # Auto axes: stock Flax layers rely on sharding propagation, not explicit-sharding types.
  return jax.make_mesh(mesh_shape(data, fsdp, len(devices)), MESH_AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def check_batch(global_batch: int, mesh: Mesh, micro_batches: int = 1):
  """The global batch must split over the devices and processes, into `micro_batches` that split over the devices."""
  n = mesh.shape["data"] * mesh.shape["fsdp"]
  if global_batch % n or global_batch % jax.process_count():
    raise ValueError(f"train.batch_size={global_batch} is not divisible by the {n} data-parallel devices "
                     f"and {jax.process_count()} processes")
  k = micro_batches
  if k < 1 or global_batch % k or global_batch // k % n:
    raise ValueError(f"train.grad_accum_steps={k} must be >= 1 and divide train.batch_size={global_batch} into "
                     f"micro-batches that split over the {n} data-parallel devices")


def _fit(spec: P, shape, mesh: Mesh) -> P:
  """Drop mesh axes from dimensions they do not divide."""
  axes = []
  for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axis,) if isinstance(axis, str) else (axis or ())
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    axes.append(axis if dim % size == 0 else None)
  return P(*axes)


def tree_shardings(abstract_boxed_tree, mesh: Mesh, log: bool = True):
  """NamedShardings for a tree boxed with logical axis names; logs (`log`) the dimensions the mesh does not divide."""
  wanted = nn.logical_to_mesh(nn.get_partition_spec(abstract_boxed_tree), RULES)
  undivided = []

  def fit(path, spec, x):
    fitted, name = _fit(spec, x.shape, mesh), jax.tree_util.keystr(path)
    if tuple(fitted) != tuple(spec) + (None,) * (len(fitted) - len(spec)) and "opt_state" not in name:
      undivided.append(f"{name} {tuple(x.shape)}")
    return NamedSharding(mesh, fitted)

  shardings = jax.tree_util.tree_map_with_path(fit, wanted, nn.meta.unbox(abstract_boxed_tree),
                                               is_leaf=lambda s: isinstance(s, P))
  if undivided and log:
    logging.info("Replicated where the %s mesh does not divide a dimension: %s", dict(mesh.shape),
                 "; ".join(undivided))
  return shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


@contextlib.contextmanager
def activation_rules(mesh: jax.sharding.Mesh):
  """While a step is traced: the mesh and rules that make modeling.py's nn.with_logical_constraint real."""
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(RULES):
    yield


@dataclasses.dataclass(frozen=True)
class Sharded:
  """A TrainState's shardings on one mesh, its jitted init, and the one jit of a step over it."""
  mesh: jax.sharding.Mesh
  state: Any  # NamedShardings, one per leaf of the TrainState
  batch: jax.sharding.NamedSharding
  replicated: jax.sharding.NamedSharding
  init: Callable[[jax.Array], Any]  # rng -> the TrainState, placed
  shapes: Any  # the TrainState's ShapeDtypeStructs

  def jit_step(self, fn: Callable) -> Callable:
    """fn(state, batch, rng) -> (state, metrics), jitted once: the state donated, metrics replicated."""
    return jax.jit(self._with_rules(fn), in_shardings=(self.state, self.batch, self.replicated),
                   out_shardings=(self.state, self.replicated), donate_argnums=(0,))

  def jit_steps(self, fn: Callable, k: int) -> tuple[Callable, NamedSharding]:
    """fn jitted as jit_step, `k` steps a call over k stacked batches (lax.scan), with its batch's sharding."""
    if k == 1:
      return self.jit_step(fn), self.batch
    stacked = NamedSharding(self.mesh, P(None, *self.batch.spec))

    def steps(state, batches, rng):
      return jax.lax.scan(lambda state, batch: fn(state, batch, rng), state, batches, length=k)
    return dataclasses.replace(self, batch=stacked).jit_step(steps), stacked

  def jit_eval(self, fn: Callable) -> Callable:
    """fn(params, batch, rng) -> replicated outputs."""
    return jax.jit(self._with_rules(fn), in_shardings=(self.state.params, self.batch, self.replicated),
                   out_shardings=self.replicated)

  def _with_rules(self, fn):
    @functools.wraps(fn)
    def traced(*args):
      with activation_rules(self.mesh):
        return fn(*args)
    return traced

  def abstract(self):
    """The state as ShapeDtypeStructs carrying its shardings: what a checkpoint is restored onto (this mesh)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.shapes, self.state)


def create_state(init_params: Callable[[jax.Array], Any], optimizer: optim.Optimizer, mesh: Mesh) -> Sharded:
  """The TrainState of `init_params(rng)` (a Flax init's boxed parameters) and `optimizer` on `mesh`, per RULES."""
  if optimizer.flat and mesh.shape["fsdp"] > 1:  # set before the optimiser state's shapes are traced
    shardings = jax.tree.leaves(tree_shardings(jax.eval_shape(init_params, jax.random.key(0)), mesh, log=False))
    optimizer.flat.fsdp = mesh.shape["fsdp"]
    optimizer.flat.split = [tuple(s.spec).index("fsdp") if "fsdp" in s.spec else None for s in shardings]

  def init_boxed(rng):
    params = init_params(rng)
    return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params, opt_state=optimizer.tx.init(params))

  boxed = jax.eval_shape(init_boxed, jax.random.key(0))
  state_sharding = tree_shardings(boxed, mesh)
  init = placed_init(lambda rng: nn.meta.unbox(init_boxed(rng)), state_sharding, host_for(mesh))
  return Sharded(mesh, state_sharding, batch_sharding(mesh), replicated(mesh), init, nn.meta.unbox(boxed))


def placed_init(init: Callable[[jax.Array], Any], shardings, host: jax.Device | None = None) -> Callable:
  """`init(rng)` jitted, placed per `shardings`: computed on the devices, or on `host` (same random bits) and copied."""
  if host is None:
    return jax.jit(init, out_shardings=shardings)
  on_host = jax.jit(init, out_shardings=jax.sharding.SingleDeviceSharding(host))

  def init_via_host(rng):
    values = jax.device_get(on_host(jax.device_put(rng, host)))
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]), values,
                        shardings)
  return init_via_host


def host_for(mesh: jax.sharding.Mesh) -> jax.Device | None:
  """A GPU mesh's state is initialised on this host's CPU, which compiles it far faster (docs/benchmarks.md)."""
  if mesh.devices.flat[0].platform != "gpu":
    return None
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu
    return None


def to_host(tree):
  """Every array of `tree` as numpy, its global value on every process (a collective: every process calls it)."""
  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)
