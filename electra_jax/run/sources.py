"""What a weights source is (a pre-training workdir, a params export or an HF directory), told from its files alone so
that electra-prepare finds its tokenizer without the model stack; `init_source` decides a pre-training run's."""
import copy
import dataclasses
import json
import os

import ml_collections
from etils import epath

from electra_jax.data import prepared
from electra_jax.hf import tokenizer as hf_tokenizer
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import storage

PARAMS_DIR = "params"  # a params export's parameter tree, beside its config.json


def kind(source: str) -> str:
  """"hf" | "params" | "workdir", or a one-line error naming what `source` lacks."""
  path, config = epath.Path(source), epath.Path(source) / "config.json"
  if not path.is_dir():
    raise FileNotFoundError(f"{source} is not a directory")
  if config.exists() and "model_type" in json.loads(config.read_text()):  # HF's config.json
    return "hf"
  if (path / PARAMS_DIR).is_dir():
    return "params"
  if config.exists():
    return "workdir"
  raise FileNotFoundError(f"{source} is neither a pre-training workdir, a params export nor an HF ELECTRA directory "
                          "(no config.json)")


def hf_tokenizer_file(directory: str) -> str:
  """Our tokenizer in an HF directory: an exported sentencepiece.model, else a WordPiece vocab.txt."""
  for name in (hf_tokenizer.SPM_FILE, hf_tokenizer.VOCAB_FILE):
    if (epath.Path(directory) / name).exists():
      return os.fspath(epath.Path(directory) / name)
  raise FileNotFoundError(f"{directory} has neither {hf_tokenizer.SPM_FILE} nor {hf_tokenizer.VOCAB_FILE}: no "
                          "tokenizer electra_jax can read")


@dataclasses.dataclass(frozen=True)
class Source:
  path: str  # absolute (a URL as it is)
  kind: str  # "hf" | "params" | "workdir"
  tokenizer: str  # the tokenizer file its weights were trained with
  generator: str = ""  # an HF discriminator's generator, kept in a directory apart (Google's releases)
  config: ml_collections.ConfigDict | None = None  # a workdir's or params export's config.json (HF: None)
  # (path, what it is) of everything loading it reads, for storage.refuse_overlap (an export may lie in a workdir).
  inputs: tuple[tuple[str, str], ...] = ()


def resolve(path: str, generator: str = "") -> Source:
  """The source at `path` (`generator`: an HF discriminator's generator directory), or a one-line error."""
  what = kind(path)
  if generator and what != "hf":
    raise ValueError(f"a separate generator ({generator}) goes with an HF discriminator directory, not a {what}")
  if what == "hf":
    config, tokenizer_file = None, hf_tokenizer_file(path)
  else:  # the tokenizer its config.json names
    config = workdir_lib.load_config(path)
    tokenizer_file = prepared.tokenizer_path(config)
  path, tokenizer_file = storage.absolute(path), storage.absolute(tokenizer_file)
  if what == "workdir":
    inputs = [(os.path.join(path, name), f"the workdir's {name}") for name in ("config.json", "checkpoints")]
  else:
    inputs = [(path, "the HF directory to load" if what == "hf" else "the params to load")]
  if what != "hf":
    inputs.append((tokenizer_file, "its tokenizer"))
  return Source(path, what, tokenizer_file, generator, config, tuple(inputs))


def init_source(config: ml_collections.ConfigDict, resuming: bool = False
                ) -> tuple[ml_collections.ConfigDict, Source | None]:
  """train.init_from as a Source (or None), and `config` with data.data_dir absolute and data.tokenizer set to its
  tokenizer where it names none (electra-prepare and electra-pretrain agree on it; a resuming run takes only that).
  One-line errors for an init_from_state without an optimiser state, and for a tokenizer other than data.tokenizer."""
  train, data = config.train, config.data
  if train.init_from_state and not train.init_from and not resuming:
    raise ValueError("train.init_from_state needs train.init_from: the pre-training workdir whose optimiser state and "
                     "step to continue")
  init = None
  if train.init_from and not (resuming and data.tokenizer):
    init = resolve(train.init_from, train.init_from_generator)
    if not resuming and train.init_from_state and init.kind != "workdir":
      what = "an HF directory" if init.kind == "hf" else "a params export"
      raise ValueError(f"train.init_from_state: {init.path} is {what}, which holds no optimiser state: name a "
                       "pre-training workdir, or drop init_from_state to start from its weights with a fresh optimiser")
    if not resuming and data.tokenizer and (prepared.fingerprint(data.tokenizer) !=
                                            prepared.fingerprint(init.tokenizer)):
      raise ValueError(f"train.init_from={init.path}: its tokenizer is not data.tokenizer={data.tokenizer}: drop "
                       f"data.tokenizer, or prepare with --config.data.tokenizer={init.tokenizer}")
  config = copy.deepcopy(config)
  own = prepared.tokenizer_path(config)
  # Unless the same vocabulary already prepared this config's data.
  if init and not data.tokenizer and not (epath.Path(own).exists() and
                                          prepared.fingerprint(own) == prepared.fingerprint(init.tokenizer)):
    config.data.tokenizer = init.tokenizer
  # Absolute in config.json: export and init_from read the tokenizer through it from any directory.
  config.data.data_dir = storage.absolute(data.data_dir)
  return config, init
