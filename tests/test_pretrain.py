"""electra-pretrain end to end on real (tiny) data: the loss falls and metrics.jsonl has every documented field."""
import json
import os
import subprocess
import sys

from electra_jax import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pretrain_tiny_end_to_end(tiny_data, tmp_path):
  config, _ = tiny_data
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
         f"--config.data.data_dir={config.data.data_dir}", f"--workdir={workdir}",
         "--config.train.num_steps=60", "--config.train.log_every=10", "--config.train.eval_every=30"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  records = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(10, 61, 10))
  for r in records:
    missing = [f for f in metrics.TRAIN_FIELDS if r.get(f) is None and f != "mfu"]  # no MFU on a CPU
    assert not missing, f"step {r['step']} lacks {missing}"
    assert "mfu" in r
  assert records[-1]["loss"] < 0.8 * records[0]["loss"]
  assert records[-1]["mlm_loss"] < records[0]["mlm_loss"]
  evals = [r for r in records if "eval_loss" in r]
  assert [r["step"] for r in evals] == [30, 60]
  for key in ("eval_disc_accuracy", "eval_disc_precision", "eval_disc_recall", "eval_mlm_accuracy"):
    assert 0.0 <= evals[-1][key] <= 1.0
  assert json.loads((workdir / "config.json").read_text())["train"]["num_steps"] == 60
  assert sorted(os.listdir(workdir / "checkpoints"))[-1] == "60"
  assert any(f.startswith("events") for f in os.listdir(workdir / "tensorboard"))
