"""Token classification (NER-style tagging; docs/token_tasks.md): JSONL or CoNLL-style column files, each word's tag
on its first piece, the masked loss, and conlleval's entity-level metrics. A tag's id is its index in tag_names."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.data import task_rows
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import tasks

IGNORE = -100  # the label of pieces the loss skips (HF's ignore_index)
METRICS = ("f1", "accuracy", "precision", "recall")
JSONL = (".jsonl", ".json")


def _words(value, field: str, where: str) -> list[str]:
  if not isinstance(value, list):
    raise ValueError(f"{where}: {field!r} is {task_rows.kind(value)}, not a list of strings")
  if not value:
    raise ValueError(f"{where}: {field!r} is empty")
  for i, w in enumerate(value):
    if not isinstance(w, str) or not w.strip():
      raise ValueError(f"{where}: {field!r} item {i} is {'blank' if isinstance(w, str) else task_rows.kind(w)}")
  return value


def _row(tokens, tags, where: str, tokens_field: str, tags_field: str) -> dict:
  """A checked row; tags None for unlabelled rows."""
  tokens = _words(tokens, tokens_field, where)
  if tags is not None and len(_words(tags, tags_field, where)) != len(tokens):
    raise ValueError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
  return dict(tokens=tokens, tags=tags)


def _json_rows(path: str, tokens_field: str, tags_field: str, labelled: bool) -> list[dict]:
  rows = []
  for n, obj in task_rows.parse(path)[1]:
    where = f"{path}: line {n}"
    for field in (tokens_field, tags_field)[:1 + labelled]:
      if obj.get(field) is None:
        raise ValueError(f"{where}: {field!r} is {'null' if field in obj else 'missing'}")
    rows.append(dict(_row(obj[tokens_field], obj[tags_field] if labelled else None, where, tokens_field, tags_field),
                     line=n))
  return rows


def _column_rows(path: str, labelled: bool) -> list[dict]:
  rows, words, tags, first = [], [], [], 0
  for n, line in enumerate(task_rows.read_text(path).splitlines() + [""], 1):
    fields = line.split()
    if not fields or fields[0] == "-DOCSTART-":  # a sentence ends at a blank line and at a document start
      if words:
        rows.append(dict(_row(words, tags if labelled else None, f"{path}: line {first}", "tokens", "tags"),
                         line=first))
      words, tags = [], []
      continue
    if labelled and len(fields) < 2:
      raise ValueError(f"{path}: line {n}: {line.strip()!r} has no tag: expected `word<TAB or space>tag`")
    first = first if words else n
    words.append(fields[0])
    tags.append(fields[-1])
  return rows


def read_rows(path: str, tokens_field: str = "tokens", tags_field: str = "tags", labelled: bool = True) -> list[dict]:
  """Sentences of a JSONL or column file (local or gs://): {"tokens", "tags" (None unless labelled), "line"}."""
  rows = (_json_rows(path, tokens_field, tags_field, labelled) if path.lower().endswith(JSONL) else
          _column_rows(path, labelled))
  if not rows:
    raise ValueError(f"{path}: no sentences")
  return rows


def tag_names(rows: list[dict]) -> list[str]:
  """Every tag of the rows, "O" first, then by entity type (B- before I-)."""
  tags = {t for r in rows for t in r["tags"]}
  return sorted(tags, key=lambda t: (t != "O", t[2:] if t[:2] in ("B-", "I-") else t, t))


@dataclasses.dataclass
class Encoded:
  examples: tasks.Examples  # input_ids, segment_ids [N, L]: [CLS] pieces [SEP]; labels [N, L] int32 (see encode)
  words: np.ndarray  # [N, L] int32: the word whose first piece sits here, -1 elsewhere
  num_words: np.ndarray  # [N] int32: words per row, kept or not


def encode(tok: tokenizer_lib.Tokenizer, rows: list[dict], names: list[str], seq_len: int,
           where: str = "the rows") -> Encoded:
  """Each row's words joined by spaces and tokenized as one text, so that its pieces are the sentence's; a piece
  belongs to the word its text starts in (a lone "▁" before a word to that word). Rows longer than seq_len lose
  whole words from the end. Unlabelled rows (tags None) get IGNORE everywhere."""
  index = {n: i for i, n in enumerate(names)}
  if unseen := sorted({t for r in rows if r["tags"] is not None for t in r["tags"]} - set(index)):
    raise ValueError(f"{where}: tag(s) {', '.join(unseen[:5])} do not occur in the training data")
  s = tok.special_ids
  ids = np.full((len(rows), seq_len), s.pad, np.int32)
  labels = np.full_like(ids, IGNORE)
  words = np.full_like(ids, -1)
  texts = [" ".join(r["tokens"]) for r in rows]
  for r, (row, (pieces, spans)) in enumerate(zip(rows, tok.encode_with_offsets(texts))):
    ends = np.cumsum([len(t) + 1 for t in row["tokens"]]) - 1  # each word's end in the joined text
    word = np.searchsorted(ends, [b for b, _ in spans], side="right").astype(np.int32)
    # Too long: cut before the first piece of the first word that does not fit.
    keep = len(pieces) if len(pieces) <= seq_len - 2 else int(np.searchsorted(word, word[seq_len - 2]))
    word = word[:keep]
    ids[r, :keep + 2] = [s.cls] + pieces[:keep] + [s.sep]
    first = np.flatnonzero(np.diff(word, prepend=-1))  # where a new word starts
    words[r, first + 1] = word[first]
    if row["tags"] is not None:
      labels[r, first + 1] = [index[row["tags"][w]] for w in word[first]]
  return Encoded(tasks.Examples(ids, np.zeros_like(ids), labels), words,
                 np.array([len(r["tokens"]) for r in rows], np.int32))


def loss(logits, batch: dict):
  """Mean cross-entropy over the pieces not labelled IGNORE (HF's CrossEntropyLoss with ignore_index=-100)."""
  labels = batch["labels"]
  mask = labels != IGNORE
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(mask, labels, 0))
  return jnp.sum(ce * mask) / jnp.maximum(mask.sum(), 1)


def predict(logits: np.ndarray, enc: Encoded, names: list[str]) -> list[list[str]]:
  """Each row's tags, one per word, from its first pieces' logits [N, L, num_labels]."""
  best = np.asarray(logits).argmax(-1)
  out = [["O"] * n for n in enc.num_words]
  for r, p in zip(*np.nonzero(enc.words >= 0)):
    out[r][enc.words[r, p]] = names[best[r, p]]
  return out


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
  """(type, first word, end word) of each entity, as conlleval chunks them: a B-X starts one, as does an I-X that
  does not continue an X; any tag not B-/I- is outside (so POS-style tag sets have none)."""
  out, kind, start = [], None, 0
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, t = (tag[0], tag[2:]) if tag[:2] in ("B-", "I-") else ("O", None)
    if kind is not None and (prefix != "I" or t != kind):
      out.append((kind, start, i))
      kind = None
    if prefix == "B" or (prefix == "I" and kind is None):
      kind, start = t, i
  return out


def compute_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict:
  """Word accuracy and conlleval's micro-averaged entity precision, recall and F1 (right: the type and both ends)."""
  if [len(g) for g in gold] != [len(p) for p in predicted]:
    raise ValueError("predicted tags do not line up with the gold tags: one tag per word of each row")
  right = sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p))
  gold_e = {(i, *e) for i, g in enumerate(gold) for e in entities(g)}
  pred_e = {(i, *e) for i, p in enumerate(predicted) for e in entities(p)}
  hit = len(gold_e & pred_e)
  precision = hit / len(pred_e) if pred_e else 0.0
  recall = hit / len(gold_e) if gold_e else 0.0
  f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
  return dict(accuracy=right / max(1, sum(map(len, gold))), precision=precision, recall=recall, f1=f1)


def prediction_rows(tags: list[list[str]], rows: list[dict]) -> list[dict]:
  """One JSON object per row: its index, its words and their predicted tags."""
  return [dict(index=i, tokens=r["tokens"], prediction=t) for i, (t, r) in enumerate(zip(tags, rows))]

