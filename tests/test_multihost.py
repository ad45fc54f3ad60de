"""Two processes x 4 CPU devices (jax.distributed over a loopback coordinator, gloo collectives) train to the same
parameters as one process x 8 devices: per-host input, global arrays and multi-host Orbax saves all agree. The two
processes write to a gs:// workdir on a local fake-gcs-server (conftest's gcs_bucket)."""
import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from electra_jax import storage, weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cmd(config, workdir):
  return [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
          f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}", "--config.train.num_steps=6",
          "--config.train.log_every=3", "--config.train.eval_every=6", "--config.train.checkpoint_every=6"]


def _env(devices, **extra):
  env = dict(os.environ, XLA_FLAGS=os.environ["XLA_FLAGS"].replace("device_count=8", f"device_count={devices}"))
  env.update({k: str(v) for k, v in extra.items()})
  return env


def test_two_processes_match_one(tiny_data, gcs_bucket, tmp_path, monkeypatch):
  config, _ = tiny_data
  host, bucket = gcs_bucket
  multi = f"gs://{bucket.name}/multihost/multi"
  single = subprocess.run(_cmd(config, tmp_path / "single"), cwd=ROOT, env=_env(8), capture_output=True, text=True,
                          timeout=600, check=False)
  assert single.returncode == 0, single.stderr[-3000:]

  coordinator = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen(_cmd(config, multi), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(4, JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i,
                                     STORAGE_EMULATOR_HOST=host, ELECTRA_JAX_CACHE=tmp_path / f"cache{i}"))
           for i in range(2)]
  try:
    outs = [p.communicate(timeout=600) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]

  params1 = weights.load(str(tmp_path / "single")).params
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
  storage.initialize()
  params2 = weights.load(multi).params
  for a, b in zip(jax.tree.leaves(params1), jax.tree.leaves(params2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
  texts = ((tmp_path / "single" / "metrics.jsonl").read_text(),
           bucket.blob("multihost/multi/metrics.jsonl").download_as_text())
  logged = [[json.loads(l)["loss"] for l in text.splitlines()] for text in texts]
  np.testing.assert_allclose(logged[0], logged[1], rtol=1e-5)  # only process 0 wrote, once per logged step
