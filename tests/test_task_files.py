"""Task files (JSONL/CSV/TSV) are checked while they load: a missing, null or empty value, labels that would silently
split a class, a regression target that is not a finite number, and unreadable lines are one ValueError naming the
file and the line an editor shows (a CSV/TSV header is line 1); through the CLI, one error line and no workdir."""
import json
import os
import subprocess
import sys

import pytest

from electra_jax import finetune
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import tasks
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text(i: int) -> str:
  """The i-th sentence without quotes or tabs, so that the hand-written CSV/TSV lines below are well-formed."""
  return [s for s in helpers.sotu_sentences() if '"' not in s and "\t" not in s][i]


def _jsonl(*rows) -> str:
  """One line per row; a row that is a str is written as it is (a broken line)."""
  return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _task(**kw):
  task = finetune.base_config().task
  task.update(kw)
  return task


def _load_error(path, **task) -> str:
  with pytest.raises(ValueError) as e:
    tasks.load_rows(_task(train_file=str(path), **task))
  return str(e.value)


# (file name, content as bytes or str, task fields): the message after "<path>: ".
CASES = {
    "null_label": ("t.jsonl", lambda: _jsonl({"text": _text(0), "label": "pos"}, {"text": _text(1), "label": None}),
                   {}, "line 2: 'label' is null"),
    "label_key_missing_after_the_first_row": (
        "t.jsonl", lambda: _jsonl({"text": _text(0), "label": "pos"}, {"text": _text(1), "label": "neg"},
                                  {"text": _text(2)}), {}, "line 3: 'label' is missing"),
    "csv_label_cell_missing": ("t.csv", lambda: f'text,label\n"{_text(0)}",pos\n"{_text(1)}"\n', {},
                               "line 3: 'label' is missing"),
    "csv_label_cell_empty": ("t.csv", lambda: f'text,label\n"{_text(0)}",pos\n"{_text(1)}",\n', {},
                             "line 3: 'label' is empty"),
    "labels_1_string_1_and_1.0": (
        "t.jsonl", lambda: _jsonl({"text": _text(0), "label": 1}, {"text": _text(1), "label": 1.0},
                                  {"text": _text(2), "label": "1"}), {},
        "line 3: label \"1\" is a string but line 1's 1 is a number: write every label the same way"),
    "labels_boolean_and_number": (
        "t.jsonl", lambda: _jsonl({"text": _text(0), "label": 0}, {"text": _text(1), "label": True}), {},
        "line 2: label true is a boolean but line 1's 0 is a number: write every label the same way"),
    # Counted from the header: the first row's text spans lines 2-3.
    "csv_label_1_and_1.0": ("t.csv", lambda: f'text,label\n"{_text(0)}\n{_text(1)}",1\n"{_text(2)}",1.0\n', {},
                            "line 4: label \"1.0\" and line 2's \"1\" are one label spelt two ways: write it one way"),
    "label_with_a_stray_space": (
        "t.tsv", lambda: f"text\tlabel\n{_text(0)}\tpositive\n{_text(1)}\tnegative\n{_text(2)}\t positive\n", {},
        "line 4: label \" positive\" and line 2's \"positive\" are one label spelt two ways: write it one way"),
    "label_is_a_list": ("t.jsonl", lambda: _jsonl({"text": _text(0), "label": ["pos"]}), {},
                        "line 1: label [\"pos\"] is not a string, finite number or boolean"),
    "regression_null": ("t.jsonl", lambda: _jsonl({"text": _text(0), "score": 0.5}, {"text": _text(1), "score": None}),
                        dict(type="regression", label_field="score"), "line 2: 'score' is null"),
    "regression_nan": ("t.jsonl", lambda: _jsonl({"text": _text(0), "score": 0.5}, '{"text": "x", "score": NaN}'),
                       dict(type="regression", label_field="score"),
                       "line 2: regression target 'score' is NaN, not a finite number"),
    "regression_not_a_number": ("t.csv", lambda: f'text,score\n"{_text(0)}",0.5\n"{_text(1)}",n/a\n',
                                dict(type="regression", label_field="score"),
                                "line 3: regression target 'score' is \"n/a\", not a finite number"),
    "regression_past_float32": ("t.jsonl", lambda: _jsonl({"text": _text(0), "score": 1e39}),
                                dict(type="regression", label_field="score"),
                                "line 1: regression target 'score' is 1e+39, not a finite number"),
    "text_missing": ("t.jsonl", lambda: _jsonl({"text": _text(0), "label": "a"}, {"label": "b"}), {},
                     "line 2: 'text' is missing"),
    "text_b_null": ("t.jsonl", lambda: _jsonl({"text": _text(0), "b": _text(1), "label": "a"},
                                              {"text": _text(2), "b": None, "label": "b"}),
                    dict(text_b_field="b"), "line 2: 'b' is null"),
    "text_b_cell_missing": ("t.tsv", lambda: f"text\tb\tlabel\n{_text(0)}\t{_text(1)}\ta\n\n{_text(2)}\n",
                            dict(text_b_field="b"), "line 4: 'b' is missing"),
    "text_is_an_object": ("t.jsonl", lambda: _jsonl({"text": {"en": _text(0)}, "label": "a"}), {},
                          "line 1: 'text' is an object, not a text"),
    "line_not_an_object": ("t.jsonl", lambda: _jsonl({"text": _text(0), "label": "a"}, "", [_text(1), "b"]), {},
                           "line 3: a list, not a JSON object (one object per line)"),
    "invalid_json": ("t.jsonl", lambda: _jsonl({"text": _text(0), "label": "a"}, '{"text": "x", "label": "b",}'), {},
                     "line 2: invalid JSON (Expecting property name enclosed in double quotes, column 28)"),
    "not_utf8": ("t.jsonl", lambda: _jsonl({"text": _text(0), "label": "a"}).encode() * 2 +
                 '{"text": "caf\xe9", "label": "b"}\n'.encode("latin-1"), {},
                 "line 3: byte 0xe9 is not UTF-8 (save the file as UTF-8)"),
    "csv_quote_left_open": ("t.csv", lambda: f'text,label\n"{_text(0)}",a\n"{_text(1)},b\n"{_text(2)}",a\n', {},
                            "line 3: malformed row (',' expected after '\"')"),
    "tsv_tab_inside_a_text": ("t.tsv", lambda: f"text\tlabel\n{_text(0)}\ta\n{_text(1)}\t{_text(2)}\tb\n", {},
                              "line 3: 3 cells but the header has 2 columns"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_row_is_one_error_naming_file_and_line(case, tmp_path):
  name, content, task, message = CASES[case]
  content = content()
  path = tmp_path / name
  path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
  assert _load_error(path, **task) == f"{path}: {message}"


def test_test_file_is_checked_but_needs_no_labels(tmp_path):
  train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
  train.write_text(_jsonl({"text": _text(0), "label": "a"}), encoding="utf-8")
  test.write_text(_jsonl({"text": _text(1)}, {"text": _text(2), "label": None}), encoding="utf-8")
  assert tasks.test_rows(_task(train_file=str(train), test_file=str(test)))[0] == [
      {"text": _text(1)}, {"text": _text(2), "label": None}]
  test.write_text(_jsonl({"text": _text(1)}, {"text": None}), encoding="utf-8")
  with pytest.raises(ValueError) as e:
    tasks.test_rows(_task(train_file=str(train), test_file=str(test)))
  assert str(e.value) == f"{test}: line 2: 'text' is null"


def test_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
  """Excel's "CSV UTF-8" starts with a BOM: read as before it, the first column would be named '\\ufefftext'."""
  path = tmp_path / "excel.csv"
  path.write_bytes(f'text,label\n"{_text(0)}",pos\n"{_text(1)}",neg\n'.encode("utf-8-sig"))
  rows = tasks.load_rows(_task(train_file=str(path), eval_file=str(path)))["train"][0]
  assert rows == [{"text": _text(0), "label": "pos"}, {"text": _text(1), "label": "neg"}]


def test_one_json_number_is_one_class_in_every_file(tiny_data, tmp_path):
  """JSON's 1 and 1.0 are one number, so one class, named as the CSV eval file writes it; float targets for
  regression from numbers and numeric strings alike."""
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  train, evl = tmp_path / "train.jsonl", tmp_path / "eval.csv"
  train.write_text(_jsonl(*({"text": _text(i), "label": [1, 1.0, 0][i]} for i in range(3))), encoding="utf-8")
  evl.write_text(f'text,label\n"{_text(3)}",1\n"{_text(4)}",0\n', encoding="utf-8")
  train_ex, eval_ex, _, names = tasks.make_examples(_task(train_file=str(train), eval_file=str(evl)), tok, 16)
  assert names == ["0", "1"]
  assert train_ex.labels.tolist() == [1, 1, 0] and eval_ex.labels.tolist() == [1, 0]
  evl.write_text(f'text,label\n"{_text(3)}",0.5\n"{_text(4)}",-2\n', encoding="utf-8")
  task = _task(train_file=str(train), eval_file=str(evl), type="regression")
  assert tasks.make_examples(task, tok, 16)[1].labels.tolist() == [0.5, -2.0]


def test_missing_column_names_the_file_and_the_columns_it_has(tiny_data, tmp_path):
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  path = tmp_path / "stars.csv"
  path.write_text(f'text,stars\n"{_text(0)}",5\n"{_text(1)}",1\n', encoding="utf-8")
  with pytest.raises(ValueError) as e:
    tasks.make_examples(_task(train_file=str(path), eval_file=str(path)), tok, 16)
  assert str(e.value) == f"{path}: no column 'label' (columns: text, stars)"


@pytest.mark.slow
def test_cli_null_label_is_one_error_line_and_nothing_written(tiny_data, tmp_path):
  """Checked while the data load: before the loop writes config.json, metrics or TensorBoard files (unchecked, the
null was a third class "None" and this run trained)."""
  path = tmp_path / "train.jsonl"
  path.write_text(_jsonl(*({"text": _text(i), "label": ["pos", "neg", None][i % 3]} for i in range(60))),
                  encoding="utf-8")
  out = tmp_path / "ft"
  r = subprocess.run([sys.executable, "-m", "electra_jax.finetune", "--config=configs/finetune/sentiment.py",
                      f"--config.tokenizer={tiny_data[1].tokenizer_path}", "--config.task.name=mine",
                      f"--config.task.train_file={path}", "--config.train.batch_size=8", f"--workdir={out}"],
                     cwd=ROOT, text=True, capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  helpers.assert_one_line_error(r, f"{path}: line 3: 'label' is null")
  assert not out.exists()
