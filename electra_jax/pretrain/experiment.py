"""What one pre-training config compiles: model, optimiser, the jitted train and eval steps, and the evaluation. The
config's sections become frozen dataclasses here, once (ObjectiveConfig, ModelConfig, optim.Recipe) for traced code."""
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import flops, losses, masking, modeling, objectives, two_stage
from electra_jax.parallel import aot, optim, sharding
from electra_jax.parallel import update as update_lib


def train_loss(params, batch, rows, rng, *, model, objective, special, word_starts=None, **stage):
  """mask → G → sample → D → loss of a batch's rows `rows` (objectives.compute_loss): what update.step differentiates."""
  return objectives.compute_loss(model, params, batch, rng, objective, special, word_starts, rows=rows, **stage)


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
  objective: objectives.ObjectiveConfig
  special: SpecialIds
  schedule: optax.Schedule
  sharded: sharding.Sharded
  step: Callable  # (state, batch, rng) -> (state, metrics); k steps on k stacked batches (steps_per_dispatch)
  eval: Callable  # (params, batch, rng) -> metrics
  step_flops: float  # the train step's model FLOPs (flops.py)
  steps_per_dispatch: int = 1  # k: `step` takes k batches stacked on a leading axis, laid out as `step_batch`
  step_batch: jax.sharding.NamedSharding | None = None  # the layout of `step`'s batch argument


def recipe(train: ml_collections.ConfigDict) -> optim.Recipe:
  """The pre-training optimiser of the train section: train.optimizer's recipe over train.num_steps."""
  return optim.Recipe(**{k: train[k] for k in optim.Recipe.KEYS}, warmup_steps=train.warmup_steps,
                      total_steps=train.num_steps)


def create(config: ml_collections.ConfigDict, special: SpecialIds = SpecialIds(), devices=None,
           word_starts=None) -> Experiment:
  """`special` and `word_starts` (objective.whole_word_masking's) are the tokenizer's (data/prepared.py reads them)."""
  train, seq_len = config.train, config.data.seq_len
  given = recipe(train)
  if config.objective.whole_word_masking and (word_starts is None or len(word_starts) != config.data.vocab_size):
    raise ValueError("objective.whole_word_masking needs the tokenizer's word starts, one per data.vocab_size id "
                     "(run on prepared data)")
  objective = objectives.ObjectiveConfig.from_config(config)
  entry = objectives.get(objective.name)
  masking.check_masking(objective.mask_prob, seq_len)
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  step_flops = entry.flops(flops.costs(model.config, objective, train.batch_size, seq_len))
  optimizer = optim.build(given, devices)
  mesh = sharding.create_mesh(**config.mesh, devices=devices)
  sharding.check_batch(train.batch_size, mesh, train.grad_accum_steps)
  stages = update_lib.Stages(objective.switch_step, two_stage.discriminator_from_generator,
                             two_stage.trained_in_stage1) if objective.switch_step else None
  update = update_lib.Update(optimizer, train.grad_accum_steps, losses.SUMMED_METRICS, stages,
                             train.debug_nan_at_step)
  sharded = sharding.create_state(functools.partial(objectives.init_params, model, objective.name, seq_len),
                                  optimizer, mesh)
  words = None if word_starts is None else np.asarray(word_starts, bool)
  kw = dict(model=model, objective=objective, special=special, word_starts=words)
  step = functools.partial(update_lib.step, update, loss_fn=functools.partial(train_loss, **kw))
  steps, step_batch = sharded.jit_steps(step, train.steps_per_dispatch)
  return Experiment(config, model, objective, special, optimizer.schedule, sharded, steps,
                    sharded.jit_eval(functools.partial(eval_step, **kw)), step_flops, train.steps_per_dispatch,
                    step_batch)


def compile_targets(exp: Experiment) -> list[tuple[str, Callable, tuple]]:
  """The steps the loop runs, each with ShapeDtypeStructs of its arguments on the experiment's mesh (for aot.py)."""
  state = exp.sharded.abstract()
  batch = functools.partial(aot.int_batch, batch=exp.config.train.batch_size, seq_len=exp.config.data.seq_len)
  rng = aot.key_struct(exp.sharded.replicated)
  return [("train step", exp.step, (state, batch(exp.step_batch, steps=exp.steps_per_dispatch), rng)),
          ("eval step", exp.eval, (state.params, batch(exp.sharded.batch), rng))]


def evaluate(exp: Experiment, params, batches, step: Callable | None = None) -> dict:
  """Metrics over `batches` summed on device (D's precision, recall and ROC AUC too) by `step` (default exp.eval)."""
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
