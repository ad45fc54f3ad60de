"""The pre-training loop's own part: a workdir's checks, restore or init (the input position included), batches from
the input pipeline, logging with throughput, held-out evaluation; the shared loop (electra_jax/loop.py) runs the
steps, checkpoints and preemption."""
import copy
import time

import jax
import ml_collections
from absl import logging

from electra_jax import checkpoints, flops, goodput, sources, storage, weights
from electra_jax import loop as loop_lib
from electra_jax import metrics as metrics_lib
from electra_jax import workdir as workdir_lib
from electra_jax.data import input_pipeline
from electra_jax.data import prepared as prepared_lib
from electra_jax.pretrain import experiment
from electra_jax.state import TrainState


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> TrainState:
  """Pre-trains per `config` in `workdir` (config.json, checkpoints/, metrics.jsonl, tensorboard/), resuming from the
  latest checkpoint there. Stops early, after saving, on SIGTERM/SIGINT; raises FloatingPointError on a NaN/Inf loss
  or gradient (never saving it). Bad input raises ValueError/OSError before anything is written. Holds the workdir's
  lock (workdir.Lock) throughout: a second writer there is refused."""
  clock = goodput.Clock()
  config = copy.deepcopy(sources.with_init_tokenizer(config))
  # config.json names the prepared data by its absolute path: export and init_from read the tokenizer through it,
  # from whatever directory they run in.
  config.data.data_dir = storage.absolute(config.data.data_dir)
  # The data found from data_dir and seq_len: config.json records the settings it was prepared with.
  config = prepared_lib.resolve(config)
  loop_lib.check_config(config.train, "num_steps", "eval_every")
  workdir_lib.check_workdir(workdir, config, allow_config_change)
  with workdir_lib.Lock(workdir, "electra-pretrain") as lock:
    return _train(config, workdir, lock, clock)


def _train(config: ml_collections.ConfigDict, workdir: str, lock: workdir_lib.Lock,
           clock: goodput.Clock) -> TrainState:
  prepared = prepared_lib.load(config)
  exp = experiment.create(config, prepared.special_ids, word_starts=prepared.word_starts)
  ckpt = checkpoints.Checkpointer(workdir, config, prepared.tokenizer_path)
  state, position, rng = restore_or_init(exp, ckpt, prepared.tokenizer_path)
  start, num_steps = int(state.step), config.train.num_steps
  if start > num_steps:
    raise ValueError(f"workdir {workdir} is at step {start}, past train.num_steps={num_steps}: raise "
                     "--config.train.num_steps to continue it")
  train_iter = input_pipeline.train_iterator(config, prepared, state=position)
  # Every check passed: only now is anything written.
  workdir_lib.write_config(workdir, config)
  writer = metrics_lib.Writer(workdir, start)
  body = PreTraining(exp, prepared, train_iter, writer, start)
  state, _ = loop_lib.run(body, state, exp.step, rng, desc="pre-training", num_steps=num_steps,
                          log_every=config.train.log_every, eval_every=config.train.eval_every, ckpt=ckpt, lock=lock,
                          writer=writer, clock=clock, closers=(train_iter.close,),
                          profile_steps=config.train.profile_steps, peer_timeout_s=config.train.peer_timeout_s)
  return state


class PreTraining:
  """What pre-training brings to loop.run: the input pipeline's batches, a metrics.jsonl row (throughput included,
  held-out evaluation at eval steps) at each log step, and the input position in each checkpoint."""

  def __init__(self, exp: experiment.Experiment, prepared: prepared_lib.PreparedData,
               train_iter: input_pipeline.TrainIterator, writer: metrics_lib.Writer, start: int):
    self.exp, self.prepared, self.train_iter, self.writer = exp, prepared, train_iter, writer
    self.tokens_per_step = exp.config.train.batch_size * exp.config.data.seq_len
    self.step_flops = flops.step_flops(exp.config)
    self.t0 = self.last_time = time.time()
    self.last_step = start

  def batch(self, step: int) -> dict[str, jax.Array]:
    del step  # the iterator is at it
    return input_pipeline.to_global(next(self.train_iter), self.exp.sharded.batch)

  def after_step(self, step: int, state: TrainState, step_metrics: dict, losses: list[float], log_now: bool,
                 eval_now: bool) -> dict | None:
    del losses  # a row reports its own step's metrics
    if not (log_now or eval_now):
      return None
    scalars = {k: v for k, v in jax.device_get(step_metrics).items() if not k.startswith("disc_") or
               k in ("disc_loss", "disc_accuracy")}
    now = time.time()
    scalars.update(flops.throughput(self.step_flops, self.tokens_per_step * (step - self.last_step),
                                    now - self.last_time))
    scalars.update(learning_rate=self.exp.schedule(step - 1), elapsed_s=now - self.t0)
    if eval_now:
      held_out = (input_pipeline.to_global(b, self.exp.sharded.batch)
                  for b in input_pipeline.validation_batches(self.exp.config, self.prepared))
      scalars.update(experiment.evaluate(self.exp, state.params, held_out))
    self.writer.write(step, {k: scalars.get(k) for k in metrics_lib.TRAIN_FIELDS} | scalars)
    self.last_step, self.last_time = step, time.time()
    return dict(loss=f"{scalars['loss']:.3f}", tok_s=f"{scalars['tokens_per_sec']:.0f}")

  def extra(self) -> dict:
    """The input position, in global batches of train.batch_size."""
    return dict(position=self.train_iter.get_state(), batch_size=self.exp.config.train.batch_size)


def restore_or_init(exp: experiment.Experiment, ckpt: checkpoints.Checkpointer, tokenizer_path: str):
  """(state, input position, rng) the run starts from: the latest checkpoint of its workdir on the current mesh, or
  fresh from train.seed with train.init_from's weights when set, and with its optimiser state and step too under
  train.init_from_state (a second phase on other data: the input position starts afresh)."""
  train = exp.config.train
  rng = jax.random.fold_in(jax.random.key(train.seed), 1)
  if ckpt.latest_step() is None:
    if train.init_from_state:
      return weights.state_for_config(exp.config, exp.sharded, tokenizer_path), None, rng
    state = exp.sharded.init(jax.random.key(train.seed))
    if train.init_from:
      state = state.replace(params=weights.for_config(exp.config, exp.sharded, tokenizer_path))
    return state, None, rng
  try:
    restored = ckpt.restore(exp.sharded.abstract(), set_aside_corrupt=True)
  except checkpoints.OtherModelError as e:
    vocab, ours = e.saved_config.get("data", {}).get("vocab_size"), exp.config.data.vocab_size
    if vocab in (None, ours):
      raise
    raise ValueError(f"{e.where} has a {vocab}-token vocabulary but this run's tokenizer and model have {ours} "
                     "(data.vocab_size): resume with the tokenizer it was trained with") from e
  step = int(restored.state.step)
  logging.info("Resumed from step %d onto a %s mesh", step, dict(exp.sharded.mesh.shape))
  position = _input_position(restored.extra, exp.config.train.batch_size, step)
  return restored.state, position, rng if restored.rng is None else restored.rng


def _input_position(extra: dict, batch_size: int, step: int) -> dict:
  """The input position checkpoint `step` saved, in global batches of `batch_size` (the same on any host count):
  after a change of train.batch_size, the batch that follows the examples already seen."""
  position = dict(extra.get("position") or {})
  old = extra.get("batch_size", batch_size)
  if old != batch_size and "step" in position:
    seen = position["step"] * old
    position["step"] = seen // batch_size
    logging.warning("train.batch_size changed from %d to %d since step %d was saved: the input continues after the "
                    "%d examples already seen (at batch %d of size %d), and the learning-rate schedule continues at "
                    "step %d", old, batch_size, step, seen, position["step"], batch_size, step)
  return position
