"""The fine-tuning loop, in named steps: the workdir's checks, setup (data, model, the jitted step of state.py),
restore or init, the loop (loop.py's, with evaluation and model selection), the results.

What is the task's own (its data's units and encoding, the model's head and loss, the batch fields, metrics,
predictions and best/) is its type's `Head`: `Classification` (and regression), `Tagging` (token classification) or
`QA`, chosen by task.type in HEADS; the rest is the same for all of them.

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

from electra_jax import accumulate, checkpoints, modeling, sharding, state as state_lib, storage
from electra_jax import loop as loop_lib
from electra_jax import metrics as metrics_lib
from electra_jax import tokenizer as tokenizer_lib
from electra_jax import weights
from electra_jax import workdir as workdir_lib
from electra_jax.data import input_pipeline
from electra_jax.finetune import hf_heads, model as model_lib, qa, tasks, token_tasks
from electra_jax.finetune.config import METRICS

BEST_DIR = "best"
RESULTS_FILE = "eval_results.json"


# --- What the task brings ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Split:
  """One split of a task: its units (tagging's sentences, QA's questions; for classification the examples themselves)
  and their encoding, whose examples the loop batches and predicts (a row per text, sentence or QA window)."""
  rows: list[dict] | None  # None: classification, whose units are its examples
  encoded: tasks.Examples | token_tasks.Encoded | qa.Features

  @property
  def examples(self) -> tasks.Examples:
    return self.encoded if self.rows is None else self.encoded.examples

  @property
  def size(self) -> int:
    """What a dev fold, a label budget and the results count: texts, sentences or questions."""
    return len(self.encoded.labels) if self.rows is None else len(self.rows)


@dataclasses.dataclass(frozen=True)
class Head:
  """What a task type brings to the loop: its model head and loss, how its splits are read, encoded and carved, its
  metrics (`selectable`: those model selection may maximise, the default first), prediction rows and best/ (the HF
  class of its head, hf_heads.py)."""
  names: list[str] | None  # the labels or tags; None: regression and QA
  fields: ClassVar[tuple[str, ...]] = ("input_ids", "segment_ids", "labels")  # of tasks.Examples, in each batch
  module: ClassVar[type[nn.Module]]  # finetune/model.py's, built as module(model_config, num_labels)
  selectable: ClassVar[tuple[str, ...]]

  @property
  def num_labels(self) -> int:
    return 1 if self.names is None else len(self.names)

  def model(self, mc: modeling.ModelConfig) -> nn.Module:
    return self.module(mc, self.num_labels)

  def save(self, mc: modeling.ModelConfig, params, tokenizer_path: str, pad_id: int, directory: str):
    """Every process takes part (the parameters are gathered); process 0 writes."""
    hf_heads.save(mc, sharding.to_host(params), self.names, tokenizer_path, pad_id, directory)


@dataclasses.dataclass(frozen=True)
class Classification(Head):
  """Sequence classification, or regression (no label names): ELECTRA's classification head on [CLS], cross-entropy
  or squared error, tasks.compute_metrics, a row per example in predictions_<split>.jsonl, and best/ as HF's
  ElectraForSequenceClassification."""
  module: ClassVar = model_lib.Classifier

  @classmethod
  def load(cls, task, tok: tokenizer_lib.Tokenizer, seq_len: int):
    """(head, train, eval, test or None) of the task's rows."""
    train, eval_, test, names = tasks.make_examples(task, tok, seq_len)
    return cls(names), Split(None, train), Split(None, eval_), None if test is None else Split(None, test)

  @property
  def selectable(self) -> tuple[str, ...]:
    return METRICS[3:] if self.names is None else METRICS[:3]

  def loss(self, logits: jax.Array, batch: dict) -> jax.Array:
    if self.names is None:
      return jnp.mean((logits[:, 0] - batch["labels"]) ** 2)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  def take(self, split: Split, index: np.ndarray) -> Split:
    return Split(None, split.encoded.take(index))

  def metrics(self, split: Split, logits: np.ndarray) -> dict:
    return tasks.compute_metrics(split.encoded.labels, logits, self.num_labels)

  def prediction_rows(self, split: Split, logits: np.ndarray) -> list[dict]:
    del split
    return tasks.prediction_rows(logits, self.names)


def _read_files(task, read: Callable[[str, bool], list[dict]]) -> tuple[tuple[list[dict], str], ...]:
  """(rows, where from) of the train, eval and test files (the test rows, unlabelled, None without task.test_file)
  of a task read by `read(path, labelled)`."""
  train, eval_ = tasks.file_rows(task, lambda path: read(path, True)).values()
  return train, eval_, (read(task.test_file, False), task.test_file) if task.test_file else None


@dataclasses.dataclass(frozen=True)
class Tagging(Head):
  """Token classification (token_tasks.py): a tag per word on its first piece, the loss over those pieces, entity
  precision, recall and F1 (conlleval's) and word accuracy, a row of tags per sentence, and best/ as HF's
  ElectraForTokenClassification. Units: sentences."""
  module: ClassVar = model_lib.TokenClassifier
  selectable: ClassVar = token_tasks.METRICS
  loss = staticmethod(token_tasks.loss)

  @classmethod
  def load(cls, task, tok: tokenizer_lib.Tokenizer, seq_len: int):
    """(head, train, eval, test or None) of task.train_file, eval_file and test_file: JSONL or column files."""
    splits = _read_files(task, lambda path, labelled: token_tasks.read_rows(path, task.tokens_field, task.tags_field,
                                                                            labelled))
    head = cls(token_tasks.tag_names(splits[0][0]))
    encode = lambda rows, where: Split(rows, token_tasks.encode(tok, rows, head.names, seq_len, where))
    return head, *(None if p is None else encode(*p) for p in splits)

  def take(self, split: Split, index: np.ndarray) -> Split:
    e = split.encoded
    return Split([split.rows[i] for i in index],
                 token_tasks.Encoded(e.examples.take(index), e.words[index], e.num_words[index]))

  def tags(self, split: Split, logits: np.ndarray) -> list[list[str]]:
    return token_tasks.predict(logits, split.encoded, self.names)

  def metrics(self, split: Split, logits: np.ndarray) -> dict:
    return token_tasks.compute_metrics([r["tags"] for r in split.rows], self.tags(split, logits))

  def prediction_rows(self, split: Split, logits: np.ndarray) -> list[dict]:
    return token_tasks.prediction_rows(self.tags(split, logits), split.rows)


@dataclasses.dataclass(frozen=True)
class QA(Head):
  """Extractive QA (qa.py): [CLS] question [SEP] window [SEP] features over doc-stride windows, the start/end loss,
  the best span over a question's windows, SQuAD's exact match and F1, a row per question, and best/ as HF's
  ElectraForQuestionAnswering. Units: questions; the loop batches and predicts their windows."""
  max_answer_length: int = 30
  n_best_size: int = 20
  module: ClassVar = model_lib.QuestionAnswering
  selectable: ClassVar = qa.METRICS
  loss = staticmethod(qa.loss)

  @property
  def num_labels(self) -> int:
    return 2  # start, end

  @classmethod
  def load(cls, task, tok: tokenizer_lib.Tokenizer, seq_len: int):
    """(head, train, eval, test or None) of task.train_file, eval_file and test_file: SQuAD v1.1 JSON."""
    encode = lambda rows: Split(rows, qa.encode(tok, rows, seq_len, task.doc_stride, task.max_query_length))
    return (cls(None, task.max_answer_length, task.n_best_size),
            *(None if p is None else encode(p[0]) for p in _read_files(task, qa.read_squad)))

  def take(self, split: Split, index: np.ndarray) -> Split:
    """The questions at `index` (sorted) and their windows, renumbered."""
    f = split.encoded
    windows = np.flatnonzero(np.isin(f.row, index))
    return Split([split.rows[i] for i in index], qa.Features(
        f.examples.take(windows), np.searchsorted(index, f.row[windows]).astype(np.int32), f.offsets[windows]))

  def answers(self, split: Split, logits: np.ndarray) -> list[tuple[str, float | None]]:
    return qa.predict(logits, split.encoded, split.rows, self.max_answer_length, self.n_best_size)

  def metrics(self, split: Split, logits: np.ndarray) -> dict:
    return qa.compute_metrics([text for text, _ in self.answers(split, logits)], split.rows)

  def prediction_rows(self, split: Split, logits: np.ndarray) -> list[dict]:
    return qa.prediction_rows(self.answers(split, logits), split.rows)


HEADS = {"classification": Classification, "regression": Classification, "token_classification": Tagging, "qa": QA}


def load_task(task, tok: tokenizer_lib.Tokenizer, seq_len: int) -> tuple[Head, Split, Split, Split | None]:
  """The head of task.type and its (train, eval, test or None) splits."""
  if task.type not in HEADS:
    raise ValueError(f"task.type={task.type!r}: expected one of {', '.join(HEADS)}")
  return HEADS[task.type].load(task, tok, seq_len)


def train_step(state: state_lib.TrainState, batch, rng, *, model, tx, loss, accum_steps=1):
  """One optax update from the gradient of `accum_steps` micro-batches of `batch` (accumulate.py)."""
  step_rng = jax.random.fold_in(rng, state.step)

  def loss_and_grad(micro, rows):
    # A dropout key per micro-batch (its first row's index); with one micro-batch, the step's key as before.
    key = jax.random.fold_in(step_rng, rows[0]) if accum_steps > 1 else step_rng

    def loss_fn(params):
      outputs = model.apply({"params": params}, micro["input_ids"], micro["segment_ids"], deterministic=False,
                            rngs={"dropout": key})
      return loss(outputs, micro), {}
    return jax.value_and_grad(loss_fn, has_aux=True)(state.params)

  (value, _), grads = accumulate.gradients(loss_and_grad, batch, accum_steps)
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
    setup = make_setup(ft)
    # Every check passed: only now is anything written or deleted.
    if replace:
      _empty(workdir)
    ckpt = checkpoints.Checkpointer(workdir, ft, setup.tokenizer_path)
    state, progress = _restore_or_init(setup, ckpt, workdir)
    workdir_lib.write_config(workdir, ft)
    writer = metrics_lib.Writer(workdir, int(state.step))
    logging.info("Fine-tuning %d steps (%d training examples of %d, %d labels)", setup.num_steps,
                 len(setup.train.examples.labels), setup.train.size, setup.head.num_labels)
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
  head: Head
  mc: modeling.ModelConfig  # the encoder's, with the fine-tuning dropout
  tokenizer_path: str
  pad_id: int
  source: tuple  # init_from's (pre-training config, params or None for random init)
  train: Split
  dev: Split | None  # the fold model selection uses, if any
  eval: Split
  test: Split | None  # rows to predict
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


def make_setup(ft: ml_collections.ConfigDict) -> Setup:
  """What `ft` builds (the data read and encoded, the model, its jitted step); nothing is written."""
  src_config, src_params, tokenizer_path = model_lib.load_source(ft)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != src_config.data.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{src_config.data.vocab_size}")
  seq_len = min(ft.seq_len, src_config.model.max_position_embeddings)
  head, train, eval_, test = load_task(ft.task, tok, seq_len)
  metric = tasks.selection_metric(ft.task, head.selectable)
  rest, dev = tasks.carve(train.size, ft.task.dev_fraction, ft.task.num_train_examples, ft.task.split_seed)
  train, dev = head.take(train, rest), head.take(train, dev) if len(dev) else None

  # The discriminator alone, in the shared layout, with the fine-tuning dropout.
  mc = dataclasses.replace(modeling.ModelConfig.from_config(src_config), embedding_sharing="shared",
                           dropout_rate=ft.train.dropout_rate, attention_dropout_rate=ft.train.dropout_rate)
  model = head.model(mc)
  steps_per_epoch = len(train.examples.labels) // ft.train.batch_size
  if not steps_per_epoch:
    raise ValueError(f"{len(train.examples.labels)} training examples do not fill one batch of {ft.train.batch_size}")
  num_steps = max(1, math.ceil(ft.task.num_epochs * steps_per_epoch))
  tx, schedule = model_lib.optimizer(ft.train, num_steps, mc.discriminator.num_layers)

  mesh = sharding.create_mesh(ft.mesh)
  sharding.check_batch(ft.train.batch_size, mesh)
  sharding.check_batch(ft.train.eval_batch_size, mesh)
  accumulate.check(ft.train.batch_size, ft.train.grad_accum_steps, mesh.shape["data"] * mesh.shape["fsdp"])
  dummy = jnp.zeros((1, seq_len), jnp.int32)
  sharded = state_lib.create(lambda rng: model.init(rng, dummy, dummy)["params"], tx, mesh)
  return Setup(
      ft=ft, head=head, mc=mc, tokenizer_path=tokenizer_path, pad_id=tok.special_ids.pad,
      source=(src_config, src_params), train=train, dev=dev, eval=eval_, test=test, metric=metric,
      steps_per_epoch=steps_per_epoch, num_steps=num_steps,
      eval_every=ft.train.eval_every or (steps_per_epoch if dev is not None else num_steps), schedule=schedule,
      sharded=sharded, step_fn=sharded.jit_step(functools.partial(train_step, model=model, tx=tx, loss=head.loss,
                                                          accum_steps=ft.train.grad_accum_steps)),
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
    n = len(s.train.examples.labels)
    return s.global_batch(s.train.examples, batch_rows(step - 1, s.ft.train.seed, n, s.ft.train.batch_size))

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
    eval_outputs = s.outputs(params, s.eval.examples)
    record = dict(step=step, eval=s.head.metrics(s.eval, eval_outputs))
    if s.dev is not None:
      record["dev"] = s.head.metrics(s.dev, s.outputs(params, s.dev.examples))
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
    splits = [("eval", s.eval, eval_outputs)]
    splits += [("test", s.test, s.outputs(params, s.test.examples))] if s.test is not None else []
    for name, split, outputs in splits:
      if jax.process_index() == 0:
        rows = s.head.prediction_rows(split, outputs)
        storage.write(epath.Path(self.workdir) / f"predictions_{name}.jsonl",
                      "".join(json.dumps(r) + "\n" for r in rows))


def _results(s: Setup, progress: Progress, seconds: float, workdir: str) -> dict:
  """The selected model's eval metrics and the run's facts, written to eval_results.json (process 0)."""
  ft, best = s.ft, progress.best
  results = dict(task=ft.task.name or ft.task.tfds_name or ft.task.train_file,
                 init_from=f"random init ({ft.init_from})" if ft.random_init else ft.init_from or "random",
                 num_train=s.train.size, num_eval=s.eval.size, num_steps=s.num_steps,
                 steps_per_epoch=s.steps_per_epoch, seed=ft.train.seed, train_loss=float(np.mean(progress.losses)),
                 labels=s.head.names, metric=s.metric, seconds=seconds)
  results.update(best["eval"])
  if s.dev is not None:  # model selection on the dev fold, never on the eval split
    results.update(selected_step=best["step"], dev=best["dev"], history=progress.history)
  if jax.process_index() == 0:
    storage.write(epath.Path(workdir) / RESULTS_FILE, json.dumps(results, indent=2))
  return results
