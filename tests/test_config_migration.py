"""A saved config is migrated onto today's schema once, where it is loaded: the version it was saved under noted, a
key added since filled as runs had it before, a key no longer in the schema dropped with a warning."""
import json

import pytest
from absl import logging

from electra_jax import config as config_lib
from electra_jax.finetune import config as ft_config
from electra_jax.run import workdir as workdir_lib


def _saved_before_version(config) -> dict:
  """`config` as config.json held it before `version` and train.flat_update existed, with a key since removed."""
  saved = json.loads(config.to_json_best_effort())
  del saved["version"], saved["train"]["flat_update"]
  saved["train"]["removed_knob"] = 3
  return saved


def test_old_config_json_is_read_onto_the_schema(tmp_path, monkeypatch):
  config = config_lib.base("tiny")
  config.train.num_steps = 7
  (tmp_path / "config.json").write_text(json.dumps(_saved_before_version(config)))
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda msg, *args: warnings.append(msg % args))
  loaded = workdir_lib.load_config(str(tmp_path))
  assert (loaded.version, loaded.train.flat_update, loaded.train.num_steps) == (1, False, 7)
  assert "removed_knob" not in loaded.train and any("train.removed_knob" in w for w in warnings)
  # The same run when the config says what it ran with; today's default flat update is another run.
  config.train.flat_update = False
  assert config_lib.changes(loaded, config) == []
  assert config_lib.changes(loaded, config_lib.base("tiny")) == ["train.flat_update: False -> True"]


def test_a_finetuning_workdir_is_read_onto_its_own_schema(tmp_path):
  ft = ft_config.base_config()
  ft.tokenizer = "t.model"
  (tmp_path / "config.json").write_text(json.dumps(_saved_before_version(ft)))
  ft.train.flat_update = False
  assert config_lib.changes(workdir_lib.saved_config(str(tmp_path), ft_config.base_config), ft) == []
  assert workdir_lib.saved_config(str(tmp_path / "none")) is None


def test_a_config_json_of_wrong_types_is_one_line(tmp_path):
  saved = json.loads(config_lib.base("tiny").to_json_best_effort())
  saved["train"]["num_steps"] = "many"
  (tmp_path / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match=r"config.json is not a valid config"):
    workdir_lib.load_config(str(tmp_path))
