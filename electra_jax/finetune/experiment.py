"""What a fine-tuning config compiles, before anything is written: the encoder's weights, the task's splits and head,
the model, optimiser and jitted steps, and each step's rows: a pure function of (train.seed, step), as its dropout rng
is, so a run resumed from a checkpoint ends as an uninterrupted one does."""
import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from electra_jax import config as config_lib
from electra_jax.data import input_pipeline
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import tasks
from electra_jax.finetune.heads import Head, head_type, Split
from electra_jax.hf import convert as hf_convert
from electra_jax.model import modeling
from electra_jax.parallel import aot, optim, sharding
from electra_jax.parallel import update as update_lib
from electra_jax.run import sources, weights


def train_loss(params, batch, rows, rng, *, model, loss):
  """The head's `loss` of a batch, dropout keyed on the step's `rng` folded with its first row (of `rows`)."""
  outputs = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], deterministic=False,
                        rngs={"dropout": jax.random.fold_in(rng, rows[0])})
  return loss(outputs, batch), {}


@functools.lru_cache(maxsize=1)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def batch_rows(step: int, seed: int, n: int, batch_size: int) -> np.ndarray:
  """The rows of 0-based `step`: its epoch's seeded permutation of n rows in batches (a last partial one dropped)."""
  epoch, i = divmod(step, n // batch_size)
  return _permutation(seed, epoch, n)[i * batch_size:(i + 1) * batch_size]


def learning_rate(configured: float, mc: modeling.ModelConfig) -> float:
  """train.learning_rate, or when 0 the paper's for the encoder's width (docs/finetuning.md, "The recipe")."""
  hidden = mc.discriminator.hidden_size
  return configured or (3e-4 if hidden <= 256 else 1e-4 if hidden <= 768 else 5e-5)


def layer_decay(configured: float, mc: modeling.ModelConfig) -> float:
  """train.layer_decay, or when 0 the paper's for the encoder's depth (docs/finetuning.md, "The recipe")."""
  layers = mc.discriminator.num_layers
  return configured or (1.0 if layers < 12 else 0.8 if layers < 24 else 0.9)


def recipe(train: ml_collections.ConfigDict, num_steps: int, num_layers: int) -> optim.Recipe:
  """train.optimizer's recipe, warmed up over train.warmup_fraction of num_steps, with layer-wise LR decay over
  `num_layers` (the rate and decay as configured: build_steps resolves them)."""
  return optim.Recipe(**{k: train[k] for k in optim.Recipe.KEYS}, warmup_steps=train.warmup_fraction * num_steps,
                      total_steps=num_steps, layer_decay=train.layer_decay, num_layers=num_layers)


def load_source(ft: ml_collections.ConfigDict, init: sources.Source | None, tokenizer: str, with_params: bool = True):
  """(the ModelConfig, the discriminator's encoder and embeddings (gdes folded in) in the Classifier's layout as host
  arrays, or None under random_init or without `with_params`) of `init`; of config.model's sizes and `tokenizer`'s
  vocabulary where `init` is None (random init)."""
  if init is not None:
    source = weights.read(init, ft.init_step or None, with_params=with_params and not ft.random_init)
    config, params = source.config, source.params
  else:
    config, params = config_lib.base(), None
    config.model.update(ft.model.to_dict())
    config.data.update(vocab_size=tokenizer_lib.Tokenizer(tokenizer).vocab_size, tokenizer=tokenizer)
  mc = modeling.ModelConfig.from_config(config)
  if params is None:
    return mc, None
  d = hf_convert.network_params(mc, params, "discriminator")
  return mc, jax.device_get({"embeddings": d["embeddings"], "discriminator": d["encoder"]})


def encoder_config(ft: ml_collections.ConfigDict, src: modeling.ModelConfig) -> modeling.ModelConfig:
  """The discriminator of the pre-training model `src` alone, in the shared layout, with the fine-tuning dropout."""
  return dataclasses.replace(src, embedding_sharing="shared", dropout_rate=ft.train.dropout_rate,
                             attention_dropout_rate=ft.train.dropout_rate)


@dataclasses.dataclass(frozen=True)
class Steps:
  """A run's optimiser and jitted steps on its mesh: built from the encoder, head and length alone (no data)."""
  learning_rate: float  # the peak rate, train.learning_rate resolved
  layer_decay: float  # train.layer_decay resolved
  schedule: Callable[[int], float]
  sharded: sharding.Sharded
  step_fn: Callable  # (state, batch, rng) -> (state, metrics), jitted; train.steps_per_dispatch steps a call
  step_batch: jax.sharding.NamedSharding  # the layout of step_fn's batch (k stacked on a leading axis where k > 1)
  predict: Callable  # (params, batch, rng) -> the head's outputs, jitted


@dataclasses.dataclass(frozen=True)
class Setup(Steps):
  """What a run builds from its config and inputs before it writes anything: its Steps and the rest."""
  ft: ml_collections.ConfigDict
  head: Head
  mc: modeling.ModelConfig  # the encoder's, with the fine-tuning dropout
  tokenizer_path: str
  pad_id: int
  encoder: dict | None  # init's encoder in the classifier's layout (host arrays); None: random init or resuming
  train: Split
  dev: Split | None  # the fold model selection uses, if any
  eval: Split
  test: Split | None  # rows to predict
  metric: str  # what model selection maximises
  seq_len: int
  steps_per_epoch: int
  num_steps: int
  eval_every: int
  rng: jax.Array

  def global_batch(self, examples: tasks.Examples, rows: np.ndarray,
                   layout: jax.sharding.NamedSharding | None = None) -> dict[str, jax.Array]:
    """The global batch of `rows` (or, given [k, batch] rows, k batches stacked), from this host's share of each,
    laid out as `layout` (default: one batch's)."""
    n = rows.shape[-1] // jax.process_count()
    local = rows[..., jax.process_index() * n:(jax.process_index() + 1) * n]
    return input_pipeline.to_global({k: getattr(examples, k)[local] for k in self.head.fields},
                                    layout or self.sharded.batch)

  def outputs(self, params, examples: tasks.Examples, predict: Callable | None = None) -> np.ndarray:
    """The head's outputs for every example once: the last batch is padded with copies of row 0, whose outputs are
    dropped. `predict`: self.predict, or that step compiled ahead for these shapes."""
    n, ebs = len(examples.labels), self.ft.train.eval_batch_size
    out = [(predict or self.predict)(params, self.global_batch(examples, np.arange(start, start + ebs) % n), self.rng)
           for start in range(0, n, ebs)]
    return np.concatenate(sharding.to_host(out))[:n]  # every host's rows, gathered


def make_setup(ft: ml_collections.ConfigDict, init: sources.Source | None, tokenizer_path: str,
               fresh: bool = True) -> Setup:
  """What `ft` builds from its plan's parts (`init`: None for random init; `fresh`: else a resumed run reads init's
  architecture alone): the data read and encoded, the model, its jitted steps; nothing is written."""
  src_mc, encoder = load_source(ft, init, tokenizer_path, with_params=fresh)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != src_mc.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{src_mc.vocab_size}")
  seq_len = min(ft.seq_len, src_mc.max_position_embeddings)
  head, train, eval_, test = head_type(ft.task).from_task(ft.task, tok, seq_len)
  metric = tasks.selection_metric(ft.task, head.selectable)
  rest, dev = tasks.carve(train.size, ft.task.dev_fraction, ft.task.num_train_examples, ft.task.split_seed)
  train, dev = head.take(train, rest), head.take(train, dev) if len(dev) else None

  mc = encoder_config(ft, src_mc)
  for key in ("min_steps", "patience", "reinit_layers"):
    if ft.train[key] < 0:
      raise ValueError(f"train.{key}={ft.train[key]} must be at least 0")
  if ft.train.reinit_layers > mc.discriminator.num_layers:
    raise ValueError(f"train.reinit_layers={ft.train.reinit_layers} exceeds the encoder's "
                     f"{mc.discriminator.num_layers} layers")
  steps_per_epoch = len(train.examples.labels) // ft.train.batch_size
  if not steps_per_epoch:
    raise ValueError(f"{len(train.examples.labels)} training examples do not fill one batch of {ft.train.batch_size}")
  whole = lambda steps: -(-steps // ft.train.steps_per_dispatch) * ft.train.steps_per_dispatch  # in whole dispatches
  num_steps = whole(max(ft.train.min_steps, math.ceil(ft.task.num_epochs * steps_per_epoch), 1))
  steps = build_steps(ft, head, mc, seq_len, num_steps)
  return Setup(
      ft=ft, head=head, mc=mc, tokenizer_path=tokenizer_path, pad_id=tok.special_ids.pad, encoder=encoder, train=train,
      dev=dev, eval=eval_, test=test, metric=metric, seq_len=seq_len, steps_per_epoch=steps_per_epoch,
      num_steps=num_steps, eval_every=ft.train.eval_every or (
          whole(max(steps_per_epoch, num_steps // 20)) if dev is not None else num_steps),
      rng=jax.random.fold_in(jax.random.key(ft.train.seed), 1),
      **{f.name: getattr(steps, f.name) for f in dataclasses.fields(steps)})


def build_steps(ft: ml_collections.ConfigDict, head: Head, mc: modeling.ModelConfig, seq_len: int, num_steps: int,
                devices=None) -> Steps:
  """The optimiser (rate and decay resolved) and the jitted train and predict steps on the mesh of `devices`."""
  given = recipe(ft.train, num_steps, mc.discriminator.num_layers)
  resolved = dataclasses.replace(given, learning_rate=learning_rate(given.learning_rate, mc),
                                 layer_decay=layer_decay(given.layer_decay, mc))
  optimizer = optim.build(resolved, devices)
  mesh = sharding.create_mesh(**ft.mesh, devices=devices)
  sharding.check_batch(ft.train.batch_size, mesh, ft.train.grad_accum_steps)
  sharding.check_batch(ft.train.eval_batch_size, mesh)
  model = head.module(mc, head.num_labels)
  dummy = jnp.zeros((1, seq_len), jnp.int32)
  sharded = sharding.create_state(lambda rng: model.init(rng, dummy, dummy)["params"], optimizer, mesh)
  update = update_lib.Update(optimizer, ft.train.grad_accum_steps)
  step_fn, step_batch = sharded.jit_steps(functools.partial(update_lib.step, update, loss_fn=functools.partial(
      train_loss, model=model, loss=head.loss)), ft.train.steps_per_dispatch)
  predict = sharded.jit_eval(lambda p, b, rng: model.apply({"params": p}, b["input_ids"], b["segment_ids"]))
  return Steps(resolved.learning_rate, resolved.layer_decay, optimizer.schedule, sharded, step_fn, step_batch, predict)


def compile_targets(ft: ml_collections.ConfigDict, head: Head, steps: Steps, seq_len: int) -> list:
  """The train and predict steps with ShapeDtypeStructs of their arguments (aot.py compiles them)."""
  state = steps.sharded.abstract()
  rng = aot.key_struct(steps.sharded.replicated)
  batch = lambda layout, rows, k=1: aot.int_batch(layout, rows, seq_len, k, labels=head.label_shape(rows, seq_len))
  return [("train step", steps.step_fn,
           (state, batch(steps.step_batch, ft.train.batch_size, ft.train.steps_per_dispatch), rng)),
          ("predict step", steps.predict, (state.params, batch(steps.sharded.batch, ft.train.eval_batch_size), rng))]
