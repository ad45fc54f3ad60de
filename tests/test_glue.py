"""configs/finetune/glue.py end to end on TFDS's mock GLUE (random text in each task's real features; nothing
downloaded): a tiny random-init encoder fine-tuned a few steps reports the task's metric and predicts the test split."""
import json

import pytest
import tensorflow_datasets as tfds

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
  results = json.loads((tmp_path / "run" / "eval_results.json").read_text(encoding="utf-8"))
  assert results["num_train"] == 48 and results["num_eval"] == 48 and results["steps_per_epoch"] == 3
  for m in metrics:
    assert -1.0 <= results[m] <= 1.0, results
  # The test split is predicted, its -1 labels unread.
  assert len((tmp_path / "run" / "predictions_test.jsonl").read_text(encoding="utf-8").splitlines()) == 48
