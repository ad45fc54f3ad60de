"""What each fine-tuning task type brings (its `Head`: Classification and regression, Tagging, QA; HEADS by task.type):
how its splits are read, encoded and carved, its model head and loss, metrics, prediction rows and best/'s HF class."""
import dataclasses
from typing import Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import qa, tasks, token_tasks
from electra_jax.finetune import model as model_lib
from electra_jax.finetune.config import METRICS


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
  """A task type's part of the loop. `selectable`: the metrics model selection may maximise, the default first;
  `label_shape(batch, seq_len)`: (shape, dtype) of a batch's labels."""
  names: list[str] | None  # the labels or tags; None: regression and QA
  fields: ClassVar[tuple[str, ...]] = ("input_ids", "segment_ids", "labels")  # of tasks.Examples, in each batch
  module: ClassVar[type[nn.Module]]  # finetune/model.py's, built as module(model_config, num_labels)
  selectable: ClassVar[tuple[str, ...]]

  @property
  def num_labels(self) -> int:
    return 1 if self.names is None else len(self.names)


@dataclasses.dataclass(frozen=True)
class Classification(Head):
  """Sequence classification or regression (no names): the head on [CLS], best/ an ElectraForSequenceClassification."""
  module: ClassVar = model_lib.Classifier

  @classmethod
  def from_task(cls, task, tok: tokenizer_lib.Tokenizer, seq_len: int):
    """(head, train, eval, test or None) of the task's rows."""
    train, eval_, test, names = tasks.make_examples(task, tok, seq_len)
    return cls(names), Split(None, train), Split(None, eval_), None if test is None else Split(None, test)

  @property
  def selectable(self) -> tuple[str, ...]:
    return METRICS[3:] if self.names is None else METRICS[:3]

  def label_shape(self, batch: int, seq_len: int):
    return (batch,), np.int32 if self.names else np.float32  # regression: a target per text

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
  """(rows, where from) of the train, eval and test (unlabelled; None without) files, by `read(path, labelled)`."""
  train, eval_ = tasks.file_rows(task, lambda path: read(path, True)).values()
  return train, eval_, (read(task.test_file, False), task.test_file) if task.test_file else None


@dataclasses.dataclass(frozen=True)
class Tagging(Head):
  """Token classification (token_tasks.py): a tag per word, conlleval's metrics, best/ ElectraForTokenClassification."""
  module: ClassVar = model_lib.TokenClassifier
  selectable: ClassVar = token_tasks.METRICS
  loss = staticmethod(token_tasks.loss)

  def label_shape(self, batch: int, seq_len: int):
    return (batch, seq_len), np.int32  # a tag per piece (IGNORE but at words' first pieces)

  @classmethod
  def from_task(cls, task, tok: tokenizer_lib.Tokenizer, seq_len: int):
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
  """Extractive QA (qa.py): doc-stride windows, the best span over a question's windows, SQuAD's exact match and F1,
  best/ as HF's ElectraForQuestionAnswering. Units: questions; the loop batches and predicts their windows."""
  max_answer_length: int = 30
  n_best_size: int = 20
  module: ClassVar = model_lib.QuestionAnswering
  selectable: ClassVar = qa.METRICS
  loss = staticmethod(qa.loss)

  @property
  def num_labels(self) -> int:
    return 2  # start, end

  def label_shape(self, batch: int, seq_len: int):
    return (batch, 2), np.int32  # the answer's start and end pieces

  @classmethod
  def from_task(cls, task, tok: tokenizer_lib.Tokenizer, seq_len: int):
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


def head_type(task) -> type[Head]:
  if task.type not in HEADS:
    raise ValueError(f"task.type={task.type!r}: expected one of {', '.join(HEADS)}")
  return HEADS[task.type]
