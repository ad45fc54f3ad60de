"""What one pre-training config compiles: the model, the optimiser, the one pure train step and the evaluation step,
jitted over the mesh (state.py), and the evaluation that sums on device."""
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from electra_jax import modeling, objectives, optim, sharding, state as state_lib
from electra_jax.state import TrainState
from electra_jax.special_ids import SpecialIds


def train_step(state: TrainState, batch, rng, *, model, tx, objective, special, nan_at_step=0, two_stage_switch=0):
  """mask → G → sample → stop_gradient → D → loss → one optax update of G and D together. Pure: the step's
  randomness is `rng` folded with the step number. `nan_at_step` (train.debug_nan_at_step) makes the loss of that
  step NaN, to test the loop's guard. `two_stage_switch` (objective two_stage) is the step that starts stage 2."""
  step_rng = jax.random.fold_in(rng, state.step)

  def loss_fn(params, stage=2):
    loss, metrics = objectives.compute_loss(model, params, batch, step_rng, objective, special, stage=stage)
    if nan_at_step:
      loss *= jnp.where(state.step + 1 == nan_at_step, jnp.nan, 1.0)
    return loss, metrics

  def grad_fn(stage=2):  # `stage` matters to two_stage only (see compute_loss)
    return jax.value_and_grad(functools.partial(loss_fn, stage=stage), has_aux=True)

  params, opt_state = state.params, state.opt_state
  if not two_stage_switch:
    (loss, metrics), grads = grad_fn()(params)
  else:
    # Stage 2 starts from D = G with fresh Adam moments and bias correction; the learning-rate schedule carries on.
    params, opt_state = jax.lax.cond(
        state.step == two_stage_switch,
        lambda p, o: (objectives.discriminator_from_generator(p), _restart_adam(o, tx.init(p))),
        lambda p, o: (p, o), params, opt_state)
    stage2 = state.step >= two_stage_switch
    # One stage runs per step: stage 1 never runs D, stage 2 never runs G's backward pass.
    (loss, metrics), grads = jax.lax.cond(stage2, grad_fn(2), grad_fn(1), params)
  updates, opt_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  if two_stage_switch:
    new_params = objectives.freeze_untrained(new_params, params, stage2)
  metrics.update(loss=loss, grad_norm=optax.global_norm(grads))
  return TrainState(step=state.step + 1, params=new_params, opt_state=opt_state), metrics


def _restart_adam(opt_state, fresh):
  """opt_state with every Adam state (moments and step count) taken from `fresh`, the rest (e.g. the learning-rate
  schedule's count) kept."""
  is_adam = lambda s: isinstance(s, optax.ScaleByAdamState)
  return jax.tree.map(lambda s, f: f if is_adam(s) else s, opt_state, fresh, is_leaf=is_adam)


def eval_step(params, batch, rng, *, model, objective, special):
  """The loss and metrics on held-out data, dropout off, with a fixed rng so every evaluation masks alike."""
  loss, metrics = objectives.compute_loss(model, params, batch, rng, objective, special, deterministic=True)
  return dict(metrics, loss=loss)


@dataclasses.dataclass
class Experiment:
  """Everything compiled for one config on one mesh: the model, the optimiser, the shardings and the jitted steps."""
  config: ml_collections.ConfigDict
  model: modeling.Electra
  special: SpecialIds
  schedule: optax.Schedule
  sharded: state_lib.Sharded
  step: Callable  # (state, batch, rng) -> (state, metrics)
  eval: Callable  # (params, batch, rng) -> metrics


def create(config: ml_collections.ConfigDict, special: SpecialIds = SpecialIds(), devices=None) -> Experiment:
  objective = objectives.get(config.objective.name)
  two_stage_switch = objectives.two_stage_switch_step(config) if objective.staged else 0
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  mesh = sharding.create_mesh(config.mesh, devices)
  sharding.check_batch(config.train.batch_size, mesh)
  tx, schedule = optim.create(config.train)
  sharded = state_lib.create(functools.partial(objectives.init_params, model, config), tx, mesh)
  kw = dict(model=model, objective=config.objective, special=special)
  step = sharded.jit_step(functools.partial(train_step, tx=tx, nan_at_step=config.train.debug_nan_at_step,
                                            two_stage_switch=two_stage_switch, **kw))
  evaluate_batch = sharded.jit_eval(functools.partial(eval_step, **kw))
  return Experiment(config, model, special, schedule, sharded, step, evaluate_batch)


def evaluate(exp: Experiment, params, batches) -> dict:
  """Metrics over `batches`, summed on device and fetched once: means, the discriminator's precision and recall on
  replaced tokens, and its ROC AUC (replaced vs original over every non-pad token)."""
  rng = jax.random.key(exp.config.train.seed + 1)
  totals, n = None, 0
  for batch in batches:
    out = exp.eval(params, batch, rng)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    n += 1
  if not n:
    return {}
  totals = jax.device_get(totals)
  result = {k: float(v) / n for k, v in totals.items() if not k.startswith("disc_") or
            k in ("disc_loss", "disc_accuracy")}
  if "disc_true_positives" in totals:
    result["disc_precision"] = float(totals["disc_true_positives"] / max(totals["disc_predicted_positives"], 1.0))
    result["disc_recall"] = float(totals["disc_true_positives"] / max(totals["disc_label_positives"], 1.0))
    result["disc_auc"] = objectives.roc_auc(totals["disc_auc_histogram"])
  return {f"eval_{k}": v for k, v in result.items()}
