"""What one pre-training config compiles: the model, the optimiser, the one pure train step and the evaluation step,
jitted over the mesh (state.py, sharding.py), and the evaluation that sums on device."""
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import flops, losses, masking, modeling, objectives
from electra_jax.parallel import accumulate, aot, optim, sharding
from electra_jax.parallel import state as state_lib
from electra_jax.parallel.state import TrainState


def train_step(state: TrainState, batch, rng, *, model, update, objective, special, word_starts=None, accum_steps=1,
               nan_at_step=0):
  """mask → G → sample → stop_gradient → D → loss → `update`: one optax update of G and D together, as the objective
  wraps it (objectives.Objective.wrap_update), with the gradient of `accum_steps` micro-batches (accumulate.py).
  Pure: the step's randomness is `rng` folded with the step number (and, for masking and sampling, each row's index).
  `nan_at_step` (train.debug_nan_at_step) makes the loss of that step NaN, to test the loop's guard."""
  step_rng = jax.random.fold_in(rng, state.step)

  def loss_fn(params, micro, rows, **loss_args):  # loss_args: what the objective's wrapped update asks of its loss
    loss, metrics = objectives.compute_loss(model, params, micro, step_rng, objective, special, word_starts,
                                            rows=rows, **loss_args)
    if nan_at_step:
      loss *= jnp.where(state.step + 1 == nan_at_step, jnp.nan, 1.0)
    return loss, metrics

  value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

  def grad(params, **loss_args):
    return accumulate.gradients(lambda micro, rows: value_and_grad(params, micro, rows, **loss_args), batch,
                                accum_steps, summed=losses.SUMMED_METRICS)

  return update(state, grad)


def _optimiser_step(state: TrainState, grad, *, tx, flat: bool):
  """One gradient (`grad`: params -> ((loss, metrics), grads)) and one optax update of the parameters, applied only
  where it is finite (state.apply_gradients; `flat`: the flat update's, optim.py)."""
  (loss, metrics), grads = grad(state.params)
  state, update_metrics = state_lib.apply_gradients(state, loss, grads, tx, flat)
  return state, metrics | update_metrics


def scanned(step: Callable, k: int) -> Callable:
  """`k` steps of `step` (state, batch, rng) -> (state, metrics) as one: a lax.scan over k batches stacked on a leading
  axis, each step's metrics stacked. The same steps as k calls (the step folds the state's step number into the rng),
  in one dispatch: the host's work a call is shared by k steps."""
  def steps(state, batches, rng):
    return jax.lax.scan(lambda state, batch: step(state, batch, rng), state, batches, length=k)
  return steps


def eval_step(params, batch, rng, *, model, objective, special, word_starts=None):
  """The loss and metrics on held-out data, dropout off, with a fixed rng so every evaluation masks alike."""
  loss, metrics = objectives.compute_loss(model, params, batch, rng, objective, special, word_starts,
                                          deterministic=True)
  return dict(metrics, loss=loss)


@dataclasses.dataclass
class Experiment:
  """Everything compiled for one config on one mesh: the model, the optimiser, the shardings and the jitted steps."""
  config: ml_collections.ConfigDict
  model: modeling.Electra
  special: SpecialIds
  schedule: optax.Schedule
  sharded: sharding.Sharded
  step: Callable  # (state, batch, rng) -> (state, metrics); k steps on k stacked batches (steps_per_dispatch)
  eval: Callable  # (params, batch, rng) -> metrics
  step_flops: float  # the train step's model FLOPs (flops.py)
  steps_per_dispatch: int = 1  # k: `step` takes k batches stacked on a leading axis, laid out as `step_batch`
  step_batch: jax.sharding.NamedSharding | None = None  # the layout of `step`'s batch argument


def create(config: ml_collections.ConfigDict, special: SpecialIds = SpecialIds(), devices=None,
           word_starts=None) -> Experiment:
  """`special` and `word_starts` (a [vocab_size] bool sequence, tokenizer.word_starts: needed by
  objective.whole_word_masking) come from the tokenizer (data/prepared.py reads both)."""
  objective = objectives.get(config.objective.name)
  mesh = sharding.create_mesh(**config.mesh, devices=devices)
  # .get: config.json of workdirs from before the key was added lacks it (their optimiser state is per array).
  flat = optim.flat_update(config.train.get("flat_update", False), mesh)
  tx, schedule = optim.pretraining(config.train, flat=flat)
  # wrap_update checks two_stage's config
  update = objective.wrap_update(config, tx, functools.partial(_optimiser_step, tx=tx, flat=flat))
  masking.check_masking(config.objective.mask_prob, config.data.seq_len)
  if config.objective.whole_word_masking and (word_starts is None or len(word_starts) != config.data.vocab_size):
    raise ValueError("objective.whole_word_masking needs the tokenizer's word starts, one per data.vocab_size id "
                     "(run on prepared data)")
  sharding.check_batch(config.train.batch_size, mesh)
  accum_steps = config.train.grad_accum_steps
  accumulate.check(config.train.batch_size, accum_steps, mesh.shape["data"] * mesh.shape["fsdp"])
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  step_flops = objective.flops(flops.costs(model.config, config.objective, config.train.batch_size,
                                           config.data.seq_len))
  sharded = state_lib.create(functools.partial(objectives.init_params, model, config.objective.name,
                                               config.data.seq_len), tx, mesh)
  words = None if word_starts is None else np.asarray(word_starts, bool)
  kw = dict(model=model, objective=config.objective, special=special, word_starts=words)
  step = functools.partial(train_step, update=update, accum_steps=accum_steps,
                           nan_at_step=config.train.debug_nan_at_step, **kw)
  k = config.train.get("steps_per_dispatch", 1)  # .get: config.json of workdirs from before the key was added
  stepping = sharded if k == 1 else dataclasses.replace(sharded, batch=stacked(sharded.batch))
  evaluate_batch = sharded.jit_eval(functools.partial(eval_step, **kw))
  return Experiment(config, model, special, schedule, sharded, stepping.jit_step(step if k == 1 else scanned(step, k)),
                    evaluate_batch, step_flops, k, stepping.batch)


def stacked(batch: jax.sharding.NamedSharding) -> jax.sharding.NamedSharding:
  """The layout of batches stacked on a new leading axis, each split as `batch` splits one."""
  return jax.sharding.NamedSharding(batch.mesh, jax.sharding.PartitionSpec(None, *batch.spec))


def compile_targets(exp: Experiment) -> list[tuple[str, Callable, tuple]]:
  """The steps the loop runs, each with ShapeDtypeStructs of its arguments on the experiment's mesh: what aot.py
  compiles for a TPU slice without materialising anything."""
  state = exp.sharded.abstract()
  batch = aot.int_batch(exp.sharded.batch, exp.config.train.batch_size, exp.config.data.seq_len)
  rng = aot.key_struct(exp.sharded.replicated)
  k = exp.steps_per_dispatch
  batches = batch if k == 1 else jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((k, *x.shape), x.dtype, sharding=exp.step_batch), batch)
  return [("train step", exp.step, (state, batches, rng)), ("eval step", exp.eval, (state.params, batch, rng))]


def evaluate(exp: Experiment, params, batches, step: Callable | None = None) -> dict:
  """Metrics over `batches`, summed on device and fetched once: means, the discriminator's precision and recall on
  replaced tokens, and its ROC AUC (replaced vs original over every non-pad token). `step`: exp.eval, or that step
  compiled ahead for these shapes."""
  rng = jax.random.key(exp.config.train.seed + 1)
  totals, n = None, 0
  for batch in batches:
    out = (step or exp.eval)(params, batch, rng)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    n += 1
  if not n:
    return {}
  totals = jax.device_get(totals)
  result = {k: float(v) / n for k, v in totals.items() if k not in losses.SUMMED_METRICS}
  if "disc_true_positives" in totals:
    result["disc_precision"] = float(totals["disc_true_positives"] / max(totals["disc_predicted_positives"], 1.0))
    result["disc_recall"] = float(totals["disc_true_positives"] / max(totals["disc_label_positives"], 1.0))
    result["disc_auc"] = losses.roc_auc(totals["disc_auc_histogram"])
  return {f"eval_{k}": v for k, v in result.items()}
