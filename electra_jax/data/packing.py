"""Documents tokenized and packed into fixed-length examples as the official ELECTRA builder does (docs/data.md, "The
example format"), seeded by (seed, document index): the same for any number of workers. No TensorFlow here."""
import collections
import concurrent.futures
import dataclasses
import itertools
import multiprocessing
import os
import random
from typing import Iterable, Iterator

import numpy as np

from electra_jax.data import corpus as corpus_lib
from electra_jax.data import tokenizer as tokenizer_lib


@dataclasses.dataclass
class PackedDocument:
  index: int
  input_ids: np.ndarray  # int32 [n, seq_len], 0-padded
  segment_ids: np.ndarray  # int32 [n, seq_len]
  lines: int
  tokens: int  # tokens of the document's text
  truncated: int  # of those, tokens cut by the packing rule
  replaced_bytes: int


def pack_document(doc: corpus_lib.Document, tok: tokenizer_lib.Tokenizer, seq_len: int, seed: int) -> PackedDocument:
  rng = random.Random(f"{seed}/{doc.index}")
  cls, sep = tok.special_ids.cls, tok.special_ids.sep
  examples, truncated = [], 0

  def emit(first, second=()):
    ids = [cls, *first, sep] + ([*second, sep] if second else [])
    examples.append((ids, [0] * (len(first) + 2) + [1] * (len(ids) - len(first) - 2)))

  def random_target():
    return rng.randint(5, seq_len) if rng.random() < 0.05 else seq_len

  def flush():
    nonlocal sentences, length, target, truncated
    first_target = 100_000 if rng.random() < 0.1 else (target - 3) // 2
    first, second = [], []
    for s in sentences:
      # A sentence joins A if A is empty, if it fits A's target, or (half the time) if it is the one crossing it.
      if not first or len(first) + len(s) < first_target or (
          not second and len(first) < first_target and rng.random() < 0.5):
        first += s
      else:
        second += s
    total = len(first) + len(second)
    first = first[:seq_len - 2]
    second = second[:max(0, seq_len - len(first) - 3)]
    truncated += total - len(first) - len(second)
    emit(first, second)
    sentences, length, target = [], 0, random_target()

  sentences, length, target = [], 0, random_target()
  all_ids = tok.encode_batch(doc.lines)
  for ids in all_ids:
    if len(ids) > seq_len - 2:  # longer than one example: whole single-segment examples, the rest packs as usual
      if sentences:
        flush()
      while len(ids) > seq_len - 2:
        emit(ids[:seq_len - 2])
        ids = ids[seq_len - 2:]
      if not ids:
        continue
    sentences.append(ids)
    length += len(ids)
    if length >= target:
      flush()
  if sentences:
    flush()

  input_ids = np.zeros((len(examples), seq_len), np.int32)
  segment_ids = np.zeros((len(examples), seq_len), np.int32)
  for i, (ids, segments) in enumerate(examples):
    input_ids[i, :len(ids)] = ids
    segment_ids[i, :len(segments)] = segments
  return PackedDocument(doc.index, input_ids, segment_ids, len(doc.lines), sum(map(len, all_ids)), truncated,
                        doc.replaced_bytes)


_worker = {}


def _init_worker(tokenizer_path: str, seq_len: int, seed: int):
  _worker.update(tok=tokenizer_lib.Tokenizer(tokenizer_path), seq_len=seq_len, seed=seed)


def _pack(docs: list[corpus_lib.Document]) -> list[PackedDocument]:
  return [pack_document(d, _worker["tok"], _worker["seq_len"], _worker["seed"]) for d in docs]


def pack_documents(docs: Iterable[corpus_lib.Document], tokenizer_path: str, seq_len: int, seed: int,
                   num_workers: int = 0, docs_per_task: int = 16) -> Iterator[PackedDocument]:
  """pack_document over `docs` on `num_workers` processes (0: all cores), in order, reading ahead boundedly."""
  num_workers = num_workers or os.cpu_count()
  tasks = iter(lambda it=iter(docs): list(itertools.islice(it, docs_per_task)), [])
  if num_workers == 1:
    _init_worker(tokenizer_path, seq_len, seed)
    for task in tasks:
      yield from _pack(task)
    return
  # spawn, not fork: TensorFlow's threads run in the parent; an executor, not a Pool: a dead worker raises, not hangs.
  with concurrent.futures.ProcessPoolExecutor(num_workers, multiprocessing.get_context("spawn"), _init_worker,
                                              (tokenizer_path, seq_len, seed)) as pool:
    pending = collections.deque()
    for task in tasks:  # bounded read-ahead: a few tasks per worker in flight, not the whole corpus
      pending.append(pool.submit(_pack, task))
      if len(pending) > 4 * num_workers:
        yield from pending.popleft().result()
    while pending:
      yield from pending.popleft().result()
