"""The train state and its one sharded init: pre-training and fine-tuning both build theirs here, and jit their steps
over it with sharding.Sharded, so both get the same placement, donation and activation-sharding rules (update.py
holds the one update of it)."""
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import optax

from electra_jax.parallel import sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def create(init_params: Callable[[jax.Array], Any], tx: optax.GradientTransformation,
           mesh: jax.sharding.Mesh) -> sharding.Sharded:
  """`init_params(rng)` returns parameters boxed with logical axis names (a Flax module's init); every leaf of the
  state is placed per sharding.RULES."""
  def init_boxed(rng):
    params = init_params(rng)
    return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params, opt_state=tx.init(params))

  boxed = jax.eval_shape(init_boxed, jax.random.key(0))
  state_sharding = sharding.tree_shardings(boxed, mesh)
  init = sharding.placed_init(lambda rng: nn.meta.unbox(init_boxed(rng)), state_sharding, sharding.host_for(mesh))
  return sharding.Sharded(mesh, state_sharding, sharding.batch_sharding(mesh), sharding.replicated(mesh), init,
                          nn.meta.unbox(boxed))
