"""The one place that touches JAX's private names: the coordination service's client, whose key-value store no public
API exposes (peers.py's heartbeats, the workdir lock's agreement across processes). tests/test_adapters.py uses every
name here against the installed jax, so an upgrade that moves one fails there rather than in a multi-process run."""
from jax._src import distributed

# The client's methods the package calls.
CLIENT_METHODS = ("key_value_set", "key_value_dir_get", "blocking_key_value_get")


def coordination_client():
  """This process's client of the coordination service (None before jax.distributed.initialize)."""
  return distributed.global_state.client
