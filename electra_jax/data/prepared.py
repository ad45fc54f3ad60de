"""Prepared data, as the commands find it: where electra-prepare puts the tokenizer and the dataset for a config's
`data` section (one hash of the settings that determine them), the tokenizer's fingerprint, and `load`. Reading only:
no TensorFlow, and nothing here writes (build.py does)."""
import dataclasses
import hashlib
import json
import os

from etils import epath

from electra_jax import tokenizer as tokenizer_lib
from electra_jax.special_ids import SpecialIds

NAME = "electra_pretraining"  # the TFDS builder's name: the dataset's directory under data.data_dir
VERSION = "1.0.0"
FORMAT_VERSION = 1  # bump when packing changes what the same inputs produce
# What determines the corpus, hence the tokenizer trained on it; the dataset adds how it is tokenized and packed.
CORPUS_KEYS = ("text_files", "text_field", "text_b_field", "tfds_name", "tfds_split", "tfds_text_key", "max_documents",
               "split_sentences", "tokenizer_sentences")
DATASET_KEYS = CORPUS_KEYS[:-1] + ("tokenizer", "vocab_size", "tokenizer_sentences", "seq_len", "validation_fraction",
                                   "seed")  # in the order earlier versions hashed them: their data is found


@dataclasses.dataclass(frozen=True)
class PreparedData:
  dataset_dir: str  # the TFDS builder directory (tfds.builder_from_directory reads it)
  tokenizer_path: str
  special_ids: SpecialIds
  vocab_size: int
  stats: dict  # per split: documents, lines, tokens, truncated_tokens, examples, replaced_bytes
  word_starts: tuple[bool, ...]  # per id: the piece begins a word (objective.whole_word_masking)


def _hash(data, keys, salt=()) -> str:
  return hashlib.sha256(repr([*salt, *((k, data[k]) for k in keys)]).encode()).hexdigest()[:12]


def tokenizer_path(config) -> str:
  """data.tokenizer, else where electra-prepare puts the SentencePiece model it trains for this corpus and vocab."""
  data = config.data
  if data.tokenizer:
    return data.tokenizer
  return os.fspath(epath.Path(data.data_dir) / "tokenizer" / f"spm{data.vocab_size}_{_hash(data, CORPUS_KEYS)}.model")


def config_name(data) -> str:
  """The dataset's TFDS config name for a config's `data` section; computable without reading the corpus."""
  return f"seq{data.seq_len}_{_hash(data, DATASET_KEYS, [FORMAT_VERSION])}"


def dataset_dir(config) -> str:
  return os.fspath(epath.Path(config.data.data_dir) / NAME / config_name(config.data) / VERSION)


def fingerprint(path: str) -> str:
  """SHA-256 of a tokenizer file: data and checkpoints only continue with the tokenizer they were made with."""
  return hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()


def metadata(dataset: str) -> dict:
  """What electra-prepare recorded beside the dataset: its inputs' identity and the packing statistics."""
  return json.loads((epath.Path(dataset) / "metadata.json").read_text())


def load(config) -> PreparedData:
  """The prepared dataset for `config`; a clear error naming the missing path and the command if there is none."""
  path = dataset_dir(config)
  if not (epath.Path(path) / "dataset_info.json").exists():
    raise FileNotFoundError(f"no prepared data at {path}: run `electra-prepare --config=<this config>` with the same "
                            "--config.data.* overrides first")
  tok = tokenizer_lib.Tokenizer(tokenizer_path(config))
  tok.check_vocab_size(config.data.vocab_size)
  meta = metadata(path)
  # Another tokenizer than the one the data was tokenized with would train on ids that mean other pieces, and be
  # exported with the model.
  recorded = meta.get("identity", {}).get("tokenizer_sha256")
  if recorded and recorded != fingerprint(tok.path):
    raise ValueError(f"tokenizer {tok.path} is not the one the data at {path} was prepared with (its SHA-256 differs "
                     "from the one recorded in metadata.json): put that tokenizer back, or run electra-prepare again "
                     "to re-tokenize the data with this one")
  return PreparedData(path, tok.path, tok.special_ids, tok.vocab_size, meta["stats"], tok.word_starts())
