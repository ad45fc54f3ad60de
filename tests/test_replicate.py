"""`python -m studies.replicate` end to end on the tiny study (configs/studies/replicate.py:tiny, two objectives):
equal FLOPs, pre-training, fine-tuning along the way, the report and its figures; running it again reuses every run.
And the gpu scale's plan is a valid study."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests import pretrain_cli

pytestmark = pytest.mark.slow  # every test here runs the commands as subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("sentiment",)  # one of the demo's two: the study runs every task alike, and each costs ten seconds


def _replicate(*args: str) -> str:
  # One device, as `make replicate` runs the study: its code is the same on any mesh (the 8 simulated devices are
  # sharding's tests), and its many short runs compile and step faster on one.
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS=pretrain_cli.xla_flags(1))
  out = subprocess.run([sys.executable, "-m", "studies.replicate", *args], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  return out.stdout


def _plan(stdout: str) -> dict:
  return {p["objective"]: p for p in map(json.loads, re.findall(r"^\{.*\}$", stdout, re.M))}


@pytest.fixture(scope="module")
def study(tiny_data, tmp_path_factory):
  """The tiny study run once: (its arguments, stdout, the workdir, the report's path)."""
  tmp = tmp_path_factory.mktemp("replicate")
  workdir, output = tmp / "runs", tmp / "docs" / "replication.md"
  args = ("--config=configs/studies/replicate.py:tiny", "--config.objectives=electra,mlm",
          f"--config.tasks={','.join(TASKS)}",
          f"--config.pretrain.data.data_dir={tiny_data[0].data.data_dir}", f"--workdir={workdir}", f"--output={output}")
  return args, _replicate(*args), workdir, output


def test_equal_flops_checkpoints_and_results(study):
  _, stdout, workdir, _ = study
  with open(workdir / "results.json", encoding="utf-8") as f:
    results = json.load(f)
  objectives, budget = results["objectives"], results["budget_flops"]
  assert list(objectives) == ["electra", "mlm"] and results["budget_steps"] == 6
  assert objectives["electra"]["num_steps"] == 6
  assert objectives["mlm"]["num_steps"] > 6  # BERT has no generator: cheaper steps, more of them
  for name, o in objectives.items():
    assert abs(o["flops"] - budget) <= o["step_flops"], name
    assert o["flops"] == o["num_steps"] * o["step_flops"] == _plan(stdout)[name]["flops"]
    steps = [c["step"] for c in o["checkpoints"]]
    assert len(steps) == 2 and steps[-1] == o["num_steps"], steps  # num_checkpoints=2: half-way and the end
    for c in o["checkpoints"]:
      assert sorted(c["runs"]) == list(TASKS) and all(len(v) == 1 for v in c["runs"].values())
      assert {r["init_from"] for v in c["runs"].values() for r in v} == {str(workdir / "pretrain" / name)}
    assert [p["step"] for p in o["curves"]] == list(range(1, o["num_steps"] + 1))  # log_every=1
    assert o["pretrain_seconds"] > 0
  assert set(results["floors"]) == {"random init", "TF-IDF 1-2-gram + LR"}


def test_report_and_figures(study):
  _, _, _, output = study
  text = output.read_text(encoding="utf-8")
  sections = dict(re.findall(r"^### (\w+) .*?\n(.*?)(?=^#)", text, re.M | re.S))
  assert sorted(sections) == list(TASKS)
  for task, body in sections.items():
    for label in ("ELECTRA", "BERT (MLM)", "random init (floor)", "TF-IDF 1-2-gram + LR (floor)"):
      assert re.search(rf"^\| {re.escape(label)} \| [01]\.\d{{3}} \| [01]\.\d{{3}} \| \d+ \|$", body, re.M), (task,
                                                                                                           label)
  # a verdict per task and for the mean over tasks
  assert re.search(r"^\| ELECTRA beats BERT \(MLM\) " + r"\| (yes|no) \(.*" * (len(TASKS) + 1) + "$", text, re.M)
  assert "Machine: " in text and "jax " in text and "Scale: **tiny**" in text
  for name in ("downstream", "pretraining"):
    png = output.parent / "replication" / f"{name}.png"
    assert f"](replication/{name}.png)" in text
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, (png, len(data))


def test_running_again_reuses_every_run(study):
  args, _, workdir, output = study
  report = output.read_text(encoding="utf-8")
  results = (workdir / "results.json").read_text(encoding="utf-8")
  stamps = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file() and p.name != "results.json"}
  stdout = _replicate(*args)
  lines = [l for l in stdout.splitlines() if re.match(r"\[.*\] (pre-trained|.* seed \d+:)", l)]
  assert len(lines) == 2 + len(TASKS) * (1 + 2 * 2), stdout  # 2 pre-trainings; per task random init + 2 x 2 checkpoints
  assert all(l.split(";")[0].endswith(("(done before)", "(reused)")) for l in lines), stdout
  assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # nothing re-run or rewritten
  assert (workdir / "results.json").read_text(encoding="utf-8") == results
  assert output.read_text(encoding="utf-8") == report


def test_gpu_scale_plan(tmp_path):
  """ELECTRA-Small sizes, every objective (Two-stage with G at D's size, untied) at equal FLOPs; nothing written."""
  plan = _plan(_replicate("--config=configs/studies/replicate.py:gpu", "--plan_only", f"--workdir={tmp_path}"))
  assert list(plan) == ["electra", "mlm", "electra_15", "replace_mlm", "all_tokens_mlm", "two_stage"]
  budget = 10_000 * plan["electra"]["step_flops"]
  for name, p in plan.items():
    assert abs(p["flops"] - budget) <= p["step_flops"] and len(p["checkpoints"]) == 4, (name, p)
  assert plan["electra"]["num_steps"] == 10_000 and plan["mlm"]["num_steps"] > 10_000
  assert not any(tmp_path.iterdir())
