"""electra-pretrain end to end on real (tiny) data: the loss falls, metrics.jsonl has every documented field, and its
figures agree with each other; the run's time split closes metrics.jsonl and train.profile_steps leaves a trace."""
import json
import math
import os
import subprocess
import sys

import jax
import pytest

from electra_jax.data import prepared
from electra_jax.model import flops
from electra_jax.run import metrics, sources
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_pretrain_tiny_end_to_end(tiny_data, tmp_path, monkeypatch):
  config, _ = tiny_data
  workdir = tmp_path / "run"
  # data_dir relative to the command's directory, as configs/demo.py's is
  cmd = [sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
         f"--config.data.data_dir={os.path.relpath(config.data.data_dir, ROOT)}", f"--workdir={workdir}",
         "--config.train.num_steps=60", "--config.train.log_every=10", "--config.train.eval_every=30",
         "--config.train.profile_steps=2"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  *records, split = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(10, 61, 10))
  # Where the time went: the phases add up to the wall time, the steps' share is the goodput, and the log says so.
  phases = [v for k, v in split.items() if k.startswith("time_") and k != "time_wall_s"]
  assert split["step"] == 60 and sum(phases) == pytest.approx(split["time_wall_s"], abs=0.05)
  assert split["time_compile_s"] > 0 and split["time_startup_s"] > 0 and split["time_restart_s"] == 0
  assert 0 < split["goodput"] == pytest.approx(split["time_step_s"] / split["time_wall_s"], abs=1e-3)
  assert f"goodput {100 * split['goodput']:.1f}%" in out.stderr
  assert list((workdir / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))  # the two steps' trace
  for r in records:
    missing = [f for f in metrics.TRAIN_FIELDS if r.get(f) is None and f != "mfu"]  # no MFU on a CPU
    assert not missing, f"step {r['step']} lacks {missing}"
    assert "mfu" in r
    # FLOPs per token and device, from each row's throughput: one step's FLOPs over one step's tokens, however many
    # steps a row spans (rows at steps 10, 20, ... span 10); the run's devices are this process's (XLA_FLAGS)
    assert r["tflops_per_device"] * 1e12 / r["tokens_per_sec"] == pytest.approx(
        flops.step_flops(config) / (config.train.batch_size * config.data.seq_len) / jax.device_count(), rel=1e-6)
  assert records[-1]["loss"] < 0.8 * records[0]["loss"]
  assert records[-1]["mlm_loss"] < records[0]["mlm_loss"]
  weight, mask_prob = config.objective.disc_weight, config.objective.mask_prob
  for r in records:  # ELECTRA's loss: the generator's MLM loss plus λ times the discriminator's
    assert r["loss"] == pytest.approx(r["mlm_loss"] + weight * r["disc_loss"], rel=1e-4)
  evals = [r for r in records if "eval_loss" in r]
  assert [r["step"] for r in evals] == [30, 60]
  e = evals[-1]
  assert e["eval_loss"] == pytest.approx(e["eval_mlm_loss"] + weight * e["eval_disc_loss"], rel=1e-4)
  # Replaced tokens: some of the masked ones (a sample may equal the original).
  p, precision, recall = e["eval_replaced_fraction"], e["eval_disc_precision"], e["eval_disc_recall"]
  assert 0.3 * mask_prob < p <= mask_prob + 0.02  # a sequence masks a whole number of tokens
  # The discriminator does at least as well as calling every token original (1 - p), bar noise.
  assert 1 - p - 0.02 <= e["eval_disc_accuracy"] <= 1
  # Accuracy, precision and recall are three views of one confusion matrix: with p the positives' share, true
  # positives are recall·p, false positives TP/precision - TP, false negatives p - TP.
  tp = recall * p
  errors = (tp / precision - tp if precision else 0.0) + p - tp
  assert e["eval_disc_accuracy"] == pytest.approx(1 - errors, abs=0.01)
  assert (precision > 0) == (recall > 0)
  # The generator learns on held-out text: its loss falls between the evaluations and beats a uniform guess. (One
  # training batch's accuracy at step 10 against ~200 held-out predictions is within noise of it: not a measure.)
  assert 0 < e["eval_mlm_accuracy"] < 1
  assert e["eval_mlm_loss"] < evals[0]["eval_mlm_loss"] < math.log(config.data.vocab_size)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["train"]["num_steps"] == 60
  # config.json holds the data's absolute path, so the workdir's tokenizer is found from any directory (init_from,
  # export)
  assert saved["data"]["data_dir"] == config.data.data_dir
  monkeypatch.chdir(tmp_path)
  tokenizer = prepared.tokenizer_path(config)
  assert sources.resolve(str(workdir)).tokenizer == tokenizer and os.path.exists(tokenizer)
  assert sorted(os.listdir(workdir / "checkpoints"))[-1] == "60"
  # TensorBoard holds every figure of metrics.jsonl, at its step.
  (events,) = (workdir / "tensorboard").glob("events.*")
  scalars = [(e.step, v.tag, v.simple_value) for e in helpers.tensorboard_events(events.read_bytes())
             for v in e.summary.value]
  assert scalars == [(r["step"], k, pytest.approx(v)) for r in [*records, split] for k, v in r.items()
                     if k != "step" and v is not None]
