"""The adapters over JAX's and gcsfs's private names work with the installed versions: an upgrade that moves one of
those names fails here, not in a multi-process run or an outage."""
import importlib
import subprocess
import sys

from electra_jax.runtime import gcsfs_private, jax_private
from tests import pretrain_cli

# One process of a one-process run: the coordination service's client, and each of its methods the package calls.
_CLIENT = """
import jax
from electra_jax.runtime import jax_private
jax.distributed.initialize("127.0.0.1:{port}", 1, 0)
client = jax_private.coordination_client()
client.key_value_set("adapter/k", "v", allow_overwrite=True)
assert dict(client.key_value_dir_get("adapter/")) == {{"adapter/k": "v"}}, client.key_value_dir_get("adapter/")
assert client.blocking_key_value_get("adapter/k", 1000) == "v"
assert set(jax_private.CLIENT_METHODS) <= set(dir(client))
print("ok")
"""


def test_the_jax_adapter_reaches_the_coordination_service():
  script = _CLIENT.format(port=pretrain_cli.free_port())
  result = subprocess.run([sys.executable, "-c", script], env=pretrain_cli.env(JAX_PLATFORMS="cpu"),
                          cwd=pretrain_cli.ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_every_gcsfs_name_the_adapter_uses_resolves():
  for module, path in gcsfs_private.NAMES:
    target = importlib.import_module(module)
    for attribute in path.split("."):
      target = getattr(target, attribute)  # an AttributeError names the name that moved
    assert callable(target), (module, path)


def test_the_gcsfs_patches_wrap_the_original_methods_once():
  from gcsfs.core import GCSFile, GCSFileSystem  # pylint: disable=g-import-not-at-top
  originals = {name: getattr(GCSFileSystem, name) for name in gcsfs_private._REQUESTS}  # pylint: disable=protected-access
  upload = GCSFile._upload_chunk  # pylint: disable=protected-access
  try:
    for _ in range(2):  # a second call wraps the originals again, not its own wrappers
      gcsfs_private.lengthen_retries(300)
      gcsfs_private.restart_lost_uploads()
    for name, method in originals.items():
      assert getattr(GCSFileSystem, name).__wrapped__ is getattr(method, "__wrapped__", method)
    assert GCSFile._upload_chunk.__wrapped__ is getattr(upload, "__wrapped__", upload)  # pylint: disable=protected-access
  finally:
    for name, method in originals.items():
      setattr(GCSFileSystem, name, method)
    GCSFile._upload_chunk = upload  # pylint: disable=protected-access
