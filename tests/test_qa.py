"""Extractive QA: the SQuAD reader and its one-line errors, doc-stride windows (every answer found again from its
offsets), span selection, the official exact match and F1 on hand-checked answers, the loss, and HF parity."""
import json

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import qa, tasks
from electra_jax.finetune import model as model_lib
from electra_jax.model import modeling
from tests import helpers


@pytest.fixture(scope="module", params=["sentencepiece", "wordpiece"])
def any_tok(request, tiny_data, tmp_path_factory):
  return helpers.task_tokenizer(request.param, tiny_data, tmp_path_factory)


def _squad(qas, context="The cat sat on the mat."):
  return dict(version="1.1", data=[dict(title="t", paragraphs=[dict(context=context, qas=qas)])])


def test_reader_reads_what_squad_json_holds(tmp_path):
  rows = helpers.sotu_cloze_rows()[1][:40]
  rows.append(dict(id="7", question="Who sat?", context="The cat sat on the mat.",
                   answers=[dict(text="The cat", answer_start=0), dict(text="cat", answer_start=4)]))
  data = helpers.squad_json(rows)
  data["data"][0]["paragraphs"][-1]["qas"][0]["id"] = 7  # ids may be numbers: read as strings
  (tmp_path / "dev.json").write_text(json.dumps(data), encoding="utf-8")
  assert qa.read_squad(str(tmp_path / "dev.json")) == rows
  # Test files may leave the answers out.
  (tmp_path / "test.json").write_text(json.dumps(_squad([dict(id="a", question="Who?")])), encoding="utf-8")
  assert qa.read_squad(str(tmp_path / "test.json"), labelled=False)[0]["answers"] == []


@pytest.mark.parametrize("data,message", [
    (_squad([dict(id="q1", question="Who?", answers=[dict(text="cat", answer_start=5)])]),
     'data[0].paragraphs[0].qas[0] (id q1): answers[0]: answer_start 5 does not point at "cat" in the context'),
    (_squad([dict(id="q1", answers=[dict(text="cat", answer_start=4)])]),
     "qas[0] (id q1): 'question' is null, not a text"),
    (_squad([dict(id="q1", question="Who?", answers=[], is_impossible=True)]), "(id q1): an unanswerable (SQuAD v2)"),
    (_squad([dict(id="q1", question="Who?", answers=[dict(text="cat", answer_start=4)])] * 2),
     "data[0].paragraphs[0].qas[1]: id q1 is data[0].paragraphs[0].qas[0]'s too"),
    (_squad([dict(id="q1", question="Who?", answers=[])]), "qas[0] (id q1): no answers"),
    (_squad([dict(id="q1", question="Who?", answers=[dict(text="cat", answer_start=4)])], context=" "),
     "data[0].paragraphs[0]: 'context' is blank"),
    (dict(data=[dict(title="t")]), "data[0]: 'paragraphs' is null, not a list"),
    (dict(data=[]), "no questions"),
    ([1, 2], 'not SQuAD JSON: expected an object with a "data" list'),
    ('{"data":\n [}', "line 2: invalid JSON"),
])
def test_bad_files_fail_in_one_line(tmp_path, data, message):
  (tmp_path / "dev.json").write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
  with pytest.raises(ValueError) as e:
    qa.read_squad(str(tmp_path / "dev.json"))
  assert str(e.value).startswith(f"{tmp_path / 'dev.json'}: ") and message in str(e.value), str(e.value)
  assert "\n" not in str(e.value)


def test_doc_stride_windows_hold_every_answer(any_tok):
  """Real paragraphs cut into windows of [CLS] question [SEP] context [SEP]: consecutive windows share doc_stride
  pieces, together they hold the whole context, and each answer's pieces give back its exact text through the
  offsets in every window that holds it whole (the others point at [CLS])."""
  tok, special = any_tok, any_tok.special_ids
  rows = helpers.sotu_cloze_rows()[1][:200]
  seq_len, stride, max_query = 64, 12, 24
  feats = qa.encode(tok, rows, seq_len, stride, max_query)
  ex = feats.examples
  assert ex.input_ids.shape == ex.segment_ids.shape == (len(feats.row), seq_len) and ex.labels.shape[1] == 2
  assert (np.diff(feats.row) >= 0).all() and sorted(set(feats.row)) == list(range(len(rows)))
  assert np.bincount(feats.row).max() >= 4  # long contexts take several windows
  for r, row in enumerate(rows):
    windows = np.flatnonzero(feats.row == r)
    question = tok.encode(row["question"])[:max_query]
    first = len(question) + 2
    context, found = [], 0
    for k, f in enumerate(windows):
      ids, seg, off = ex.input_ids[f], ex.segment_ids[f], feats.offsets[f]
      n = int((off[:, 0] >= 0).sum())
      assert ids[:first].tolist() == [special.cls] + question + [special.sep] and ids[first + n] == special.sep
      assert (ids[first + n + 1:] == special.pad).all()
      assert seg.tolist() == [0] * first + [1] * (n + 1) + [0] * (seq_len - first - n - 1)
      assert (off[first:first + n, 0] >= 0).all() and n <= seq_len - 1 - first
      window = ids[first:first + n].tolist()
      if k:  # the previous window's last doc_stride pieces start this one
        assert window[:stride] == context[-stride:]
        context += window[stride:]
      else:
        context = window
      s, e = ex.labels[f]
      a = row["answers"][0]
      if s:
        assert row["context"][off[s, 0]:off[e, 1]] == a["text"] and first <= s <= e < first + n
        found += 1
      else:
        assert e == 0 and not off[first, 0] <= a["answer_start"] < a["answer_start"] + len(a["text"]) <= \
            off[first + n - 1, 1]
    assert context == tok.encode(row["context"]) and found >= 1


def _features(offsets: list[list[tuple[int, int]]], seq_len: int = 8) -> qa.Features:
  """Features of one row, a window per list of context spans, the context from position 3 on."""
  off = np.full((len(offsets), seq_len, 2), -1, np.int32)
  for f, spans in enumerate(offsets):
    off[f, 3:3 + len(spans)] = spans
  zeros = np.zeros((len(offsets), seq_len), np.int32)
  return qa.Features(tasks.Examples(zeros, zeros, np.zeros((len(offsets), 2), np.int32)),
                     np.zeros(len(offsets), np.int32), off)


def test_the_best_valid_span_over_windows():
  """Window 0 offers "two" (9): its top start is in the question and its top end precedes every start but its own.
  Window 1 offers "three four five" (10), three pieces long, or "three" (7)."""
  row = dict(id="x", question="?", context="one two three four five", answers=[dict(text="two", answer_start=4)])
  feats = _features([[(0, 3), (4, 7), (8, 13)], [(8, 13), (14, 18), (19, 23)]])
  logits = np.zeros((2, 8, 2), np.float32)
  logits[0, :, 0] = [0, 9, 0, 0.5, 5, 0, 0, 0]
  logits[0, :, 1] = [0, 0, 0, 8, 4, 2, 0, 0]
  logits[1, :, 0] = [0, 0, 0, 7, 0, 1, 0, 0]
  logits[1, :, 1] = [0, 0, 0, 0, 0, 3, 0, 0]
  assert qa.predict(logits, feats, [row]) == [("three four five", 10.0)]
  assert qa.predict(logits, feats, [row], max_answer_length=2) == [("two", 9.0)]
  assert qa.predict(logits, feats, [row], n_best_size=1) == [("three four five", 10.0)]
  assert qa.predict(logits, feats, [row], max_answer_length=2, n_best_size=1) == [("", None)]
  assert qa.prediction_rows([("two", 9.0)], [row]) == [dict(index=0, id="x", prediction="two", score=9.0)]


def test_logits_at_the_labels_answer_every_question(tiny_data):
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  rows = helpers.sotu_cloze_rows()[1][:100]
  feats = qa.encode(tok, rows, 64, 16, 24)
  logits = np.random.default_rng(0).standard_normal(feats.examples.labels.shape[:1] + (64, 2)).astype(np.float32)
  f = np.flatnonzero(feats.examples.labels[:, 0])
  logits[f, feats.examples.labels[f, 0], 0] = logits[f, feats.examples.labels[f, 1], 1] = 10.0
  answers = qa.predict(logits, feats, rows)
  assert [a for a, _ in answers] == [r["answers"][0]["text"] for r in rows]
  assert qa.compute_metrics([a for a, _ in answers], rows) == dict(exact_match=1.0, f1=1.0)


def test_squad_metrics_against_hand_computed_values():
  assert qa.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
  assert qa.normalize_answer("An apple a day; theatre") == "apple day theatre"  # articles as whole words only
  assert qa.f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)  # P = 2/2, R = 2/3
  assert qa.f1_score("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)  # bags: one cat, one dog in common
  assert qa.f1_score("", "cat") == 0.0 and qa.f1_score("the", "cat") == 0.0
  rows = [dict(answers=[dict(text="Denver Broncos"), dict(text="The Denver Broncos")]),
          dict(answers=[dict(text="Saint Bernadette Soubirous")]),
          dict(answers=[dict(text="cat"), dict(text="a dog")])]
  m = qa.compute_metrics(["the Denver Broncos.", "Bernadette", "dog"], rows)
  assert m == pytest.approx(dict(exact_match=2 / 3, f1=(1 + 0.5 + 1) / 3))  # Bernadette: P = 1, R = 1/3


def test_loss_is_the_mean_of_start_and_end_cross_entropy():
  logits = jnp.asarray(np.random.default_rng(0).standard_normal((3, 6, 2)), jnp.float32)
  labels = jnp.array([[1, 2], [0, 0], [4, 5]])
  ce = lambda x, y: optax.softmax_cross_entropy_with_integer_labels(x, y).mean()
  want = (ce(logits[..., 0], labels[:, 0]) + ce(logits[..., 1], labels[:, 1])) / 2
  assert float(qa.loss(logits, dict(labels=labels))) == pytest.approx(float(want), rel=1e-6)


def test_sotu_cloze_task_and_its_baseline():
  """The cloze task of the speeches: a name or year blanked out of a sentence of the paragraph; answering with the
  paragraph's first sentence scores low."""
  train, evl = helpers.sotu_cloze_rows()
  assert len(train) > 1500 and len(evl) > 400 and not {r["id"] for r in train} & {r["id"] for r in evl}
  for r in evl:
    a = r["answers"][0]
    assert r["context"][a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
    assert " what" in f" {r['question']}" and r["question"].replace("what", a["text"], 1) in r["context"]
  m = helpers.first_sentence_baseline(evl)
  assert m["exact_match"] < 0.01 and m["f1"] < 0.1


def test_hf_question_answering_parity(tiny_data, tmp_path):
  """Random weights saved as ElectraForQuestionAnswering give our start and end logits on real windows."""
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  import transformers  # pylint: disable=g-import-not-at-top
  feats = qa.encode(tok, helpers.sotu_cloze_rows()[1][:8], 64, 16, 24)
  mc = modeling.ModelConfig.from_config(helpers.tiny_config(tiny_data, num_layers=2))
  err = helpers.hf_head_parity(model_lib.QuestionAnswering(mc), None, tiny_data[1].tokenizer_path,
                               feats.examples.input_ids[:16], feats.examples.segment_ids[:16], str(tmp_path / "best"))
  assert err <= 1e-5
  assert type(transformers.AutoModelForQuestionAnswering.from_pretrained(str(tmp_path / "best"))).__name__ == \
      "ElectraForQuestionAnswering"
