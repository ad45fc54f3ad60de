"""The train state, and the one place a step is sharded and jitted: pre-training and fine-tuning both build theirs
here, so both get the same placement, donation and activation-sharding rules."""
import contextlib
import dataclasses
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import optax

from electra_jax import sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@contextlib.contextmanager
def activation_rules(mesh: jax.sharding.Mesh):
  """While a step is traced: the mesh and the logical-axis rules that make modeling.py's activation constraints
  (nn.with_logical_constraint) real sharding constraints; outside them Flax returns activations unconstrained."""
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(sharding.RULES):
    yield


@dataclasses.dataclass(frozen=True)
class Sharded:
  """A TrainState's shardings on one mesh, its jitted init, and the jit of functions over it."""
  mesh: jax.sharding.Mesh
  state: Any  # NamedShardings, one per leaf of the TrainState
  batch: jax.sharding.NamedSharding
  replicated: jax.sharding.NamedSharding
  init: Callable[[jax.Array], TrainState]  # rng -> the state, placed

  def jit_step(self, fn: Callable) -> Callable:
    """fn(state, batch, rng) -> (state, metrics), jitted once: the state donated and kept in place, metrics
    replicated."""
    return jax.jit(self._with_rules(fn), in_shardings=(self.state, self.batch, self.replicated),
                   out_shardings=(self.state, self.replicated), donate_argnums=(0,))

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
    """The state as ShapeDtypeStructs carrying its shardings: what a checkpoint is restored onto."""
    return abstract(jax.eval_shape(self.init, jax.random.key(0)), self.state)


def create(init_params: Callable[[jax.Array], Any], tx: optax.GradientTransformation,
           mesh: jax.sharding.Mesh) -> Sharded:
  """`init_params(rng)` returns parameters boxed with logical axis names (a Flax module's init); every leaf of the
  state is placed per sharding.RULES."""
  def init_boxed(rng):
    params = init_params(rng)
    return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params, opt_state=tx.init(params))

  state_sharding = sharding.tree_shardings(jax.eval_shape(init_boxed, jax.random.key(0)), mesh)
  init = jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=state_sharding)
  return Sharded(mesh, state_sharding, sharding.batch_sharding(mesh), sharding.replicated(mesh), init)


def abstract(tree, shardings):
  """ShapeDtypeStructs carrying the target shardings: what Orbax restores onto (the current mesh)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
