"""train.steps_per_dispatch: k steps in one call are the steps of k calls, bit for bit, through electra-pretrain's own
loop and across a resume that changes k; the guard sees every step inside a dispatch; cadences that are not
multiples of k, and a resume at a step that is not, are refused in one line."""
import json
import logging
import shutil

import jax
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.run import checkpoints, loop
from tests import pretrain_cli


def _train(tiny_data, workdir, **train) -> tuple:
  """Pre-trains tiny for 8 steps in `workdir`: the final params and metrics.jsonl's losses by step."""
  config, _ = tiny_data
  config = config.copy_and_resolve_references()
  config.train.update(dict(num_steps=8, log_every=4, eval_every=8, checkpoint_every=4, keep_checkpoints=2), **train)
  state = pretrain_loop.train_and_evaluate(config, str(workdir))
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return jax.device_get(state.params), {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_k_steps_a_dispatch_are_k_steps(tiny_data, tmp_path):
  """One step a call; two; and four, resumed from the two's checkpoint at step 4: the same weights and losses, bit
  for bit, with the random bits accelerators draw (partitionable threefry, JAX's default; sharding.py turns it off on
  CPUs, where a multi-device mesh's k steps then differ from k calls in the last bit: docs/pretraining_features.md)
  and the code XLA generates for every command (pretrain_cli.exactly)."""
  pretrain_cli.exactly(_k_steps_are_k_steps, tiny_data, tmp_path)


@jax.threefry_partitionable(True)
def _k_steps_are_k_steps(tiny_data, tmp_path):
  params, losses = _train(tiny_data, tmp_path / "k1")
  assert _train(tiny_data, tmp_path / "k2", steps_per_dispatch=2, stable_batch_buffers=True)[1] == losses
  shutil.copytree(tmp_path / "k2", tmp_path / "k4")
  shutil.rmtree(tmp_path / "k4" / "checkpoints" / "8")
  with pytest.raises(ValueError, match="^the run starts from step 4, not a multiple of train.steps_per_dispatch=8"):
    _train(tiny_data, tmp_path / "k4", num_steps=16, log_every=8, eval_every=16, checkpoint_every=8,
           steps_per_dispatch=8)
  resumed, resumed_losses = _train(tiny_data, tmp_path / "k4", steps_per_dispatch=4)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(resumed), strict=True):
    np.testing.assert_array_equal(a, b)
  assert resumed_losses == losses


def test_the_guard_sees_every_step_of_a_dispatch(tmp_path, caplog):
  """A dispatch's stacked metrics: each of its steps checked, by its own number."""
  ckpt = checkpoints.Checkpointer(str(tmp_path), config_lib.base("tiny"))
  in_flight = loop.InFlight(loop.Guard(ckpt, max_bad_steps=2))
  metrics = dict(loss=np.float32([2.0, np.nan]), grad_norm=np.float32([1.0, np.nan]), skipped=np.float32([0, 1]),
                 mlm_loss=np.float32([1.0, np.nan]))
  with caplog.at_level(logging.WARNING, logger="absl"):
    fetched = in_flight.push(4, 2, metrics, log=True, fetch_all=True)
  assert "loss=nan grad_norm=nan at step 4: not applied" in caplog.text
  (step, applied, row), = fetched  # the log step's row: its own (last) step's metrics
  assert step == 4 and applied == [2.0] and row["skipped"] == 1.0 and np.isnan(row["mlm_loss"])
  with pytest.raises(FloatingPointError, match="at step 5: 2 non-finite steps in a row"):
    in_flight.push(6, 2, dict(metrics, skipped=np.float32([1, 1])), log=False, fetch_all=True)
  ckpt.close()


@pytest.mark.parametrize("key", ["num_steps", "log_every", "eval_every", "checkpoint_every"])
def test_cadences_must_be_multiples_of_k(key):
  train = config_lib.base("tiny").train
  train.update(steps_per_dispatch=4, num_steps=8, log_every=4, eval_every=8, checkpoint_every=4)
  train[key] = 6
  with pytest.raises(ValueError, match=f"^train.{key}=6 is not a multiple of train.steps_per_dispatch=4: "):
    config_lib.check_counts(train, "num_steps", "eval_every")
  train[key], train.steps_per_dispatch = 8, 0
  with pytest.raises(ValueError, match="^train.steps_per_dispatch=0 must be at least 1$"):
    config_lib.check_counts(train, "num_steps", "eval_every")
