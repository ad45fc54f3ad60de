"""The console's filter keeps the project's own log lines wherever in the package they are written."""
import os

from electra_jax.runtime import console
from electra_jax.pretrain import __main__ as pretrain_main


def test_every_layer_of_the_package_speaks_at_the_default_verbosity():
  for path in (pretrain_main.__file__, console.__file__, os.path.join(console.OWN_DIRS[1], "demo.py")):
    assert console.own(path), path
  assert not console.own(os.__file__)
