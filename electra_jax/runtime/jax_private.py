"""The one place that touches JAX's private names: the coordination service's client, whose key-value store no public
API exposes (peers, the workdir lock); tests/test_adapters.py uses every name here against the installed jax."""
from jax._src import distributed

CLIENT_METHODS = ("key_value_set", "key_value_dir_get", "blocking_key_value_get")


def coordination_client():
  """This process's client of the coordination service (None before jax.distributed.initialize)."""
  return distributed.global_state.client
