"""The device mesh and every sharding of a run, declared once.

Parameters carry logical axis names (modeling.py); RULES maps them onto the mesh axes ("data", "fsdp"). The batch is
split over both axes; weights are split over "fsdp" (ZeRO-3 style: XLA gathers them where a layer needs them). A
dimension that does not divide evenly stays replicated (logged once), so odd vocabularies never break a mesh.
Activations are constrained by the same rules ("act_*" names) where a step is traced (Sharded.jit_step).
"""
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
    ("vocab", "fsdp"),
    ("hidden", "fsdp"),
    ("embed", None),
    ("mlp", None),
    ("qkv", None),
    ("length", None),
    ("act_embed", None),
    ("act_hidden", None),
    ("shards", "fsdp"),  # the flat update's matrix of weight shards, a row per fsdp device (optim.FlatLayout)
)


def mesh_shape(data: int, fsdp: int, num_devices: int) -> tuple[int, int]:
  """mesh.* as (data, fsdp) sizes over `num_devices`: data=-1 takes every device fsdp leaves, fsdp=-1 every device
  data leaves (one slice's or node's devices, with data set to the number of slices or nodes)."""
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
  shape = mesh_shape(data, fsdp, len(devices))
  # Auto axes: stock Flax layers rely on sharding propagation, not explicit-sharding types.
  return jax.make_mesh(shape, MESH_AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def check_batch(global_batch: int, mesh: Mesh, micro_batches: int = 1):
  """The global batch must split over the data-parallel devices and the processes, and cut into `micro_batches`
  equal micro-batches (update.gradients) that still split over the devices."""
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


def tree_specs(boxed_tree, mesh: Mesh):
  """PartitionSpecs on `mesh` for a tree whose arrays are boxed with logical axis names (from a Flax init or
  jax.eval_shape), with the mesh axes that do not divide a dimension dropped; and the unboxed tree."""
  specs = nn.logical_to_mesh(nn.get_partition_spec(boxed_tree), RULES)
  shapes = nn.meta.unbox(boxed_tree)
  return jax.tree.map(lambda spec, x: _fit(spec, x.shape, mesh), specs, shapes,
                      is_leaf=lambda s: isinstance(s, P)), shapes


def tree_shardings(abstract_boxed_tree, mesh: Mesh):
  """NamedShardings for a tree whose parameters are boxed with logical axis names (from jax.eval_shape). Logs, once,
  every array that stays replicated along a dimension its rule would split because the mesh does not divide it."""
  wanted = nn.logical_to_mesh(nn.get_partition_spec(abstract_boxed_tree), RULES)
  undivided = []

  def fit(path, spec, x):
    fitted, name = _fit(spec, x.shape, mesh), jax.tree_util.keystr(path)
    if tuple(fitted) != tuple(spec) + (None,) * (len(fitted) - len(spec)) and "opt_state" not in name:
      undivided.append(f"{name} {tuple(x.shape)}")
    return NamedSharding(mesh, fitted)

  shardings = jax.tree_util.tree_map_with_path(fit, wanted, nn.meta.unbox(abstract_boxed_tree),
                                               is_leaf=lambda s: isinstance(s, P))
  if undivided:
    logging.info("Replicated where the %s mesh does not divide a dimension: %s", dict(mesh.shape),
                 "; ".join(undivided))
  return shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


@contextlib.contextmanager
def activation_rules(mesh: jax.sharding.Mesh):
  """While a step is traced: the mesh and the logical-axis rules that make modeling.py's activation constraints
  (nn.with_logical_constraint) real sharding constraints; outside them Flax returns activations unconstrained."""
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(RULES):
    yield


@dataclasses.dataclass(frozen=True)
class Sharded:
  """A TrainState's shardings on one mesh, its jitted init (create_state), and the one jit of a step over it: the
  same placement, donation and activation-sharding rules for pre-training and fine-tuning."""
  mesh: jax.sharding.Mesh
  state: Any  # NamedShardings, one per leaf of the TrainState
  batch: jax.sharding.NamedSharding
  replicated: jax.sharding.NamedSharding
  init: Callable[[jax.Array], Any]  # rng -> the TrainState, placed
  shapes: Any  # the TrainState's ShapeDtypeStructs

  def jit_step(self, fn: Callable) -> Callable:
    """fn(state, batch, rng) -> (state, metrics), jitted once: the state donated and kept in place, metrics
    replicated."""
    return jax.jit(self._with_rules(fn), in_shardings=(self.state, self.batch, self.replicated),
                   out_shardings=(self.state, self.replicated), donate_argnums=(0,))

  def jit_steps(self, fn: Callable, k: int) -> tuple[Callable, NamedSharding]:
    """fn jitted as jit_step does, `k` steps a call: a lax.scan over k batches stacked on a leading axis (each split
    as `batch` splits one), each step's metrics stacked. The same steps as k calls (a step folds its number into the
    rng), in one dispatch: the host's work a call is shared by k steps. Returns it and its batch's sharding."""
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
  """The TrainState of pre-training or fine-tuning on `mesh`. `init_params(rng)` returns parameters boxed with logical
  axis names (a Flax module's init); every leaf of the state is placed per RULES, and the flat update's weights
  (optimizer.flat) are laid out as the mesh splits them."""
  if optimizer.flat and mesh.shape["fsdp"] > 1:  # set before the optimiser state's shapes are traced
    params = jax.eval_shape(init_params, jax.random.key(0))
    specs = jax.tree.leaves(tree_specs(params, mesh)[0], is_leaf=lambda s: isinstance(s, P))
    optimizer.flat.fsdp = mesh.shape["fsdp"]
    optimizer.flat.split = [tuple(spec).index("fsdp") if "fsdp" in spec else None for spec in specs]

  def init_boxed(rng):
    params = init_params(rng)
    return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params, opt_state=optimizer.tx.init(params))

  boxed = jax.eval_shape(init_boxed, jax.random.key(0))
  state_sharding = tree_shardings(boxed, mesh)
  init = placed_init(lambda rng: nn.meta.unbox(init_boxed(rng)), state_sharding, host_for(mesh))
  return Sharded(mesh, state_sharding, batch_sharding(mesh), replicated(mesh), init, nn.meta.unbox(boxed))


def placed_init(init: Callable[[jax.Array], Any], shardings, host: jax.Device | None = None) -> Callable:
  """`init(rng)` jitted, its outputs placed per `shardings`: computed on the devices themselves, or, given a `host`
  device, computed there and copied to them (from the same random bits: on the same backend, the same values)."""
  if host is None:
    return jax.jit(init, out_shardings=shardings)
  on_host = jax.jit(init, out_shardings=jax.sharding.SingleDeviceSharding(host))

  def init_via_host(rng):
    values = jax.device_get(on_host(jax.device_put(rng, host)))
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]), values,
                        shardings)
  return init_via_host


def host_for(mesh: jax.sharding.Mesh) -> jax.Device | None:
  """Where a GPU mesh's state is initialised: this host's CPU, whose compiler builds an initialisation's thousands of
  small random-number fusions in seconds where XLA:GPU's takes about a minute (docs/benchmarks.md). Elsewhere
  (TPU, CPU) on the devices themselves."""
  if mesh.devices.flat[0].platform != "gpu":
    return None
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu
    return None


def to_host(tree):
  """Every array of `tree` as a numpy array of its global value, on every process. An array split across processes
  is gathered from them: a collective, so every process must call this with the same tree."""
  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)
