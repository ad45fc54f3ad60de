"""The pre-training loop: a workdir's checks, restore or init, the jitted step (experiment.py), logging, evaluation,
checkpoints and preemption."""
import math
import time

import jax
import ml_collections
from absl import logging

from electra_jax import checkpoints, closing, experiment, flops, preemption, weights
from electra_jax import metrics as metrics_lib
from electra_jax import workdir as workdir_lib
from electra_jax.state import TrainState


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> TrainState:
  """Pre-trains per `config` in `workdir` (config.json, checkpoints/, metrics.jsonl, tensorboard/), resuming from the
  latest checkpoint there. Stops early, after saving, on SIGTERM/SIGINT; raises FloatingPointError on a NaN/Inf loss
  or gradient (never saving it). Bad input raises ValueError/OSError before anything is written. Holds the workdir's
  lock (workdir.Lock) throughout: a second writer there is refused."""
  config = weights.with_init_tokenizer(config)
  _check_loop_config(config.train)
  workdir_lib.check_workdir(workdir, config, allow_config_change)
  with workdir_lib.Lock(workdir, "electra-pretrain") as lock:
    return _train(config, workdir, lock)


def _train(config: ml_collections.ConfigDict, workdir: str, lock: workdir_lib.Lock) -> TrainState:
  # TensorFlow lives only in the data code; import it here so the model and step never need it.
  from electra_jax.data import prepared as prepared_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  prepared = prepared_lib.load(config)
  exp = experiment.create(config, prepared.special_ids)
  ckpt = checkpoints.Checkpointer(workdir, config, prepared.tokenizer_path)
  state, data_state, rng = _restore_or_init(exp, ckpt, prepared.tokenizer_path)
  start, num_steps = int(state.step), config.train.num_steps
  if start > num_steps:
    raise ValueError(f"workdir {workdir} is at step {start}, past train.num_steps={num_steps}: raise "
                     "--config.train.num_steps to continue it")
  train_iter = input_pipeline.train_iterator(config, prepared, state=data_state)
  # Every check passed: only now is anything written.
  workdir_lib.write_config(workdir, config)
  writer = metrics_lib.Writer(workdir, start)
  tokens_per_step = config.train.batch_size * config.data.seq_len
  step_flops = flops.step_flops(config)

  bar = tqdm(total=num_steps, initial=start, desc="pre-training", unit="step", dynamic_ncols=True,
             disable=jax.process_index() != 0)
  t0 = last_time = time.time()
  last_step, previous = start, None
  with preemption.Watcher() as watcher:
    try:
      for step in range(start + 1, num_steps + 1):
        batch = input_pipeline.to_global(next(train_iter), exp.sharded.batch)
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
          scalars.update(flops.throughput(step_flops, tokens_per_step * (step - last_step), now - last_time))
          scalars.update(learning_rate=exp.schedule(step - 1), elapsed_s=now - t0)
          if eval_now:
            held_out = (input_pipeline.to_global(b, exp.sharded.batch)
                        for b in input_pipeline.validation_batches(config, prepared))
            scalars.update(experiment.evaluate(exp, state.params, held_out))
          writer.write(step, {k: scalars.get(k) for k in metrics_lib.TRAIN_FIELDS} | scalars)
          bar.set_postfix(loss=f"{scalars['loss']:.3f}", tok_s=f"{scalars['tokens_per_sec']:.0f}")
          last_step, last_time = step, time.time()
        if stop or step == num_steps or ckpt.should_save(step):
          _check_finite(step, step_metrics, ckpt)  # never save a NaN state
          lock.check()  # nor over another writer's checkpoints
          ckpt.save(step, state, train_iter.get_state(), force=True, rng=rng)
        if stop:
          logging.warning("Stopped by %s after step %d, saved to %s: run the same command to resume",
                          watcher.signal or "a preemption notice", step, ckpt.directory)
          break
    finally:
      closing.close_all((bar.close, train_iter.close, writer.close, ckpt.close))
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


def _restore_or_init(exp: experiment.Experiment, ckpt: checkpoints.Checkpointer, tokenizer_path: str):
  """(state, input position, rng) from the latest checkpoint on the current mesh, or fresh from train.seed (with
  train.init_from's weights when set)."""
  seed = exp.config.train.seed
  rng = jax.random.fold_in(jax.random.key(seed), 1)
  if ckpt.latest_step() is None:
    state = exp.sharded.init(jax.random.key(seed))
    if exp.config.train.init_from:
      state = state.replace(params=weights.for_config(exp.config, exp.sharded, tokenizer_path))
    return state, None, rng
  restored = ckpt.restore(exp.sharded.abstract(), set_aside_corrupt=True)
  logging.info("Resumed from step %d onto a %s mesh", int(restored.state.step), dict(exp.sharded.mesh.shape))
  return restored.state, restored.data_state, rng if restored.rng is None else restored.rng
