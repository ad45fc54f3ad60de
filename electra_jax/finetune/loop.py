"""The fine-tuning loop, in named steps: the workdir's checks, setup (data, model, the jitted step of state.py),
restore or init, the loop (loop.py's, with evaluation and model selection), the results.

What is the task's own (the model's head and loss, the batch fields, metrics, predictions and best/) is
`Classification`'s: a token-classification or QA head would bring its own, and the rest stays as it is.

The batch of step i is a pure function of (train.seed, i) (one seeded permutation per epoch) and the dropout rng is
folded with the step, so a run resumed from a checkpoint ends as an uninterrupted one does.
"""
import dataclasses
import functools
import json
import math
import time
from typing import Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from etils import epath

from electra_jax import checkpoints, modeling, sharding, state as state_lib, storage
from electra_jax import loop as loop_lib
from electra_jax import metrics as metrics_lib
from electra_jax import tokenizer as tokenizer_lib
from electra_jax import weights
from electra_jax import workdir as workdir_lib
from electra_jax.data import input_pipeline
from electra_jax.finetune import hf_heads, model as model_lib, tasks

BEST_DIR = "best"
RESULTS_FILE = "eval_results.json"


# --- What the task brings ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Classification:
  """Sequence classification, or regression (no label names): ELECTRA's classification head on [CLS], cross-entropy
  or squared error, tasks.compute_metrics, a row per example in predictions_<split>.jsonl, and best/ as HF's
  ElectraForSequenceClassification."""
  names: list[str] | None  # the labels; None: regression
  fields: ClassVar[tuple[str, ...]] = ("input_ids", "segment_ids", "labels")  # of tasks.Examples, in each batch

  @property
  def num_labels(self) -> int:
    return 1 if self.names is None else len(self.names)

  def model(self, mc: modeling.ModelConfig) -> nn.Module:
    return model_lib.Classifier(mc, self.num_labels)

  def loss(self, logits: jax.Array, batch: dict) -> jax.Array:
    if self.names is None:
      return jnp.mean((logits[:, 0] - batch["labels"]) ** 2)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  def metrics(self, examples: tasks.Examples, logits: np.ndarray) -> dict:
    return tasks.compute_metrics(examples.labels, logits, self.num_labels)

  def prediction_rows(self, logits: np.ndarray) -> list[dict]:
    return tasks.prediction_rows(logits, self.names)

  def save(self, mc: modeling.ModelConfig, params, tokenizer_path: str, pad_id: int, directory: str):
    """Every process takes part (the parameters are gathered); process 0 writes."""
    hf_heads.save(mc, sharding.to_host(params), self.names, tokenizer_path, pad_id, directory)


def train_step(state: state_lib.TrainState, batch, rng, *, model, tx, loss):
  def loss_fn(params):
    outputs = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], deterministic=False,
                          rngs={"dropout": jax.random.fold_in(rng, state.step)})
    return loss(outputs, batch)

  value, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state_lib.TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state)
  return new_state, dict(loss=value, grad_norm=optax.global_norm(grads))


@functools.lru_cache(maxsize=1)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def batch_rows(step: int, seed: int, n: int, batch_size: int) -> np.ndarray:
  """The training rows of 0-based step `step`: epoch e's seeded permutation of the n rows, cut into batches (the
  incomplete last batch of an epoch is dropped)."""
  epoch, i = divmod(step, n // batch_size)
  return _permutation(seed, epoch, n)[i * batch_size:(i + 1) * batch_size]


# --- The run -----------------------------------------------------------------------------------------------------

def finetune(ft: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """Fine-tunes per `ft` in `workdir`, resuming from its latest checkpoint; returns the results (also written to
  eval_results.json, last), or None when stopped by SIGTERM/SIGINT (after saving: run it again to resume). Raises a
  one-line ValueError/OSError on bad input before anything is written, FloatingPointError on a NaN/Inf loss."""
  t0 = time.time()
  loop_lib.check_config(ft.train, "batch_size", "eval_batch_size")
  if ft.train.eval_every < 0:
    raise ValueError(f"train.eval_every={ft.train.eval_every} must be 0 (per epoch or at the end) or positive")
  storage.refuse_overlap(workdir, _inputs(ft), "--workdir")
  workdir_lib.check_writable(workdir)
  with workdir_lib.Lock(workdir, "electra-finetune") as lock:
    replace = _check_workdir(workdir, ft)
    setup = _setup(ft)
    # Every check passed: only now is anything written or deleted.
    if replace:
      _empty(workdir)
    ckpt = checkpoints.Checkpointer(workdir, ft, setup.tokenizer_path)
    state, progress = _restore_or_init(setup, ckpt, workdir)
    workdir_lib.write_config(workdir, ft)
    writer = metrics_lib.Writer(workdir, int(state.step))
    logging.info("Fine-tuning %d steps (%d examples, %d labels)", setup.num_steps, len(setup.train.labels),
                 setup.head.num_labels)
    tuning = Tuning(setup, workdir, writer, progress, t0)
    _, stopped = loop_lib.run(tuning, state, setup.step_fn, setup.rng, desc="fine-tuning", num_steps=setup.num_steps,
                              log_every=ft.train.log_every, eval_every=setup.eval_every, ckpt=ckpt, lock=lock,
                              closers=(writer.close, ckpt.close))
    return None if stopped else _results(setup, progress, tuning.seconds(), workdir)


def _inputs(ft: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """What a run reads, which its workdir (replaced with overwrite) must keep apart from."""
  task = ft.task
  paths = weights.inputs(ft.init_from) if ft.init_from else []
  paths += [(ft.tokenizer, "config.tokenizer")] if ft.tokenizer else []
  paths += [(task[k], f"task.{k}") for k in ("train_file", "eval_file", "test_file") if task[k]]
  return paths + ([(task.tfds_data_dir, "task.tfds_data_dir")] if task.tfds_name and task.tfds_data_dir else [])


def _check_workdir(workdir: str, ft: ml_collections.ConfigDict) -> bool:
  """True when the workdir must be emptied first (it holds another run and ft.overwrite); a run of the same config
  is resumed (log, evaluation and checkpoint cadence and the mesh may change); anything else is refused."""
  path = epath.Path(workdir)
  if not path.exists() or not any(p.name != workdir_lib.LOCK_FILE for p in path.iterdir()):
    return False
  changes = workdir_lib.changes_since(workdir, ft)
  if changes is None:
    what = f"holds files but no {path / 'config.json'}"
  elif changes:
    what = f"holds another run (its config.json differs: {'; '.join(changes)})"
  else:
    return False
  if not ft.overwrite:
    raise FileExistsError(f"workdir {workdir} {what}; pass --config.overwrite=true to replace it")
  return True


def _empty(workdir: str):
  logging.warning("Replacing %s (--config.overwrite)", workdir)
  for p in epath.Path(workdir).iterdir():
    if p.name != workdir_lib.LOCK_FILE:  # ours, held until the run ends
      p.rmtree() if p.is_dir() else p.unlink()


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run builds from its config and inputs before it writes anything."""
  ft: ml_collections.ConfigDict
  head: Classification
  mc: modeling.ModelConfig  # the encoder's, with the fine-tuning dropout
  tokenizer_path: str
  pad_id: int
  source: tuple  # init_from's (pre-training config, params or None for random init)
  train: tasks.Examples
  dev: tasks.Examples | None  # the fold model selection uses, if any
  eval: tasks.Examples
  test: tasks.Examples | None  # rows to predict
  metric: str  # what model selection maximises
  steps_per_epoch: int
  num_steps: int
  eval_every: int
  schedule: Callable[[int], float]
  sharded: state_lib.Sharded
  step_fn: Callable  # (state, batch, rng) -> (state, metrics), jitted
  predict: Callable  # (params, batch, rng) -> the head's outputs, jitted
  rng: jax.Array

  def global_batch(self, examples: tasks.Examples, rows: np.ndarray) -> dict[str, jax.Array]:
    """The global batch of `rows`, from this host's share of them."""
    n = len(rows) // jax.process_count()
    local = rows[jax.process_index() * n:(jax.process_index() + 1) * n]
    return input_pipeline.to_global({k: getattr(examples, k)[local] for k in self.head.fields}, self.sharded.batch)

  def outputs(self, params, examples: tasks.Examples) -> np.ndarray:
    """The head's outputs for every example once: the last batch is padded with copies of row 0, whose outputs are
    dropped."""
    n, ebs = len(examples.labels), self.ft.train.eval_batch_size
    out = [self.predict(params, self.global_batch(examples, np.arange(start, start + ebs) % n), self.rng)
           for start in range(0, n, ebs)]
    return np.concatenate(sharding.to_host(out))[:n]  # every host's rows, gathered


def _setup(ft: ml_collections.ConfigDict) -> Setup:
  src_config, src_params, tokenizer_path = model_lib.load_source(ft)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != src_config.data.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{src_config.data.vocab_size}")
  seq_len = min(ft.seq_len, src_config.model.max_position_embeddings)
  train, eval_, test, names = tasks.make_examples(ft.task, tok, seq_len)
  rest, dev = tasks.carve(len(train.labels), ft.task.dev_fraction, ft.task.num_train_examples, ft.task.split_seed)
  train, dev = train.take(rest), train.take(dev) if len(dev) else None
  head = Classification(names)

  # The discriminator alone, in the shared layout, with the fine-tuning dropout.
  mc = dataclasses.replace(modeling.ModelConfig.from_config(src_config), embedding_sharing="shared",
                           dropout_rate=ft.train.dropout_rate, attention_dropout_rate=ft.train.dropout_rate)
  model = head.model(mc)
  steps_per_epoch = len(train.labels) // ft.train.batch_size
  if not steps_per_epoch:
    raise ValueError(f"{len(train.labels)} training examples do not fill one batch of {ft.train.batch_size}")
  num_steps = max(1, math.ceil(ft.task.num_epochs * steps_per_epoch))
  tx, schedule = model_lib.optimizer(ft.train, num_steps, mc.discriminator.num_layers)

  mesh = sharding.create_mesh(ft.mesh)
  sharding.check_batch(ft.train.batch_size, mesh)
  sharding.check_batch(ft.train.eval_batch_size, mesh)
  dummy = jnp.zeros((1, seq_len), jnp.int32)
  sharded = state_lib.create(lambda rng: model.init(rng, dummy, dummy)["params"], tx, mesh)
  return Setup(
      ft=ft, head=head, mc=mc, tokenizer_path=tokenizer_path, pad_id=tok.special_ids.pad,
      source=(src_config, src_params), train=train, dev=dev, eval=eval_, test=test,
      metric=tasks.selection_metric(ft.task, names is None), steps_per_epoch=steps_per_epoch, num_steps=num_steps,
      eval_every=ft.train.eval_every or (steps_per_epoch if dev is not None else num_steps), schedule=schedule,
      sharded=sharded, step_fn=sharded.jit_step(functools.partial(train_step, model=model, tx=tx, loss=head.loss)),
      predict=sharded.jit_eval(lambda p, b, rng: model.apply({"params": p}, b["input_ids"], b["segment_ids"])),
      rng=jax.random.fold_in(jax.random.key(ft.train.seed), 1))


@dataclasses.dataclass
class Progress:
  """What the loop carries across a resume, in each checkpoint."""
  history: list[dict] = dataclasses.field(default_factory=list)  # every evaluation's record
  best: dict | None = None  # the record of the model in best/
  losses: list[float] = dataclasses.field(default_factory=list)  # the last epoch's
  seconds: float = 0.0  # the run's time before this session


PROGRESS = "position"  # its key in a checkpoint's payload, as earlier versions saved it: their checkpoints resume


def _restore_or_init(s: Setup, ckpt: checkpoints.Checkpointer, workdir: str) -> tuple[state_lib.TrainState, Progress]:
  """The latest checkpoint's state and progress on the current mesh, or a fresh state from train.seed (with
  init_from's encoder) and progress."""
  if ckpt.latest_step() is None:
    state = s.sharded.init(jax.random.key(s.ft.train.seed))
    src_config, src_params = s.source
    if src_params is not None:
      loaded = jax.device_get(model_lib.encoder_params(src_config, src_params))
      if jax.tree.map(np.shape, loaded) != jax.tree.map(lambda x: x.shape, state.params["electra"]):
        raise ValueError(f"{s.ft.init_from}: the checkpoint's encoder does not match its config")
      state = state.replace(params=dict(state.params,
                                        electra=jax.device_put(loaded, s.sharded.state.params["electra"])))
    return state, Progress()
  restored = ckpt.restore(s.sharded.abstract(), set_aside_corrupt=True)
  logging.info("Resumed %s from step %d", workdir, int(restored.state.step))
  return restored.state, Progress(**restored.extra[PROGRESS])


class Tuning:
  """What fine-tuning brings to loop.run: batches of the training rows, the mean loss at each log step, evaluation
  and model selection (best/ and the predictions of the model selected), and its progress in each checkpoint."""

  def __init__(self, s: Setup, workdir: str, writer: metrics_lib.Writer, progress: Progress, t0: float):
    self.s, self.workdir, self.writer, self.progress, self.t0 = s, workdir, writer, progress, t0
    self.logged = []  # the losses since the last log step

  def seconds(self) -> float:
    """The run's time, over every session up to now."""
    return round(self.progress.seconds + time.time() - self.t0, 1)

  def batch(self, step: int) -> dict[str, jax.Array]:
    s = self.s
    return s.global_batch(s.train, batch_rows(step - 1, s.ft.train.seed, len(s.train.labels), s.ft.train.batch_size))

  def after_step(self, step: int, state: state_lib.TrainState, step_metrics: dict, losses: list[float],
                 log_now: bool, eval_now: bool) -> dict | None:
    self.progress.losses = (self.progress.losses + losses)[-self.s.steps_per_epoch:]
    self.logged += losses
    postfix = None
    if log_now:
      loss = np.mean(self.logged)
      self.writer.write(step, dict(loss=loss, learning_rate=self.s.schedule(step - 1),
                                   grad_norm=step_metrics["grad_norm"], elapsed_s=time.time() - self.t0))
      postfix, self.logged = dict(loss=f"{loss:.4f}"), []
    if eval_now:
      self.evaluate(step, state.params)
    return postfix

  def extra(self) -> dict:
    return {PROGRESS: dataclasses.asdict(dataclasses.replace(self.progress, seconds=self.seconds()))}

  def evaluate(self, step: int, params):
    """Scores the eval split (and the dev fold); keeps the model in best/ when model selection picks it."""
    s = self.s
    eval_outputs = s.outputs(params, s.eval)
    record = dict(step=step, eval=s.head.metrics(s.eval, eval_outputs))
    if s.dev is not None:
      record["dev"] = s.head.metrics(s.dev, s.outputs(params, s.dev))
    self.progress.history.append(record)
    self.writer.write(step, {f"{split}_{k}": v for split in ("dev", "eval") for k, v in record.get(split, {}).items()})
    if self.selects(record):
      self.save_best(record, params, eval_outputs)
    logging.info("step %d: %s", step, {k: record[k] for k in ("dev", "eval") if k in record})

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
    s.head.save(s.mc, params, s.tokenizer_path, s.pad_id, f"{self.workdir}/{BEST_DIR}")
    splits = [("eval", eval_outputs)] + ([("test", s.outputs(params, s.test))] if s.test is not None else [])
    for split, outputs in splits:
      if jax.process_index() == 0:
        rows = s.head.prediction_rows(outputs)
        storage.write(epath.Path(self.workdir) / f"predictions_{split}.jsonl",
                      "".join(json.dumps(r) + "\n" for r in rows))


def _results(s: Setup, progress: Progress, seconds: float, workdir: str) -> dict:
  """The selected model's eval metrics and the run's facts, written to eval_results.json (process 0)."""
  ft, best = s.ft, progress.best
  results = dict(task=ft.task.name or ft.task.tfds_name or ft.task.train_file,
                 init_from=f"random init ({ft.init_from})" if ft.random_init else ft.init_from or "random",
                 num_train=len(s.train.labels), num_eval=len(s.eval.labels), num_steps=s.num_steps,
                 steps_per_epoch=s.steps_per_epoch, seed=ft.train.seed, train_loss=float(np.mean(progress.losses)),
                 labels=s.head.names, metric=s.metric, seconds=seconds)
  results.update(best["eval"])
  if s.dev is not None:  # model selection on the dev fold, never on the eval split
    results.update(selected_step=best["step"], dev=best["dev"], history=progress.history)
  if jax.process_index() == 0:
    storage.write(epath.Path(workdir) / RESULTS_FILE, json.dumps(results, indent=2))
  return results
