"""What a weights source is (a pre-training workdir, a params export or an HF ELECTRA directory: train.init_from,
electra-finetune's init_from, electra-export's --workdir) and which files it holds, from its files alone: nothing here
reads weights or builds a model (weights.py loads them), so electra-prepare finds init_from's tokenizer without the
model stack. `with_init_tokenizer` is the one place that decides which tokenizer a pre-training run uses."""
import copy
import json
import os

import ml_collections
from etils import epath

from electra_jax import storage
from electra_jax import workdir as workdir_lib
from electra_jax.data import prepared
from electra_jax.hf import tokenizer as hf_tokenizer

PARAMS_DIR = "params"  # a params export's parameter tree, beside its config.json


def is_hf_dir(directory: str) -> bool:
  path = epath.Path(directory) / "config.json"
  return path.exists() and "model_type" in json.loads(path.read_text())


def kind(source: str) -> str:
  """"hf" | "params" | "workdir", or a one-line error naming what `source` lacks."""
  path = epath.Path(source)
  if not path.is_dir():
    raise FileNotFoundError(f"{source} is not a directory")
  if is_hf_dir(source):
    return "hf"
  if (path / PARAMS_DIR).is_dir():
    return "params"
  if (path / "config.json").exists():
    return "workdir"
  raise FileNotFoundError(f"{source} is neither a pre-training workdir, a params export nor an HF ELECTRA directory "
                          "(no config.json)")


def tokenizer(source: str) -> str:
  """The tokenizer file `source`'s weights were trained with: an HF directory's sentencepiece.model or vocab.txt, or
  the one its config.json names (a workdir's or a params export's)."""
  if kind(source) == "hf":
    return storage.absolute(hf_tokenizer.tokenizer_file(source))
  return prepared.tokenizer_path(workdir_lib.load_config(source))


def inputs(source: str) -> list[tuple[str, str]]:
  """(path, what it is) of everything weights.load(source) reads, for storage.refuse_overlap: a workdir's
  config.json, checkpoints and tokenizer (not the whole workdir: an export inside it is fine), an export's whole
  directory."""
  what = kind(source)
  if what == "hf":
    return [(source, "the HF directory to load")]
  paths = [(source, f"the {what} to load")] if what == "params" else [
      (os.path.join(source, name), f"the workdir's {name}") for name in ("config.json", "checkpoints")]
  return paths + [(tokenizer(source), "its tokenizer")]


def with_init_tokenizer(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with data.tokenizer set to train.init_from's tokenizer when it names none: continued pre-training keeps
  the vocabulary its weights were trained with. electra-prepare and electra-pretrain both resolve it, so they agree."""
  if config.data.tokenizer or not config.train.init_from:
    return config
  theirs = tokenizer(config.train.init_from)
  own = prepared.tokenizer_path(config)
  if epath.Path(own).exists() and prepared.fingerprint(own) == prepared.fingerprint(theirs):
    return config  # the same vocabulary already prepared this config's data
  config = copy.deepcopy(config)
  config.data.tokenizer = theirs
  return config
