"""The exported tokenizer_config.json loads in every transformers setup.py allows, not only the installed one."""
import json

import transformers

from electra_jax.hf import tokenizer as hf_tokenizer


def test_tokenizer_config_names_a_class_transformers_4_has(tiny_data, tmp_path):
  """transformers 5 would save its TokenizersBackend, which 4.x (setup.py allows >=4.45) cannot load;
  PreTrainedTokenizerFast gives the same ids in 4.45, 4.57 and 5.x (checked by hand on such an export; the ids'
  parity with ours is tests/test_export.py's)."""
  hf_tokenizer.save_tokenizer(tiny_data[1].tokenizer_path, str(tmp_path), 128)
  config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
  assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
  hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert (hf.model_max_length, hf.pad_token_id, hf.mask_token_id) == (128, 0, 4)
  assert hf("a b", "c")["token_type_ids"][-1] == 1
