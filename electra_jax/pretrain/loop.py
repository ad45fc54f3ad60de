"""The pre-training loop's own part: restore or init as the plan says (the input position included), batches, logging
with throughput, held-out evaluation; run/loop.py runs the steps, checkpoints and preemption."""
import functools
import time
from typing import Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from electra_jax.data import input_pipeline
from electra_jax.data import prepared as prepared_lib
from electra_jax.model import flops
from electra_jax.parallel.state import TrainState
from electra_jax.pretrain import experiment
from electra_jax.pretrain import plan as plan_lib
from electra_jax.run import checkpoints, goodput, weights
from electra_jax.run import loop as loop_lib
from electra_jax.run import metrics as metrics_lib
from electra_jax.run import workdir as workdir_lib


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> TrainState:
  """Pre-trains per `config` in `workdir`, resuming from its latest checkpoint: `train` of the run's plan."""
  return train(plan_lib.resolve(config, workdir, allow_config_change))


def train(plan: plan_lib.Plan) -> TrainState:
  """Pre-trains as `plan` says, holding the workdir's lock; saves and stops on SIGTERM/SIGINT; FloatingPointError
  after train.max_bad_steps non-finite steps in a row; ValueError/OSError on bad input before anything is written."""
  clock = goodput.Clock()
  with workdir_lib.Lock(plan.workdir, "electra-pretrain") as lock:
    exp = experiment.create(plan.config, plan.data.special_ids, word_starts=plan.data.word_starts)
    return drive(exp, plan.data, plan.workdir, lock, clock, plan.start, checked=plan.write)


def drive(exp: experiment.Experiment, prepared: prepared_lib.PreparedData, workdir: str, lock: workdir_lib.Lock,
          clock: goodput.Clock, start: plan_lib.Start, checked: Callable[[], object] = lambda: None,
          step_fn: Callable | None = None) -> TrainState:
  """Pre-training's loop around `step_fn` (exp.step, or bench's); `checked()` runs once the first batch was read."""
  train = exp.config.train
  ckpt = checkpoints.Checkpointer(workdir, exp.config, prepared.tokenizer_path)
  state, saved, rng = restore_or_init(exp, ckpt, start)
  ckpt.check_start(int(state.step))
  body = PreTraining(exp, prepared, int(state.step), saved)
  checked()  # the last check: only now is anything written
  writer = metrics_lib.Writer(workdir, int(state.step))
  settings = loop_lib.Settings.of(train, train.num_steps, train.eval_every)
  state, _ = loop_lib.run(body, state, step_fn or exp.step, rng, settings, desc="pre-training", ckpt=ckpt, lock=lock,
                          writer=writer, clock=clock, closers=(body.train_iter.close,))
  return state


class PreTraining:
  """What pre-training brings to loop.run: batches, a metrics.jsonl row (throughput, evaluation) each log step, and
  the input position in each checkpoint (`extra`), resumed from `saved` (None: a fresh start)."""

  def __init__(self, exp: experiment.Experiment, prepared: prepared_lib.PreparedData, start: int,
               saved: dict | None = None):
    self.exp, self.prepared = exp, prepared
    train = exp.config.train
    self.tokens_per_step = train.batch_size * exp.config.data.seq_len
    self.learning_rate = host_function(exp.schedule)
    position = None if saved is None else input_pipeline.resume_position(saved, train.batch_size, start)
    self.train_iter = input_pipeline.OnDevice(input_pipeline.train_iterator(exp.config, prepared, state=position),
                                              exp.step_batch, steps=exp.steps_per_dispatch,
                                              stable=train.stable_batch_buffers)
    self.t0 = self.last_time = time.time()
    self.last_step = start
    self.held_out = None  # the validation split's reader, from the first evaluation on
    self.ahead = loop_lib.compile_ahead(functools.partial(experiment.compile_targets, exp), "eval step")

  def batch(self, step: int) -> dict[str, jax.Array]:
    del step  # the iterator is at it
    return next(self.train_iter)

  def after_step(self, step: int, state: TrainState | None, step_metrics: dict | None, losses: list[float],
                 log_now: bool, eval_now: bool, writer: metrics_lib.Writer) -> dict | None:
    del losses  # a row reports its own step's metrics
    if not (log_now or eval_now):
      return None
    scalars = {k: v for k, v in step_metrics.items()
               if not k.startswith("disc_") or k in ("disc_loss", "disc_accuracy")}
    now = time.time()
    scalars.update(flops.throughput(self.exp.step_flops, self.tokens_per_step, step - self.last_step,
                                    now - self.last_time))
    scalars.update(learning_rate=self.learning_rate(step - 1), elapsed_s=now - self.t0)
    if eval_now:
      self.held_out = self.held_out or input_pipeline.Reader(self.prepared.dataset_dir, "validation")
      held_out = (input_pipeline.to_global(b, self.exp.sharded.batch)
                  for b in input_pipeline.validation_batches(self.exp.config, self.prepared, reader=self.held_out))
      scalars.update(experiment.evaluate(self.exp, state.params, held_out, self.ahead.result()))
    writer.write(step, {k: scalars.get(k) for k in metrics_lib.TRAIN_FIELDS} | scalars)
    self.last_step, self.last_time = step, time.time()
    return dict(loss=f"{scalars['loss']:.3f}", tok_s=f"{scalars['tokens_per_sec']:.0f}")

  def extra(self) -> dict:
    """The input position, in global batches of train.batch_size."""
    return dict(position=self.train_iter.get_state(), batch_size=self.exp.config.train.batch_size)


def host_function(fn: Callable) -> Callable[[int], float]:
  """`fn` of a step (a schedule) compiled for this host's CPU: no eager op waits behind the accelerator's steps."""
  try:
    device = jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu
    device = jax.local_devices()[0]
  jitted = jax.jit(fn)
  call = lambda step: float(jitted(jax.device_put(np.int32(step), device)))
  call(0)
  return call


def restore_or_init(exp: experiment.Experiment, ckpt: checkpoints.Checkpointer, start: plan_lib.Start):
  """(state, the checkpoint's extra or None, rng) as `start` says: the latest checkpoint, or fresh from train.seed."""
  seed = exp.config.train.seed
  rng = jax.random.fold_in(jax.random.key(seed), 1)
  if start.resume_step is None:
    return weights.start_state(start.init, exp.sharded, seed, start.with_state, exp.config.train.num_steps), None, rng
  try:
    restored = ckpt.restore(exp.sharded.abstract(), set_aside_corrupt=True)
  except checkpoints.OtherModelError as e:
    vocab = e.saved_config["data"]["vocab_size"] if e.saved_config else None
    ours = exp.config.data.vocab_size
    if vocab in (None, ours):
      raise
    raise ValueError(f"{e.where} has a {vocab}-token vocabulary but this run's tokenizer and model have {ours} "
                     "(data.vocab_size): resume with the tokenizer it was trained with") from e
  logging.info("Resumed from step %d onto a %s mesh", int(restored.state.step), dict(exp.sharded.mesh.shape))
  return restored.state, restored.extra, rng if restored.rng is None else restored.rng
