"""The train state, its one sharded init and its one update: pre-training and fine-tuning both build theirs here, and
jit their steps over it with sharding.Sharded, so both get the same placement, donation and activation-sharding rules,
and the same guard against a non-finite update."""
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from electra_jax.parallel import optim, sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def apply_gradients(state: TrainState, loss: jax.Array, grads, tx: optax.GradientTransformation,
                    flat: optim.FlatLayout | None) -> tuple[TrainState, dict]:
  """`state` after one optax update by `grads` (of `loss`; `flat`: the flat update's, optim.py), applied only where
  the loss and the gradient's global norm are finite: otherwise the step keeps the parameters and optimiser state as
  they were and only counts (optax's apply_if_finite, over the whole state). The test is two scalars the update
  computes anyway (clipping takes the norm first), so the choice fuses into the update's own kernels; weights an
  update makes non-finite are the loop's to catch before a save (loop.Guard). Returns the state and the metrics
  loss, grad_norm and skipped (1 for a step not applied; the loop counts them in a row)."""
  grad_norm = optim.global_norm(grads, flat)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  kept = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
  new = TrainState(step=state.step + 1, params=kept(params, state.params), opt_state=kept(opt_state, state.opt_state))
  return new, dict(loss=loss, grad_norm=grad_norm, skipped=(~ok).astype(jnp.float32))


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
