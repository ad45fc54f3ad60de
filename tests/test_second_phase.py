"""A second phase at a longer sequence length (BERT's recipe: most steps at 128 tokens, the rest at 512): a run
continues a shorter run's workdir (train.init_from) on data prepared again with its tokenizer, from its parameters,
and with train.init_from_state from its optimiser state and step too; the input position starts afresh."""
import copy
import json

import jax
import jax.flatten_util
import numpy as np
import optax
import pytest

from electra_jax import prepare
from electra_jax.data import input_pipeline
from electra_jax.hf import directory as hf_directory
from electra_jax.parallel import optim
from electra_jax.pretrain import experiment
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.pretrain import plan as plan_lib
from electra_jax.run import checkpoints, sources, weights
from tests import helpers

LONG = 128  # phase 2's seq_len; phase 1 runs at the tiny config's 64


def _assert_same(a, b):
  a, b = jax.device_get(a), jax.device_get(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def _start(config, workdir: str):
  """What pretrain_loop.train_and_evaluate(config, workdir) starts from: (state on the host, input position)."""
  plan = plan_lib.resolve(config, workdir)
  exp = experiment.create(plan.config, plan.data.special_ids, word_starts=plan.data.word_starts)
  ckpt = checkpoints.Checkpointer(workdir, plan.config, plan.data.tokenizer_path, read_only=True)
  try:
    state, saved, _ = pretrain_loop.restore_or_init(exp, ckpt, plan.start)
  finally:
    ckpt.close()
  return jax.device_get(state), saved and saved["position"]


def _checkpoint(config, workdir: str, step: int):
  """The whole TrainState `workdir` saved at `step`."""
  ckpt = checkpoints.Checkpointer(workdir, config, read_only=True)
  try:
    return jax.device_get(ckpt.restore(experiment.create(config).sharded.abstract(), step).state)
  finally:
    ckpt.close()


@pytest.mark.slow
def test_second_phase_at_a_longer_seq_len(tiny_data, tmp_path, monkeypatch):
  first = helpers.tiny_config(tiny_data)
  first.train.update(num_steps=4, log_every=2, eval_every=4, checkpoint_every=4)
  end = jax.device_get(pretrain_loop.train_and_evaluate(first, str(tmp_path / "phase1")))

  second = copy.deepcopy(first)
  second.data.update(seq_len=LONG, data_dir=str(tmp_path / "data"))
  second.train.update(init_from=str(tmp_path / "phase1"), num_steps=6, log_every=1, eval_every=6, checkpoint_every=1,
                      keep_checkpoints=10)
  prepared = prepare.build(second)  # with phase 1's tokenizer: none is trained
  assert prepared.tokenizer_path == tiny_data[1].tokenizer_path and not (tmp_path / "data" / "tokenizer").exists()

  # Without init_from_state: phase 1's parameters, a fresh optimiser at step 0.
  state, position = _start(second, str(tmp_path / "params_only"))
  _assert_same(state.params, end.params)
  assert int(state.step) == 0 and position is None
  assert not any(np.any(x) for x in jax.tree.leaves(state.opt_state))

  # With it: phase 1's whole state (parameters, Adam's moments and count, step); the input position starts afresh.
  second.train.init_from_state = True
  workdir = str(tmp_path / "phase2")
  state, position = _start(second, workdir)
  _assert_same(state, end)
  assert int(state.step) == 4 and position is None
  assert all(np.any(x) for x in jax.tree.leaves(optax.tree_utils.tree_get(state.opt_state, "nu")))
  second.train.num_steps = 4  # counts both phases' steps
  with pytest.raises(ValueError, match="phase1 is at step 4, which leaves nothing to train up to train.num_steps=4"):
    pretrain_loop.train_and_evaluate(second, workdir)
  assert not (tmp_path / "phase2").exists()
  second.train.num_steps = 6

  fed = []
  to_global = input_pipeline.to_global
  monkeypatch.setattr(input_pipeline, "to_global", lambda batch, where: fed.append(batch) or to_global(batch, where))
  pretrain_loop.train_and_evaluate(second, workdir)
  resolved, _ = sources.init_source(second)
  it = input_pipeline.train_iterator(resolved, prepared)
  try:
    _assert_same(fed[0], next(it))  # phase 2's first batch is the long data's first
  finally:
    it.close()
  assert fed[0]["input_ids"].shape == (16, LONG) and (fed[0]["input_ids"][:, 64:] != 0).any()

  # Step 5, phase 2's first, updated phase 1's parameters at schedule(4): the schedule went on, it did not restart
  # at 0. A parameter that does not decay (a bias, a LayerNorm scale) moves by lr · m̂ / (√v̂ + ε), Adam's moments
  # bias-corrected at count 5.
  after = _checkpoint(resolved, workdir, 5)
  assert {int(c) for _, c in optax.tree_utils.tree_get_all_with_path(after.opt_state, "count")} == {5}
  c = second.train
  mu, nu = (optax.tree_utils.tree_get(after.opt_state, k) for k in ("mu", "nu"))
  if not isinstance(mu, dict):  # train.flat_update: one vector each, in the parameters' order
    unravel = jax.flatten_util.ravel_pytree(end.params)[1]
    mu, nu = unravel(mu), unravel(nu)
  direction = jax.tree.map(lambda m, v: m / (1 - c.adam_b1 ** 5) / (np.sqrt(v / (1 - c.adam_b2 ** 5)) + c.adam_eps),
                           mu, nu)
  rates = [(p0 - p1)[np.abs(u) > 0.5] / u[np.abs(u) > 0.5]
           for p0, p1, u, decays in zip(*(jax.tree.leaves(t) for t in (end.params, after.params, direction,
                                                                          optim.decay_mask(end.params))))
           if not decays]
  rates, schedule = np.concatenate(rates), optim.build(experiment.recipe(c)).schedule
  assert rates.size > 1000
  np.testing.assert_allclose(rates, schedule(4), rtol=1e-3)
  assert schedule(4) > 0.5 * c.learning_rate  # and far from schedule(0) = 0

  # Phase 2 resumes from its own checkpoint (init_from is ignored once there is one), at its own input position.
  second.train.num_steps = 8
  state, position = _start(second, workdir)
  assert int(state.step) == 6 and position == {"step": 2}
  pretrain_loop.train_and_evaluate(second, workdir)
  records = [r for r in map(json.loads, (tmp_path / "phase2" / "metrics.jsonl").read_text().splitlines())
             if "loss" in r]  # not each session's closing time split
  assert [r["step"] for r in records] == [5, 6, 7, 8] and all(np.isfinite(r["loss"]) for r in records)
  assert records[0]["learning_rate"] == pytest.approx(schedule(4))


def test_init_from_state_refuses_what_it_cannot_continue(tiny_data, tmp_path):
  """One-line errors, before anything is written: no workdir to take the optimiser state from, an optimiser state
  that does not fit (another objective), another tokenizer than init_from's. A step that leaves nothing to train:
  test_second_phase_at_a_longer_seq_len."""
  config = helpers.tiny_config(tiny_data)
  source = str(tmp_path / "source")
  params = helpers.save_workdir(config, source)
  weights.export_params(source, str(tmp_path / "export"))
  hf_directory.export(config, params, str(tmp_path / "hf"))
  cases = [("", "electra", "train.init_from_state needs train.init_from"),
           (str(tmp_path / "export"), "electra", "export is a params export, which holds no optimiser state"),
           (str(tmp_path / "hf"), "electra", "hf is an HF directory, which holds no optimiser state"),
           (source, "mlm", r"source does not fit this config at params\..*Adam's moments have the parameters'")]
  for init_from, objective, message in cases:
    config.train.update(init_from=init_from, init_from_state=True)
    config.objective.name = objective
    with pytest.raises(ValueError, match=message):
      pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()

  # Plain init_from, with a data.tokenizer other than the one its weights were trained with.
  other = tmp_path / "other.model"
  other.write_bytes(open(sources.resolve(source).tokenizer, "rb").read() + b"\0")
  config.train.update(init_from=source, init_from_state=False)
  config.data.tokenizer = str(other)
  with pytest.raises(ValueError, match=f"init_from={source}: its tokenizer is not data.tokenizer={other}"):
    pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
