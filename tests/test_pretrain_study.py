"""studies/pretrain_study.py: recipes are the baseline plus their overrides, and the report reads real runs."""
import copy

import numpy as np
import pytest
from sklearn import metrics

from studies import pretrain_study as study_lib
from configs.studies import pretrain_study
from electra_jax.data import input_pipeline
from electra_jax.pretrain import experiment
from electra_jax.pretrain import loop as pretrain_loop


def test_a_recipe_is_the_baseline_plus_its_overrides():
  study = pretrain_study.get_config()
  c = study_lib.recipe_config(study, "lr3e-4_b2_0.98")
  assert (c.train.learning_rate, c.train.adam_b2, c.train.warmup_steps) == (3e-4, 0.98, 200)
  assert c.model.dropout_rate == 0.0 and c.model.initializer_range == 0.02
  assert c.train.num_steps == study.num_steps
  uniform = study_lib.recipe_config(study, "uniform")
  assert uniform.objective.temperature == 1000.0 and uniform.train.num_steps == 500  # its own length wins
  assert study.base.train.adam_b2 == 0.999 and study.base.objective.temperature == 1.0  # copied, not modified
  assert study_lib.recipe_config(study, "lr1e-3").train.adam_b2 == 0.999


@pytest.mark.slow  # a pre-training run
def test_report_reads_the_evaluations_of_a_real_run(tiny_data, tmp_path):
  config = copy.deepcopy(tiny_data[0])
  config.train.update(num_steps=4, eval_every=2, log_every=2, checkpoint_every=4)
  workdir = tmp_path / "study" / "lr1e-3"
  state = pretrain_loop.train_and_evaluate(config, str(workdir))
  rows = study_lib.evals(str(workdir))
  assert [r["step"] for r in rows] == [2, 4]
  # The last AUC is the final discriminator's over every held-out token: the final parameters evaluated again, the
  # area computed by scikit-learn from the evaluation's summed [original, replaced] x score-bin histogram.
  prepared = tiny_data[1]
  exp, histograms = experiment.create(config, prepared.special_ids), []
  evaluate_batch = exp.eval

  def recording(*args):
    out = evaluate_batch(*args)
    histograms.append(np.asarray(out["disc_auc_histogram"]))
    return out
  exp.eval = recording
  held_out = list(input_pipeline.validation_batches(config, prepared))
  experiment.evaluate(exp, state.params, (input_pipeline.to_global(b, exp.sharded.batch) for b in held_out))
  counts = np.sum(histograms, axis=0)
  assert counts.sum() == sum((b["input_ids"] != prepared.special_ids.pad).sum() for b in held_out)
  scores = np.tile(np.arange(counts.shape[1]), 2)  # a token's bin is its score: a tie within a bin counts half
  auc = metrics.roc_auc_score(np.repeat([0, 1], counts.shape[1]), scores, sample_weight=counts.ravel())
  assert rows[-1]["eval_disc_auc"] == pytest.approx(auc, abs=1e-6)
  study = pretrain_study.get_config()
  text = study_lib.report(study, {"lr1e-3": (rows, 0.5)}, tmp_path / "recipes.png")
  row = next(l for l in text.splitlines() if l.startswith("| lr1e-3 |"))
  assert f"| 4 | {rows[-1]['eval_disc_auc']:.3f} |" in row and row.endswith("| 0.500 |")
  study_lib.plot({"lr1e-3": (rows, 0.5)}, tmp_path / "recipes.png")
  assert (tmp_path / "recipes.png").stat().st_size > 1000
