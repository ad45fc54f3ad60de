"""configs/finetune/glue.py end to end on TFDS's mock GLUE (random text in each task's real features; nothing
downloaded): a tiny random-init encoder fine-tuned a few steps reports the task's metric and predicts the test split."""
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds
from scipy import stats

from configs.finetune import glue
from electra_jax import finetune


def test_every_task_builds_with_its_fields_and_recipe():
  for name in glue.TASKS:
    c = glue.get_config(name)
    assert c.task.tfds_name == f"glue/{name}" and c.task.metric in ("accuracy", "f1", "mcc", "pearson")
  mnli = glue.get_config("mnli,large")
  assert (mnli.task.text_field, mnli.task.text_b_field, mnli.task.eval_split) == ("premise", "hypothesis",
                                                                                 "validation_matched")
  assert (mnli.train.learning_rate, mnli.train.layer_decay) == (5e-5, 0.9)
  assert glue.get_config("rte").task.num_epochs == 10.0 and glue.get_config("stsb").task.type == "regression"
  with pytest.raises(ValueError, match="TASK"):
    glue.get_config("wnli")


def _metrics(predicted: list, labels: list) -> dict:
  """The reported metrics by their definitions, from the saved predictions (label names, or scores) and the labels."""
  if isinstance(predicted[0], float):
    return dict(pearson=np.corrcoef(predicted, labels)[0, 1], spearman=stats.spearmanr(predicted, labels)[0])
  right = [p == str(l) for p, l in zip(predicted, labels)]
  positive = [(p == "1", str(l) == "1") for p, l in zip(predicted, labels)]  # F1 is of label 1, as GLUE's
  tp, fp, fn = (sum(pair == want for pair in positive) for want in ((True, True), (True, False), (False, True)))
  return dict(accuracy=float(np.mean(right)), f1=2 * tp / (2 * tp + fp + fn))


@pytest.mark.parametrize("num_labels, present", [(2, 2), (2, 1), (3, 3), (6, 4)])
def test_classification_metrics_are_sklearns(num_labels, present):
  """Accuracy, F1 (binary, or macro over every class, absent ones included) and MCC agree with sklearn.metrics, also
  when some classes are never the label or never predicted."""
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(num_labels * 10 + present)
  for _ in range(20):
    labels = rng.integers(0, present, 50)
    logits = rng.normal(size=(50, num_labels)) + 2 * np.eye(num_labels)[labels] * rng.integers(0, 2, (50, 1))
    pred = logits.argmax(-1)
    got = finetune.compute_metrics(labels, logits, num_labels)
    assert got == pytest.approx(dict(
        accuracy=metrics.accuracy_score(labels, pred), mcc=metrics.matthews_corrcoef(labels, pred),
        f1=metrics.f1_score(labels, pred, average="binary" if num_labels == 2 else "macro",
                            labels=list(range(num_labels)) if num_labels > 2 else None, zero_division=0.0)), abs=1e-12)


@pytest.mark.parametrize("name,metrics", [("sst2", ["accuracy"]), ("mrpc", ["f1"]),
                                          ("stsb", ["pearson", "spearman"])])
def test_finetunes_on_mock_glue(name, metrics, tiny_data, tmp_path):
  c = glue.get_config(name)
  c.tokenizer = tiny_data[1].tokenizer_path  # random init: the tiny encoder below and this tokenizer
  c.model.update(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, embedding_size=32)
  c.seq_len = 32
  c.task.update(num_epochs=2.0, tfds_data_dir=str(tmp_path / "tfds"))  # no data there: the mock answers
  c.train.update(batch_size=16, eval_batch_size=16)
  # USE_CODE: examples from the dataset's features alone; USE_FILES would want metadata tfds lacks for stsb.
  with tfds.testing.mock_data(num_examples=48, policy=tfds.testing.MockPolicy.USE_CODE):
    finetune.finetune(c, str(tmp_path / "run"))
    labels = [r["label"] for r in finetune.load_rows(c.task)["eval"][0]]  # the mock's rows: seeded, the run's too
  results = json.loads((tmp_path / "run" / "eval_results.json").read_text(encoding="utf-8"))
  assert results["num_train"] == 48 and results["num_eval"] == 48 and results["steps_per_epoch"] == 3
  predicted = [json.loads(l)["prediction"] for l in
               (tmp_path / "run" / "predictions_eval.jsonl").read_text(encoding="utf-8").splitlines()]
  assert len(predicted) == len(labels) == 48
  expected = _metrics(predicted, labels)
  for m in metrics:
    assert results[m] == pytest.approx(expected[m], abs=1e-6), (m, results, expected)
  # The test split is predicted, its -1 labels unread.
  assert len((tmp_path / "run" / "predictions_test.jsonl").read_text(encoding="utf-8").splitlines()) == 48
