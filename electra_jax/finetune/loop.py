"""The fine-tuning loop's own part: restore or init as the run's plan says, evaluation and model selection inside
run/loop.py's loop, the results."""
import dataclasses
import functools
import json
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from electra_jax.finetune import hf_heads
from electra_jax.finetune import plan as plan_lib
from electra_jax.finetune.experiment import batch_rows, compile_targets, make_setup, Setup
from electra_jax.parallel import sharding
from electra_jax.parallel import state as state_lib
from electra_jax.run import checkpoints, goodput
from electra_jax.run import loop as loop_lib
from electra_jax.run import metrics as metrics_lib
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import storage

BEST_DIR = "best"
RESULTS_FILE = "eval_results.json"


def finetune(ft: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """Fine-tunes per `ft` in `workdir`, resuming from its latest checkpoint: `train` of the run's plan (plan.py)."""
  return train(plan_lib.resolve(ft, workdir))


def train(plan: plan_lib.Plan) -> dict | None:
  """Fine-tunes as `plan` says; returns the results (written to eval_results.json, last), or None when a signal
  stopped it (after saving). Bad input is a one-line ValueError/OSError before anything is written."""
  t0, clock = time.time(), goodput.Clock()
  ft, workdir, record = plan.ft, plan.workdir, plan.record()
  with workdir_lib.Lock(workdir, "electra-finetune") as lock:
    setup = make_setup(ft, plan.init, plan.tokenizer, fresh=plan.resume_step is None)
    # Every check passed: only now is anything written or deleted.
    if plan.replace:
      workdir_lib.empty(workdir)
    ckpt = checkpoints.Checkpointer(workdir, ft, setup.tokenizer_path)
    tuning = Tuning(setup, workdir, t0)
    state, tuning.progress = restore_or_init(setup, ckpt, plan)
    ckpt.check_start(int(state.step))
    workdir_lib.write_plan(workdir, ft, record)
    writer = metrics_lib.Writer(workdir, int(state.step))
    logging.info("Fine-tuning %d steps (%d training examples of %d, %d labels)", setup.num_steps,
                 len(setup.train.examples.labels), setup.train.size, setup.head.num_labels)
    settings = loop_lib.Settings.of(ft.train, setup.num_steps, setup.eval_every)
    tuning.ahead = loop_lib.compile_ahead(functools.partial(compile_targets, ft, setup.head, setup, setup.seq_len),
                                          "predict step")
    _, stopped = loop_lib.run(tuning, state, setup.step_fn, setup.rng, settings, desc="fine-tuning", ckpt=ckpt,
                              lock=lock, writer=writer, clock=clock, closers=(), done=tuning.converged)
    if stopped:
      return None
    progress, best = tuning.progress, tuning.progress.best
    results = dict(task=ft.task.name or ft.task.tfds_name or ft.task.train_file,
                   init_from=f"random init ({ft.init_from})" if ft.random_init else ft.init_from or "random",
                   num_train=setup.train.size, num_eval=setup.eval.size, num_steps=setup.num_steps,
                   stopped_early=progress.stopped_early, learning_rate=setup.learning_rate,
                   layer_decay=setup.layer_decay, steps_per_epoch=setup.steps_per_epoch, seed=ft.train.seed,
                   train_loss=float(np.mean(progress.losses)), labels=setup.head.names, metric=setup.metric,
                   seconds=tuning.seconds(), eval_metrics=list(best["eval"]))
    results.update(best["eval"])
    if setup.dev is not None:  # model selection on the dev fold, never on the eval split
      results.update(selected_step=best["step"], dev=best["dev"], history=progress.history)
    if jax.process_index() == 0:
      storage.write(epath.Path(workdir) / RESULTS_FILE, json.dumps(results, indent=2))
    return results


@dataclasses.dataclass
class Progress:
  """What the loop carries across a resume, in each checkpoint."""
  history: list[dict] = dataclasses.field(default_factory=list)  # every evaluation's record
  best: dict | None = None  # the record of the model in best/
  losses: list[float] = dataclasses.field(default_factory=list)  # the last epoch's
  seconds: float = 0.0  # the run's time before this session
  stopped_early: int | None = None  # the step at which the dev fold stopped improving (train.patience)


PROGRESS = "position"  # its key in a checkpoint's payload, as earlier versions saved it: their checkpoints resume


def restore_or_init(s: Setup, ckpt: checkpoints.Checkpointer,
                    plan: plan_lib.Plan) -> tuple[state_lib.TrainState, Progress]:
  """The latest checkpoint's state and progress, or a fresh state with init_from's encoder but its top reinit_layers."""
  if plan.resume_step is not None:
    restored = ckpt.restore(s.sharded.abstract(), set_aside_corrupt=True)
    logging.info("Resumed %s from step %d", plan.workdir, int(restored.state.step))
    return restored.state, Progress(**restored.extra[PROGRESS])
  state = s.sharded.init(jax.random.key(s.ft.train.seed))
  if s.encoder is None:
    return state, Progress()
  if jax.tree.map(np.shape, s.encoder) != jax.tree.map(lambda x: x.shape, state.params["electra"]):
    raise ValueError(f"{s.ft.init_from}: the checkpoint's encoder does not match its config")
  num_layers, fresh = s.mc.discriminator.num_layers, state.params["electra"]["discriminator"]
  top = {f"layer_{i}": fresh[f"layer_{i}"]  # the fresh init's top layers are kept
         for i in range(num_layers - s.ft.train.reinit_layers, num_layers)}
  loaded = dict(s.encoder, discriminator=dict(s.encoder["discriminator"], **top))
  electra = jax.device_put(loaded, s.sharded.state.params["electra"])
  return state.replace(params=dict(state.params, electra=electra)), Progress()


class Tuning:
  """What fine-tuning brings to loop.run: batches of the training rows, logs, evaluation and model selection (best/
  and its predictions), and its progress in each checkpoint."""

  def __init__(self, s: Setup, workdir: str, t0: float):
    self.s, self.workdir, self.t0 = s, workdir, t0
    self.progress = Progress()  # the run's, as restore_or_init found it
    self.ahead = None  # the future of the predict step compiled beside the first train step (loop.compile_ahead)
    self.logged = []  # the losses since the last log step

  def seconds(self) -> float:
    """The run's time, over every session up to now."""
    return round(self.progress.seconds + time.time() - self.t0, 1)

  def batch(self, step: int) -> dict[str, jax.Array]:
    """The batches of the dispatch that ends at `step`: stacked where it holds several steps."""
    s, train = self.s, self.s.ft.train
    k, n = train.steps_per_dispatch, len(s.train.examples.labels)
    rows = np.stack([batch_rows(i, train.seed, n, train.batch_size) for i in range(step - k, step)])
    return s.global_batch(s.train.examples, rows if k > 1 else rows[0], s.step_batch)

  def after_step(self, step: int, state: state_lib.TrainState, step_metrics: dict, losses: list[float],
                 log_now: bool, eval_now: bool, writer: metrics_lib.Writer) -> dict | None:
    self.progress.losses = (self.progress.losses + losses)[-self.s.steps_per_epoch:]
    self.logged += losses
    postfix = None
    if log_now:
      loss = np.mean(self.logged) if self.logged else None  # None: every step since the last row was not applied
      writer.write(step, dict(loss=loss, learning_rate=self.s.schedule(step - 1), grad_norm=step_metrics["grad_norm"],
                              elapsed_s=time.time() - self.t0))
      postfix, self.logged = dict(loss=f"{loss:.4f}") if self.logged else None, []
    if eval_now:
      self.evaluate(step, state.params, writer)
    return postfix

  def converged(self) -> bool:
    """Early stopping: past train.min_steps, the last train.patience evaluations did not beat the best dev score (in
    the checkpoint: a rerun does not train on)."""
    p, train = self.progress, self.s.ft.train
    if p.stopped_early is None and self.s.dev is not None and train.patience and p.history:
      step, best = p.history[-1]["step"], p.best["step"]
      since = sum(r["step"] > best for r in p.history)
      if train.min_steps <= step < self.s.num_steps and since >= train.patience:
        p.stopped_early = step
        logging.info("Stopped early at step %d: the dev fold's best is step %d's", step, best)
    return p.stopped_early is not None

  def extra(self) -> dict:
    return {PROGRESS: dataclasses.asdict(dataclasses.replace(self.progress, seconds=self.seconds()))}

  def evaluate(self, step: int, params, writer: metrics_lib.Writer):
    """Scores the eval split (and the dev fold); keeps the model in best/ when model selection picks it."""
    s = self.s
    eval_outputs = s.outputs(params, s.eval.examples, self.ahead.result())
    record = dict(step=step, eval=s.head.metrics(s.eval, eval_outputs))
    if s.dev is not None:
      record["dev"] = s.head.metrics(s.dev, s.outputs(params, s.dev.examples, self.ahead.result()))
    self.progress.history.append(record)
    writer.write(step, {f"{split}_{k}": v for split in ("dev", "eval") for k, v in record.get(split, {}).items()})
    if self.selects(record):
      self.save_best(record, params, eval_outputs)
    logging.info("step %d: %s", step, "; ".join(  # e.g. "dev accuracy 0.912, f1 0.905; eval accuracy 0.897, ..."
        f"{split} " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                for k, v in record[split].items())
        for split in ("dev", "eval") if split in record))

  def selects(self, record: dict) -> bool:
    """Model selection: the best dev score so far; without a dev fold, the last model (never one chosen on eval)."""
    if self.s.dev is None:
      return record["step"] == self.s.num_steps
    score = lambda r: float(np.nan_to_num(r["dev"][self.s.metric], nan=-1.0))
    return self.progress.best is None or score(record) > score(self.progress.best)

  def save_best(self, record: dict, params, eval_outputs: np.ndarray):
    """best/ and the predictions of the model `record` evaluated."""
    s = self.s
    self.progress.best = record
    best = f"{self.workdir}/{BEST_DIR}"  # every process gathers the parameters; process 0 writes
    hf_heads.save(s.mc, sharding.to_host(params), s.head.names, s.tokenizer_path, s.pad_id, best)
    splits = [("eval", s.eval, eval_outputs)]
    splits += [("test", s.test, s.outputs(params, s.test.examples, self.ahead.result()))] if s.test is not None else []
    for name, split, outputs in splits if jax.process_index() == 0 else ():  # every process computed the outputs
      storage.write(epath.Path(self.workdir) / f"predictions_{name}.jsonl",
                    "".join(json.dumps(r) + "\n" for r in s.head.prediction_rows(split, outputs)))
