"""benchmarks/gpu_run.py: its --dry_run (the whole GPU chain on CPU at tiny shapes) leaves every step's figures."""
import json
import pathlib
import subprocess
import sys

import pytest

from benchmarks import gpu_run
from electra_jax import finetune
from studies import finetune_demo

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_run.py"


def _gpu_run(*args, timeout=900):
  return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, check=False)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_run")
  result = _gpu_run("--dry_run", f"--output={out}")
  assert result.returncode == 0, result.stdout + result.stderr
  return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_every_step_succeeds_and_is_logged(dry_run):
  out, results = dry_run
  steps = results["steps"]
  assert list(steps) == ["env", "prepare", "bench", "peer", "pretrain", "export", "finetune"]
  assert {name: s["status"] for name, s in steps.items()} == dict.fromkeys(steps, "ok"), steps
  for run in steps["bench"]["figures"]["runs"] + steps["peer"]["figures"]["runs"]:
    assert (out / "logs" / f"{run['name']}.out").exists() and (out / run["log"]).exists()
  env = steps["env"]["figures"]
  assert not env["missing"] and "import_errors" not in env and env["tensorflow_imported"] is False
  summary = (out / "summary.md").read_text()
  for heading in ("## Training step", "## HF-PyTorch peer", "## Pre-training", "## Fine-tuning"):
    assert heading in summary


@pytest.mark.slow
def test_bench_and_peer_figures(dry_run):
  _, results = dry_run
  ours = [r["result"] for r in results["steps"]["bench"]["figures"]["runs"]]
  assert sorted(r["attention_impl"] for r in ours) == ["einsum", "fused"]
  for r in ours:
    assert r["tokens_per_sec"] > 0 and r["step_time_s"] > 0 and r["dtype"] == "bfloat16"
    assert (r["config"], r["batch"], r["seq_len"]) == ("tiny", 8, 64)
  peers = [r["result"] for r in results["steps"]["peer"]["figures"]["runs"]]
  assert sorted(r["peer"] for r in peers) == ["eager", "torch.compile"]
  for r in peers:
    assert r["tokens_per_sec"] > 0 and r["dtype"] == "bfloat16" and (r["batch"], r["seq_len"]) == (8, 64)


@pytest.mark.slow
def test_pretraining_is_time_boxed_and_evaluated(dry_run):
  out, results = dry_run
  pre = results["steps"]["pretrain"]["figures"]
  assert pre["bench_step_time_s"] > 0  # the schedule came from the bench's einsum step
  assert pre["schedule"]["num_steps"] == 20 and pre["schedule"]["eval_every"] == 10
  assert "launch/gpu.sh" in pre["run"]["command"] and not pre["run"]["stopped_at_deadline"]
  rows = [json.loads(l) for l in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "eval_disc_auc" in r] == [10, 20] == [e["step"] for e in pre["evals"]]
  assert pre["evals"] == [{k: r.get(k) for k in pre["evals"][0]} for r in rows if "eval_disc_auc" in r]  # as logged
  assert pre["last_step"] == 20 and pre["median_tokens_per_sec"] > 0


@pytest.mark.slow
def test_export_loads_and_both_inits_are_fine_tuned(dry_run):
  out, results = dry_run
  from electra_jax.hf import directory  # pylint: disable=g-import-not-at-top
  config, params = directory.import_hf(str(out / "export"))
  assert config.model.num_layers == 2 and params
  ft = results["steps"]["finetune"]["figures"]["results"]
  assert sorted(r["method"] for r in ft) == ["pre-trained", "random init"]
  assert all(r["num_train"] == 64 for r in ft)
  # Each accuracy is the one its saved predictions give on the task's eval rows.
  labels = [row["label"] for row in finetune.load_rows(finetune_demo.task_config("sentiment").task)["eval"][0]]
  for r in ft:
    run = out / "finetune" / r["task"] / r["labels"] / r["method"].replace(" ", "_") / r["seed"]
    predicted = [json.loads(l)["prediction"] for l in (run / "predictions_eval.jsonl").read_text().splitlines()]
    assert len(predicted) == len(labels) == r["num_eval"]
    assert r["accuracy"] == pytest.approx(sum(p == l for p, l in zip(predicted, labels)) / len(labels)), r
  assert "TF-IDF" in (out / "finetune.md").read_text()


@pytest.mark.slow
def test_a_failed_step_is_recorded_and_what_needs_it_is_skipped(tmp_path):
  result = _gpu_run(f"--data_dir={tmp_path / 'no_data'}", f"--output={tmp_path}", "--steps=pretrain,export",
                    "--pretrain_minutes=2", timeout=300)
  assert result.returncode == 0, result.stderr
  steps = json.loads((tmp_path / "results.json").read_text())["steps"]
  assert steps["pretrain"]["status"] == "failed" and "no prepared data" in steps["pretrain"]["error"]
  assert steps["pretrain"]["figures"]["schedule"] == "the config's, cut at the deadline"  # no bench figure to fit
  assert steps["export"] == dict(status="skipped", reason="needs a successful pretrain step", seconds=0.0)
  assert "| pretrain | failed |" in (tmp_path / "summary.md").read_text()
  assert "gpu_run: pretrain failed" in result.stdout


@pytest.mark.slow
def test_usage_errors_and_help():
  assert "--pretrain_minutes" in _gpu_run("--help").stdout
  missing = _gpu_run("--output=/nonexistent/x")
  assert missing.returncode != 0 and "--data_dir is required" in missing.stderr
  assert "unknown --steps benchh" in _gpu_run("--dry_run", "--steps=benchh").stderr


@pytest.mark.parametrize("minutes, step_time, max_steps, expected", [
    (15, 0.007, 0, dict(num_steps=96_000, warmup_steps=9_600, eval_every=16_000, checkpoint_every=16_000,
                        log_every=100)),  # ~11 minutes of bare steps, evaluated 6 times
    (15, 0.5, 20, dict(num_steps=20, warmup_steps=2, eval_every=10, checkpoint_every=10, log_every=10)),
    (15, None, 0, {}),
])
def test_time_box(minutes, step_time, max_steps, expected):
  assert gpu_run.time_box(minutes, step_time, max_steps) == expected
  if expected:
    assert expected["num_steps"] * step_time <= minutes * 60 * gpu_run.STEP_MARGIN
