"""The train state, the one pure train step, its jit over the mesh, and the pre-training loop."""
import dataclasses
import functools
import math
import sys
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging

from electra_jax import checkpoints, modeling, objectives, optim, preemption, sharding
from electra_jax import metrics as metrics_lib
from electra_jax.special_ids import SpecialIds


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


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
  mesh: jax.sharding.Mesh
  schedule: optax.Schedule
  state_sharding: Any
  batch_sharding: jax.sharding.NamedSharding
  init: Callable[[jax.Array], TrainState]
  step: Callable
  eval: Callable

  @property
  def step_flops(self) -> float:
    c = self.config
    return metrics_lib.train_flops(self.model.config, c.objective.name, c.objective.mask_prob, c.train.batch_size,
                                   c.data.seq_len, c.objective.two_stage_fraction)


def create(config: ml_collections.ConfigDict, special: SpecialIds = SpecialIds(), devices=None) -> Experiment:
  if config.objective.name not in objectives.OBJECTIVES:
    raise ValueError(f"objective.name={config.objective.name!r}: expected one of {', '.join(objectives.OBJECTIVES)}")
  two_stage_switch = objectives.two_stage_switch_step(config) if config.objective.name == "two_stage" else 0
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  mesh = sharding.create_mesh(config.mesh, devices)
  sharding.check_batch(config.train.batch_size, mesh)
  tx, schedule = optim.create(config.train)
  seq_len = config.data.seq_len
  dummy_ids = jnp.ones((1, seq_len), jnp.int32)
  dummy_positions = jnp.zeros((1, objectives.max_predictions(config.objective.mask_prob, seq_len)), jnp.int32)

  def init_boxed(rng):
    params = model.init(rng, dummy_ids, jnp.zeros_like(dummy_ids), dummy_positions,
                        objective=config.objective.name)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  state_sharding = sharding.tree_shardings(jax.eval_shape(init_boxed, jax.random.key(0)), mesh)
  batch_sharding = sharding.batch_sharding(mesh)
  rep = sharding.replicated(mesh)
  init = jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=state_sharding)
  kw = dict(model=model, objective=config.objective, special=special)
  step = jax.jit(functools.partial(train_step, tx=tx, nan_at_step=config.train.debug_nan_at_step,
                                   two_stage_switch=two_stage_switch, **kw),
                 in_shardings=(state_sharding, batch_sharding, rep), out_shardings=(state_sharding, rep),
                 donate_argnums=(0,))
  evaluate = jax.jit(functools.partial(eval_step, **kw),
                     in_shardings=(state_sharding.params, batch_sharding, rep), out_shardings=rep)
  return Experiment(config, model, special, mesh, schedule, state_sharding, batch_sharding, init, step, evaluate)


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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> TrainState:
  """Pre-trains per `config` in `workdir` (config.json, checkpoints/, metrics.jsonl, tensorboard/), resuming from the
  latest checkpoint there. Stops early, after saving, on SIGTERM/SIGINT; raises FloatingPointError on a NaN/Inf loss
  or gradient (never saving it). Bad input raises ValueError/OSError before anything is written."""
  _check_loop_config(config.train)
  checkpoints.check_workdir(workdir, config, allow_config_change)
  # TensorFlow lives only in the data code; import it here so the model and step never need it.
  from electra_jax import prepare  # pylint: disable=g-import-not-at-top
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  prepared = prepare.load(config)
  exp = create(config, prepared.special_ids)
  ckpt = checkpoints.Checkpointer(workdir, config, prepared.tokenizer_path)
  state, data_state, rng = _restore_or_init(exp, ckpt, prepared.tokenizer_path)
  start, num_steps = int(state.step), config.train.num_steps
  if start > num_steps:
    raise ValueError(f"workdir {workdir} is at step {start}, past train.num_steps={num_steps}: raise "
                     "--config.train.num_steps to continue it")
  train_iter = input_pipeline.train_iterator(config, prepared, state=data_state)
  # Every check passed: only now is anything written.
  checkpoints.write_config(workdir, config)
  checkpoints.rewind_metrics(workdir, start)
  writer = metrics_lib.Writer(workdir, start)
  tokens_per_step = config.train.batch_size * config.data.seq_len

  bar = tqdm(total=num_steps, initial=start, desc="pre-training", unit="step", dynamic_ncols=True,
             disable=jax.process_index() != 0)
  t0 = last_time = time.time()
  last_step, previous = start, None
  with preemption.Watcher() as watcher:
    try:
      for step in range(start + 1, num_steps + 1):
        batch = input_pipeline.to_global(next(train_iter), exp.batch_sharding)
        state, step_metrics = exp.step(state, batch, rng)
        # Keep at most two steps in flight: enough to overlap host and device, and multi-process CPU needs the sync.
        if previous is not None:
          _check_finite(step - 1, previous, ckpt)
        previous = step_metrics
        bar.update()
        stop = watcher.reached(step)
        eval_now = step % config.train.eval_every == 0 or step == num_steps
        if step % config.train.log_every == 0 or eval_now:
          _check_finite(step, step_metrics, ckpt)
          scalars = {k: v for k, v in jax.device_get(step_metrics).items() if not k.startswith("disc_") or
                     k in ("disc_loss", "disc_accuracy")}
          now = time.time()
          scalars.update(metrics_lib.throughput(exp.step_flops, tokens_per_step * (step - last_step), now - last_time))
          scalars.update(learning_rate=exp.schedule(step - 1), elapsed_s=now - t0)
          if eval_now:
            scalars.update(evaluate(exp, state.params, (input_pipeline.to_global(b, exp.batch_sharding) for b in
                                                        input_pipeline.validation_batches(config, prepared))))
          writer.write(step, {k: scalars.get(k) for k in metrics_lib.TRAIN_FIELDS} | scalars)
          bar.set_postfix(loss=f"{scalars['loss']:.3f}", tok_s=f"{scalars['tokens_per_sec']:.0f}")
          last_step, last_time = step, time.time()
        if stop or step == num_steps or ckpt.should_save(step):
          _check_finite(step, step_metrics, ckpt)  # never save a NaN state
          ckpt.save(step, state, train_iter.get_state(), force=True, rng=rng)
        if stop:
          logging.warning("Stopped by %s after step %d, saved to %s: run the same command to resume",
                          watcher.signal or "a preemption notice", step, ckpt.directory)
          break
    finally:
      # Every closer runs (ckpt.close waits for a pending save and cleans up a failed one), and none replaces the
      # loop's own error: a closer's error is raised only when the loop had none, and only the first one.
      error, closing_error = sys.exc_info()[1], None
      for close in (bar.close, train_iter.close, writer.close, ckpt.close):
        try:
          close()
        except Exception as e:  # pylint: disable=broad-except
          if error or closing_error:
            logging.warning("%s also failed: %s", close.__qualname__, " ".join(str(e).split()))
          else:
            closing_error = e
      if closing_error:
        raise closing_error
  return state


def _check_loop_config(train_config: ml_collections.ConfigDict):
  for key in ("num_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    if train_config[key] < 1:
      raise ValueError(f"train.{key}={train_config[key]} must be at least 1")


def _check_finite(step: int, step_metrics: dict, ckpt: checkpoints.Checkpointer):
  loss, grad_norm = (float(v) for v in jax.device_get((step_metrics["loss"], step_metrics["grad_norm"])))
  if math.isfinite(loss) and math.isfinite(grad_norm):
    return
  where = f"loss={loss} grad_norm={grad_norm} at step {step}"
  if ckpt.last_saved is None and ckpt.restored_step == step - 1:  # no good step since the restore vouches for it
    raise FloatingPointError(f"{where}, the first step after resuming from step {step - 1}: that checkpoint may be "
                             f"corrupt ({ckpt.directory}/{step - 1}); move it aside to resume from the one before, "
                             "or use a new --workdir")
  kept = ckpt.latest_step() if ckpt.last_saved is None else ckpt.last_saved
  raise FloatingPointError(f"{where}: stopped without saving it; the last good checkpoint is kept (step {kept} "
                           f"under {ckpt.directory})" if kept else f"{where}: stopped (no checkpoint yet)")


def _restore_or_init(exp: Experiment, ckpt: checkpoints.Checkpointer, tokenizer_path: str):
  """(state, input position, rng) from the latest checkpoint on the current mesh, or fresh from train.seed (with
  train.init_from's weights when set)."""
  seed = exp.config.train.seed
  rng = jax.random.fold_in(jax.random.key(seed), 1)
  abstract_state = jax.eval_shape(exp.init, jax.random.key(seed))
  if ckpt.latest_step() is None:
    state = exp.init(jax.random.key(seed))
    if exp.config.train.init_from:
      state = state.replace(params=_imported_params(exp, abstract_state.params, tokenizer_path))
    return state, None, rng
  restored = ckpt.restore(checkpoints.abstract(abstract_state, exp.state_sharding), set_aside_corrupt=True)
  logging.info("Resumed from step %d onto a %s mesh", int(restored.state.step), dict(exp.mesh.shape))
  return restored.state, restored.data_state, rng if restored.rng is None else restored.rng


def _imported_params(exp: Experiment, abstract_params, tokenizer_path: str):
  """train.init_from's weights on the mesh, after checking they fit the config and the data's tokenizer."""
  from electra_jax import export  # pylint: disable=g-import-not-at-top
  source = exp.config.train.init_from
  if not export.is_hf_dir(source):
    raise FileNotFoundError(f"train.init_from={source} is not an HF ELECTRA directory (no config.json with a "
                            "model_type)")
  if checkpoints.fingerprint(export.tokenizer_file(source)) != checkpoints.fingerprint(tokenizer_path):
    raise ValueError(f"train.init_from={source}: its tokenizer is not the one the data was prepared with; prepare "
                     f"with --config.data.tokenizer={export.tokenizer_file(source)}")
  _, params = export.import_hf(source)
  want = flax.traverse_util.flatten_dict(abstract_params, sep="/")
  got = flax.traverse_util.flatten_dict(params, sep="/")
  for path in sorted(want.keys() | got.keys()):
    if path not in got or path not in want or got[path].shape != want[path].shape:
      raise ValueError(f"train.init_from={source} does not fit this config at {path}: "
                       f"{got[path].shape if path in got else 'missing'} there, "
                       f"{want[path].shape if path in want else 'absent'} here (model sizes, vocabulary, "
                       "embedding_sharing and objective must match)")
  return jax.device_put(params, exp.state_sharding.params)
