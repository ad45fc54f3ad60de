"""Extractive QA on SQuAD v1.1 JSON (docs/token_tasks.md): the reader, doc-stride windows over long contexts, the
start/end loss, each question's answer from its windows' logits, and SQuAD's exact match and F1 (as fractions)."""
import collections
import dataclasses
import json
import re
import string

import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.data import task_rows
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import tasks

METRICS = ("f1", "exact_match")


def _text(value, name: str, where: str) -> str:
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"{where}: {name} is {'blank' if isinstance(value, str) else task_rows.kind(value)}, not a text")
  return value


def _list(value, name: str, where: str) -> list:
  if not isinstance(value, list):
    raise ValueError(f"{where}: {name} is {task_rows.kind(value)}, not a list")
  return value


def _question(qa, context: str, where: str, labelled: bool) -> dict:
  if not isinstance(qa, dict):
    raise ValueError(f"{where}: {task_rows.kind(qa)}, not a question object")
  if not isinstance(qa.get("id"), (str, int)) or isinstance(qa.get("id"), bool):
    raise ValueError(f"{where}: 'id' is {task_rows.kind(qa.get('id'))}, not a string")
  where = f"{where} (id {qa['id']})"
  if qa.get("is_impossible"):
    raise ValueError(f"{where}: an unanswerable (SQuAD v2) question: only answerable ones are supported")
  answers = []
  for a, answer in enumerate(_list(qa.get("answers", []), "'answers'", where)):
    at = f"{where}: answers[{a}]"
    if not isinstance(answer, dict):
      raise ValueError(f"{at} is {task_rows.kind(answer)}, not an object")
    text, start = _text(answer.get("text"), "'text'", at), answer.get("answer_start")
    if not isinstance(start, int) or isinstance(start, bool) or context[start:start + len(text)] != text:
      raise ValueError(f"{at}: answer_start {json.dumps(start)} does not point at {json.dumps(text)} in the context")
    answers.append(dict(text=text, answer_start=start))
  if labelled and not answers:
    raise ValueError(f"{where}: no answers")
  return dict(id=str(qa["id"]), question=_text(qa.get("question"), "'question'", where), context=context,
              answers=answers)


def read_squad(path: str, labelled: bool = True) -> list[dict]:
  """The rows of a SQuAD v1.1 file (local or gs://): {"id", "question", "context", "answers"} (none unless labelled)."""
  try:
    data = json.loads(task_rows.read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: line {e.lineno}: invalid JSON ({e.msg}, column {e.colno})") from None
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise ValueError(f"{path}: not SQuAD JSON: expected an object with a \"data\" list")
  rows, seen = [], {}
  for i, article in enumerate(data["data"]):
    paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
    for j, para in enumerate(_list(paragraphs, "'paragraphs'", f"{path}: data[{i}]")):
      where = f"{path}: data[{i}].paragraphs[{j}]"
      if not isinstance(para, dict):
        raise ValueError(f"{where} is {task_rows.kind(para)}, not an object")
      context = _text(para.get("context"), "'context'", where)
      for k, qa in enumerate(_list(para.get("qas"), "'qas'", where)):
        row = _question(qa, context, f"{where}.qas[{k}]", labelled)
        if row["id"] in seen:
          raise ValueError(f"{where}.qas[{k}]: id {row['id']} is data{seen[row['id']]}'s too: ids must be unique")
        seen[row["id"]] = f"[{i}].paragraphs[{j}].qas[{k}]"
        rows.append(row)
  if not rows:
    raise ValueError(f"{path}: no questions")
  return rows


@dataclasses.dataclass
class Features:
  examples: tasks.Examples  # input_ids, segment_ids [N, L]; labels [N, 2] int32: answer start and end pieces
  row: np.ndarray  # [N] int32: the row (question) each window is of
  offsets: np.ndarray  # [N, L, 2] int32: each context piece's (begin, end) characters in the context, -1 elsewhere


def window_starts(n: int, window: int, doc_stride: int) -> list[int]:
  """Where windows of `window` pieces over n start, each sharing doc_stride with the next (HF's stride), to the end."""
  starts = [0]
  while starts[-1] + window < n:
    starts.append(starts[-1] + window - doc_stride)
  return starts


def encode(tok: tokenizer_lib.Tokenizer, rows: list[dict], seq_len: int, doc_stride: int,
           max_query_length: int) -> Features:
  """[CLS] question (its first max_query_length pieces) [SEP] context window [SEP] (segment 1 from the window on),
  for every window of every row; rows without answers (test rows) get (0, 0) labels."""
  if seq_len - 3 - max_query_length <= doc_stride:
    raise ValueError(f"doc_stride={doc_stride} leaves windows no new context: it must be below seq_len - 3 - "
                     f"max_query_length = {seq_len - 3 - max_query_length}")
  s = tok.special_ids
  ids, seg, labels, owner, offsets = [], [], [], [], []
  questions = tok.encode_batch([r["question"] for r in rows])
  unique = list(dict.fromkeys(r["context"] for r in rows))  # SQuAD asks several questions of each paragraph
  contexts = dict(zip(unique, tok.encode_with_offsets(unique)))
  for r, (row, question) in enumerate(zip(rows, questions)):
    pieces, spans = contexts[row["context"]]
    question = question[:max_query_length]
    first = len(question) + 2  # the position of a window's first context piece
    window = seq_len - 1 - first
    spans = np.asarray(spans, np.int32).reshape(-1, 2)
    answer = row["answers"][0] if row["answers"] else None
    for start in window_starts(len(pieces), window, doc_stride):
      end = min(start + window, len(pieces))
      x = [s.cls] + question + [s.sep] + pieces[start:end] + [s.sep]
      ids.append(x + [s.pad] * (seq_len - len(x)))
      seg.append([0] * first + [1] * (len(x) - first) + [0] * (seq_len - len(x)))
      off = np.full((seq_len, 2), -1, np.int32)
      off[first:first + end - start] = spans[start:end]
      offsets.append(off)
      owner.append(r)
      labels.append(_answer_pieces(off, answer))
  return Features(tasks.Examples(np.array(ids, np.int32), np.array(seg, np.int32), np.array(labels, np.int32)),
                  np.array(owner, np.int32), np.stack(offsets))


def _answer_pieces(off: np.ndarray, answer: dict | None) -> tuple[int, int]:
  """The first and last pieces of a window (offsets `off`) overlapping the answer, or (0, 0) unless it holds it all."""
  context = np.flatnonzero(off[:, 0] >= 0)
  if answer is None or not len(context):
    return 0, 0
  begin, end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
  if off[context[0], 0] > begin or off[context[-1], 1] < end:
    return 0, 0
  starts = context[off[context, 1] > begin]
  ends = context[off[context, 0] < end]
  return (int(starts[0]), int(ends[-1])) if len(starts) and len(ends) and starts[0] <= ends[-1] else (0, 0)


def loss(logits, batch: dict):
  """(cross-entropy of the start + of the end position) / 2, over logits [N, L, 2] and batch["labels"] [N, 2]."""
  return optax.softmax_cross_entropy_with_integer_labels(jnp.moveaxis(logits, -1, 1), batch["labels"]).mean()


def predict(logits: np.ndarray, feats: Features, rows: list[dict], max_answer_length: int = 30,
            n_best_size: int = 20) -> list[tuple[str, float | None]]:
  """Each row's answer and score (start + end logit): its windows' best span among each window's n_best_size best
  starts and ends, in the context, at most max_answer_length pieces; ("", None) where no window offers one."""
  logits = np.asarray(logits, np.float32)
  best = [("", None)] * len(rows)
  for f, (r, off) in enumerate(zip(feats.row, feats.offsets)):
    starts = np.argsort(-logits[f, :, 0], kind="stable")[:n_best_size]
    ends = np.argsort(-logits[f, :, 1], kind="stable")[:n_best_size]
    a, b = np.meshgrid(starts, ends, indexing="ij")
    ok = (off[a, 0] >= 0) & (off[b, 0] >= 0) & (b >= a) & (b - a < max_answer_length)
    if not ok.any():
      continue
    score = np.where(ok, logits[f, a, 0] + logits[f, b, 1], -np.inf)
    i, j = np.unravel_index(score.argmax(), score.shape)
    if best[r][1] is None or score[i, j] > best[r][1]:
      best[r] = (rows[r]["context"][off[a[i, j], 0]:off[b[i, j], 1]], float(score[i, j]))
  return best


def normalize_answer(s: str) -> str:
  """The official script's: lower case, no punctuation, no articles (a, an, the), whitespace folded."""
  s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
  return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def f1_score(prediction: str, truth: str) -> float:
  """F1 of the normalised answers' bags of words."""
  pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def compute_metrics(predictions: list[str], rows: list[dict]) -> dict:
  """exact_match and f1: each question's best over its gold answers, averaged over the questions."""
  if len(predictions) != len(rows):
    raise ValueError(f"{len(predictions)} predictions for {len(rows)} questions")
  pairs = list(zip(predictions, rows))
  em = [max(normalize_answer(p) == normalize_answer(a["text"]) for a in r["answers"]) for p, r in pairs]
  f1 = [max(f1_score(p, a["text"]) for a in r["answers"]) for p, r in pairs]
  return dict(exact_match=float(np.mean(em)), f1=float(np.mean(f1)))


def prediction_rows(answers: list[tuple[str, float | None]], rows: list[dict]) -> list[dict]:
  """One JSON object per question: its index, its id, the answer and its score."""
  return [dict(index=i, id=r["id"], prediction=text, score=score)
          for i, ((text, score), r) in enumerate(zip(answers, rows))]
