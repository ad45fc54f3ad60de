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
  init = placed_init(lambda rng: nn.meta.unbox(init_boxed(rng)), state_sharding, _host_for(mesh))
  return sharding.Sharded(mesh, state_sharding, sharding.batch_sharding(mesh), sharding.replicated(mesh), init,
                          nn.meta.unbox(boxed))


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


def _host_for(mesh: jax.sharding.Mesh) -> jax.Device | None:
  """Where a GPU mesh's state is initialised: this host's CPU. XLA's GPU compiler turns an initialisation's
  thousands of small random-number fusions into as many kernels, about a minute of a fresh run's start-up; its CPU
  compiler builds the same program in seconds. Elsewhere (TPU, CPU) on the devices themselves."""
  if mesh.devices.flat[0].platform != "gpu":
    return None
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu
    return None
