"""A diverging run, in process on the tiny config: a non-finite update is never applied nor saved, train.max_bad_steps
of them in a row stop the run in one line with its newest checkpoint (finite) kept, from which the run resumes; a
loss spike of exploding but finite weights is reported (and stops the run under train.stop_on_spike); a checkpoint
whose weights are not finite is refused by export and init_from, and passed over by a resuming run."""
import copy
import json
import logging
import re

import jax
import numpy as np
import pytest

from electra_jax.pretrain import experiment
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.run import checkpoints, sources, weights
from electra_jax.run import workdir as workdir_lib
from tests import helpers


def _config(tiny_data, **train):
  config = copy.deepcopy(tiny_data[0])
  config.train.update(warmup_steps=1, log_every=1, eval_every=1000, checkpoint_every=2, **train)
  return config


def _rows(workdir):
  """metrics.jsonl's step rows."""
  return [r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _params(workdir, step=None):
  return jax.device_get(weights.load(str(workdir), step).params)


def test_non_finite_steps_are_not_applied_and_the_run_resumes_from_its_checkpoint(tiny_data, tmp_path):
  """Step 3's loss is NaN (train.debug_nan_at_step). With train.max_bad_steps=1 the run stops there in one line,
  keeping checkpoint 2; run again with max_bad_steps=2, it resumes from it, does not apply step 3 and trains on."""
  config = _config(tiny_data, num_steps=4, debug_nan_at_step=3, max_bad_steps=1)
  workdir = tmp_path / "run"
  with pytest.raises(FloatingPointError, match=(
      r"^loss=nan grad_norm=nan at step 3: 1 non-finite steps in a row \(train.max_bad_steps\), none of them "
      rf"applied; stopped without saving it; the newest checkpoint is kept \(step 2 under {workdir}/checkpoints\)$")):
    pretrain_loop.train_and_evaluate(config, str(workdir))
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2"]
  kept = _params(workdir)

  config.train.max_bad_steps = 2
  pretrain_loop.train_and_evaluate(config, str(workdir))
  assert [(r["step"], r["skipped"]) for r in _rows(workdir)] == [(1, 0.0), (2, 0.0), (3, 1.0), (4, 0.0)]
  trained = _params(workdir, 4)
  assert not checkpoints.non_finite(trained)
  assert not all(map(np.array_equal, jax.tree.leaves(trained), jax.tree.leaves(kept)))


def test_an_update_that_overflows_the_weights_is_never_saved(tiny_data, tmp_path):
  """A learning rate of 1e40 overflows float32: step 1's loss and gradient are finite, its update NaN. The save at
  step 2 finds the weights non-finite and stops the run in one line; nothing is saved."""
  config = _config(tiny_data, learning_rate=1e40, num_steps=4)
  with pytest.raises(FloatingPointError, match=(
      r"^the state after step 2 is not finite \(NaN/Inf in \d+ arrays, e\.g\. \S+\): an update at or before it "
      r"overflowed the weights; stopped without saving it \(no checkpoint was saved\)$")):
    pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "checkpoints").exists()
  assert [r["skipped"] for r in _rows(tmp_path / "run")] == [0.0, 1.0]  # step 2's loss, of NaN weights, is NaN


@pytest.mark.parametrize("stop", [False, True])
def test_exploding_weights_are_reported_as_a_loss_spike(stop, tiny_data, tmp_path, caplog):
  """A learning rate of 1 blows the weights up without overflow: step 3's loss (the first after a full-rate update)
  is tens of times the first two steps'. A warning names the step; train.stop_on_spike stops the run there instead,
  keeping the checkpoint whose weights gave it."""
  config = _config(tiny_data, learning_rate=1.0, num_steps=3, stop_on_spike=stop)
  spike = (r"loss=\S+ at step 3 is \d+x the median of the last 2 steps' \(\S+\): a loss spike, the weights may be "
           "diverging")
  if stop:
    with pytest.raises(FloatingPointError, match=rf"^{spike} \(train.stop_on_spike\); stopped without saving it; the "
                       r"newest checkpoint is kept \(step 2, the weights that gave this loss under .*\)$"):
      pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["2"]
    return
  with caplog.at_level(logging.WARNING):
    pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
  warnings = [r.getMessage() for r in caplog.records if "loss spike" in r.getMessage()]
  assert len(warnings) == 1 and re.fullmatch(spike, warnings[0]), warnings
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["2", "3"]


def test_non_finite_checkpoints_are_refused_by_export_and_init_from_and_passed_over_by_a_resume(tiny_data, tmp_path):
  """A workdir whose newest checkpoint holds NaN weights (saved with the project's Checkpointer, as older code could
  save a diverged state): exporting that step is refused in one line naming it and writes nothing; exporting the
  default step takes the newest finite one; a params export of NaN weights is refused as init_from; and the run
  resumes from the finite checkpoint, setting the other aside."""
  config = helpers.tiny_config(tiny_data)
  source = tmp_path / "source"
  finite = helpers.save_workdir(config, str(source), step=1)
  nan = jax.tree.map(lambda x: np.full_like(x, np.nan), finite)
  exp = experiment.create(config)
  state = exp.sharded.init(jax.random.key(0))
  ckpt = checkpoints.Checkpointer(str(source), config)
  ckpt.save(2, state.replace(step=jax.device_put(np.int32(2), exp.sharded.state.step),
                                   params=jax.device_put(nan, exp.sharded.state.params)), {}, force=True)
  ckpt.close()

  out = tmp_path / "export"
  with pytest.raises(ValueError, match=rf"^checkpoint {source}/checkpoints/2 holds non-finite values \(NaN/Inf in "
                     r"\d+ arrays, e\.g\. params\.\S+\): the run that wrote it had diverged$"):
    weights.export_hf(str(source), str(out), step=2)
  assert not out.exists()
  weights.export_hf(str(source), str(out))  # the newest intact checkpoint: step 1
  jax.tree.map(np.testing.assert_allclose, weights.load(str(out)).params["discriminator"], finite["discriminator"])

  params_dir = tmp_path / "params"
  checkpoints.save_params(str(params_dir / sources.PARAMS_DIR), nan)
  workdir_lib.write_config(str(params_dir), config)
  with pytest.raises(ValueError, match=rf"^{params_dir} holds non-finite weights \(NaN/Inf in \d+ arrays"):
    weights.load(str(params_dir))

  config.train.num_steps = 2
  pretrain_loop.train_and_evaluate(config, str(source))
  assert sorted(p.name for p in (source / "checkpoints").iterdir()) == ["1", "2", "2.corrupt"]
  assert not checkpoints.non_finite(_params(source, 2))
