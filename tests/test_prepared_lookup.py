"""Prepared data is found from data.data_dir and data.seq_len alone (its metadata.json records the data.* settings that
made it), and a real mismatch is refused in one line naming both sides."""
import shutil

import pytest

from electra_jax.data import prepared as prepared_lib


@pytest.fixture
def moved(tiny_data, tmp_path):
  """The tiny prepared data copied to a data_dir of its own, and the config without the data.* overrides that made
  it (as a TPU VM's pre-training, whose corpus is elsewhere)."""
  config, prepared = tiny_data
  config = config.copy_and_resolve_references()
  shutil.copytree(config.data.data_dir, tmp_path / "data")
  config.data.update(data_dir=str(tmp_path / "data"), max_documents=0)
  return config, prepared


def test_found_from_data_dir_and_seq_len(moved, tiny_data):
  config, prepared = moved
  assert prepared_lib.config_name(config.data) != prepared.dataset_dir.split("/")[-2]  # not by the settings' hash
  assert prepared_lib.resolve(config).data.max_documents == tiny_data[0].data.max_documents
  found = prepared_lib.load(config)
  assert found.dataset_dir.split("/")[-3:] == prepared.dataset_dir.split("/")[-3:]
  assert found.tokenizer_path.split("/")[-1] == prepared.tokenizer_path.split("/")[-1]


@pytest.mark.parametrize("override, message", [
    (dict(seq_len=128), r"data.seq_len=128, but the data prepared under .*/data has seq_len 64: pass "),
    (dict(vocab_size=3000), r"data.vocab_size=3000, but the data at .* was prepared with data.vocab_size=2000"),
])
def test_a_mismatch_names_both_sides(moved, override, message):
  config, _ = moved
  config.data.update(override)
  with pytest.raises(ValueError, match=message):
    prepared_lib.resolve(config)


def test_another_tokenizer_is_refused(moved, tmp_path):
  config, prepared = moved
  other = tmp_path / "other.model"
  other.write_bytes(open(prepared.tokenizer_path, "rb").read() + b"\0")
  config.data.tokenizer = str(other)
  with pytest.raises(ValueError, match=r"data.tokenizer=.*other.model is not the tokenizer the data at .* was "
                                       r"prepared with \(the one electra-prepare trained\)"):
    prepared_lib.resolve(config)


def test_several_variants_are_listed(moved):
  config, prepared = moved
  root = prepared_lib.epath.Path(config.data.data_dir) / prepared_lib.NAME
  shutil.copytree(root / prepared.dataset_dir.split("/")[-2], root / "seq64_000000000000")
  with pytest.raises(ValueError, match=r"holds 2 datasets prepared for seq_len 64: seq64_000000000000 \(data.text_"
                                       r"files/tfds_name 'corpus:sotu', data.vocab_size=2000\); seq64_\w+ \(.*\): pass "
                                       r"the --config.data.\* overrides electra-prepare was given"):
    prepared_lib.resolve(config)
