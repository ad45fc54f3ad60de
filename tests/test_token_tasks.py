"""Token classification: the CoNLL-style readers and their one-line errors, tags on first pieces, conlleval's entity
counting on hand-checked tags, the masked loss, and HF parity of the tagger."""
import json

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import token_tasks
from electra_jax.finetune import model as model_lib
from electra_jax.model import modeling
from tests import helpers

ROWS = [dict(tokens=["In", "January", "New", "York", "voted", "."],
             tags=["O", "B-MONTH", "B-STATE", "I-STATE", "O", "O"]),
        dict(tokens=["Ohio", "grew", "on", "Monday"], tags=["B-STATE", "O", "O", "B-DAY"])]


@pytest.fixture(scope="module", params=["sentencepiece", "wordpiece"])
def any_tok(request, tiny_data, tmp_path_factory):
  return helpers.task_tokenizer(request.param, tiny_data, tmp_path_factory)


def test_readers_read_jsonl_and_column_files_alike(tmp_path):
  (tmp_path / "rows.jsonl").write_text("".join(json.dumps(dict(words=r["tokens"], ner=r["tags"])) + "\n\n"
                                               for r in ROWS), encoding="utf-8")
  # CoNLL-2003's layout: a document start, four columns (the word first, the tag last), tabs or spaces, no final
  # blank line
  (tmp_path / "rows.conll").write_text(
      "-DOCSTART- -X- -X- O\n\nIn IN B-PP O\nJanuary\tNNP\tI-NP\tB-MONTH\nNew NNP B-NP B-STATE\n"
      "York NNP I-NP I-STATE\nvoted VBD B-VP O\n. . O O\n\n\n-DOCSTART- -X- -X- O\nOhio  B-STATE\ngrew O\non O\n"
      "Monday B-DAY", encoding="utf-8")
  jsonl = token_tasks.read_rows(str(tmp_path / "rows.jsonl"), "words", "ner")
  conll = token_tasks.read_rows(str(tmp_path / "rows.conll"))
  assert [r["line"] for r in jsonl] == [1, 3] and [r["line"] for r in conll] == [3, 12]
  for rows in (jsonl, conll):
    assert [dict(tokens=r["tokens"], tags=r["tags"]) for r in rows] == ROWS
  assert token_tasks.tag_names(conll) == ["O", "B-DAY", "B-MONTH", "B-STATE", "I-STATE"]
  # Unlabelled (test) rows: no tags needed, a word per line will do.
  (tmp_path / "test.txt").write_text("Ohio\ngrew\n\nIn\n", encoding="utf-8")
  assert [(r["tokens"], r["tags"]) for r in token_tasks.read_rows(str(tmp_path / "test.txt"), labelled=False)] == [
      (["Ohio", "grew"], None), (["In"], None)]


@pytest.mark.parametrize("name,text,message", [
    ("a.jsonl", '{"tokens": ["a", "b"], "tags": ["O", "O"]}\n{"tokens": ["a", "b", "c"], "tags": ["O", "O"]}\n',
     "a.jsonl: line 2: 3 tokens but 2 tags"),
    ("a.jsonl", '{"tokens": [], "tags": []}\n', "a.jsonl: line 1: 'tokens' is empty"),
    ("a.jsonl", '{"tokens": "a b", "tags": ["O", "O"]}\n', "a.jsonl: line 1: 'tokens' is a string, not a list"),
    ("a.jsonl", '\n{"tokens": ["a"]}\n', "a.jsonl: line 2: 'tags' is missing"),
    ("a.jsonl", '{"tokens": ["a", " "], "tags": ["O", "O"]}\n', "a.jsonl: line 1: 'tokens' item 1 is blank"),
    ("a.jsonl", '{"tokens": ["a"], "tags": [1]}\n', "a.jsonl: line 1: 'tags' item 0 is a number"),
    ("a.jsonl", '{"tokens": ["a"], "tags": ["O"]\n', "a.jsonl: line 1: invalid JSON"),
    ("a.txt", "a O\nb O\n\nc\n", "a.txt: line 4: 'c' has no tag"),
    ("a.txt", "-DOCSTART- O\n\n\n", "a.txt: no sentences"),
])
def test_bad_rows_fail_in_one_line_naming_file_and_line(tmp_path, name, text, message):
  (tmp_path / name).write_text(text, encoding="utf-8")
  with pytest.raises(ValueError) as e:
    token_tasks.read_rows(str(tmp_path / name))
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def _word_pieces(enc, r, sep):
  """{word: its piece ids} of row r, from the first-piece map (a word's pieces run up to the next word or [SEP])."""
  ids, firsts = enc.examples.input_ids[r], np.flatnonzero(enc.words[r] >= 0)
  ends = list(firsts[1:]) + [int(np.flatnonzero(ids == sep)[0])]
  return {int(enc.words[r, p]): ids[p:e].tolist() for p, e in zip(firsts, ends)}


def test_the_first_piece_of_each_word_carries_its_tag(any_tok):
  """Real sentences: the pieces are the sentence's own and each word's are those of the word alone, its first piece
  holds its tag and the rest IGNORE; a long row loses whole words only. A word SentencePiece starts with a lone "▁"
  piece (an emoji: byte fallback) gets its tag there."""
  tok = any_tok
  rows = helpers.sotu_tagging_rows()[1][:300] + [dict(tokens=["Costs", "😀", "rose"], tags=["O", "B-DAY", "O"])]
  names = token_tasks.tag_names(rows)
  seq_len = 32
  enc = token_tasks.encode(tok, rows, names, seq_len)
  assert enc.examples.input_ids.shape == enc.examples.labels.shape == (len(rows), seq_len)
  cut = 0
  for r, row in enumerate(rows):
    pieces = _word_pieces(enc, r, tok.special_ids.sep)
    kept = len(pieces)
    assert sorted(pieces) == list(range(kept)) and 0 < kept <= len(row["tokens"])
    cut += kept < len(row["tokens"])
    sentence = tok.encode(" ".join(row["tokens"]))
    assert sum(pieces.values(), []) == sentence[:sum(map(len, pieces.values()))]  # the sentence's pieces, in order
    if kept < len(row["tokens"]):  # the next word did not fit whole
      assert sum(map(len, pieces.values())) + len(tok.encode(row["tokens"][kept])) > seq_len - 2
    for w, ids in pieces.items():
      assert ids == tok.encode(row["tokens"][w])
    labels = enc.examples.labels[r]
    firsts = np.flatnonzero(enc.words[r] >= 0)
    assert [names[i] for i in labels[firsts]] == row["tags"][:kept]
    assert (np.delete(labels, firsts) == token_tasks.IGNORE).all()
  assert cut > 10  # truncation was exercised
  if tok.path.endswith(".model"):
    emoji = _word_pieces(enc, len(rows) - 1, tok.special_ids.sep)[1]
    assert tok.decode(emoji[:1]) == "" and len(emoji) > 1  # "▁", then its bytes
    first = np.flatnonzero(enc.words[-1] == 1)[0]
    assert enc.examples.input_ids[-1, first] == emoji[0] and names[enc.examples.labels[-1, first]] == "B-DAY"

  # Test rows (no tags) are all IGNORE; tags training never saw are refused.
  assert (token_tasks.encode(tok, [dict(tokens=["a"], tags=None)], names, 8).examples.labels == -100).all()
  with pytest.raises(ValueError, match="eval.jsonl: tag\\(s\\) B-CITY do not occur in the training data"):
    token_tasks.encode(tok, [dict(tokens=["Paris"], tags=["B-CITY"])], names, 8, "eval.jsonl")


def test_predictions_come_from_first_pieces(tiny_data):
  """Logits that favour each word's gold tag at its first piece (and something else everywhere else) give the gold
  tags back; words cut off by seq_len are predicted O."""
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  rows = [dict(tokens=r["tokens"] * 3, tags=r["tags"] * 3) for r in ROWS]
  names = token_tasks.tag_names(rows)
  enc = token_tasks.encode(tok, rows, names, 12)
  logits = np.zeros(enc.examples.labels.shape + (len(names),), np.float32)
  logits[..., 1] = 1.0
  r, p = np.nonzero(enc.examples.labels >= 0)
  logits[r, p, enc.examples.labels[r, p]] = 5.0
  tags = token_tasks.predict(logits, enc, names)
  for row, got, n in zip(rows, tags, (enc.words >= 0).sum(1)):
    assert got == row["tags"][:n] + ["O"] * (len(row["tags"]) - n) and 0 < n < len(row["tags"])
  assert token_tasks.prediction_rows(tags, rows)[1] == dict(index=1, tokens=rows[1]["tokens"], prediction=tags[1])


def test_entity_metrics_against_hand_counts():
  """3 gold entities (PER, LOC, ORG), 3 predicted (PER right, LOC typed ORG, ORG one word short): P = R = F1 = 1/3;
  6 of 8 words right."""
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "I-ORG"]]
  pred = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "B-ORG", "I-ORG", "O"]]
  m = token_tasks.compute_metrics(gold, pred)
  assert m == pytest.approx(dict(accuracy=6 / 8, precision=1 / 3, recall=1 / 3, f1=1 / 3))
  # conlleval's chunking: an I- after O or another type starts an entity, a B- always does; POS-style tags are none.
  assert token_tasks.entities(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-MISC", "NN", "B-X"]) == [
      ("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 5), ("MISC", 5, 6), ("X", 7, 8)]
  m = token_tasks.compute_metrics([["B-A", "I-A", "O"]], [["B-A", "O", "B-A"]])  # 0 of 1 gold, 0 of 2 predicted
  assert m == pytest.approx(dict(accuracy=1 / 3, precision=0.0, recall=0.0, f1=0.0))
  assert token_tasks.compute_metrics([["O"]], [["O"]])["f1"] == 0.0  # no entities at all: nothing found
  with pytest.raises(ValueError, match="one tag per word"):
    token_tasks.compute_metrics(gold, [p[:3] for p in pred])


def test_sotu_tagging_task_and_its_baseline():
  """The tagging task of the speeches: enough entities of each kind, and tagging capitalised words scores low."""
  train, evl = helpers.sotu_tagging_rows()
  assert len(train) > 4000 and len(evl) > 1000
  count = lambda rows, tag: sum(t == tag for r in rows for t in r["tags"])
  assert count(train, "B-MONTH") > 800 and count(train, "B-STATE") > 800 and count(train, "I-STATE") > 80
  m = helpers.capitalised_baseline(evl)
  assert m["f1"] < 0.2 and m["recall"] > 0.3


def test_loss_ignores_unlabelled_pieces():
  logits = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 3)), jnp.float32)
  labels = jnp.array([[-100, 2, -100, 0, -100], [-100, 1, -100, -100, -100]])
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
  want = (ce[0, 1] + ce[0, 3] + ce[1, 1]) / 3
  assert float(token_tasks.loss(logits, dict(labels=labels))) == pytest.approx(float(want), rel=1e-6)


def test_hf_token_classification_parity(tiny_data, tmp_path):
  """Random weights saved as ElectraForTokenClassification (with the tag names) give our logits on real
  sentences."""
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  import transformers  # pylint: disable=g-import-not-at-top
  rows = helpers.sotu_tagging_rows()[1][:16]
  names = token_tasks.tag_names(helpers.sotu_tagging_rows()[0])
  enc = token_tasks.encode(tok, rows, names, 48)
  mc = modeling.ModelConfig.from_config(helpers.tiny_config(tiny_data, num_layers=2))
  err = helpers.hf_head_parity(model_lib.TokenClassifier(mc, len(names)), names, tiny_data[1].tokenizer_path,
                               enc.examples.input_ids, enc.examples.segment_ids, str(tmp_path / "best"))
  assert err <= 1e-5
  config = transformers.AutoConfig.from_pretrained(str(tmp_path / "best"))
  assert config.architectures == ["ElectraForTokenClassification"] and config.id2label == dict(enumerate(names))
  assert type(transformers.AutoModelForTokenClassification.from_pretrained(str(tmp_path / "best"))).__name__ == \
      "ElectraForTokenClassification"
