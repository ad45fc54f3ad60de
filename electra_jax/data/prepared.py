"""Prepared data as the commands find it: where electra-prepare puts a config's tokenizer and dataset (named by a hash
of the settings that determine them), found from data_dir and seq_len alone. Reading only, without TensorFlow."""
import copy
import dataclasses
import hashlib
import json
import os

from etils import epath

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data.special_ids import SpecialIds

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


def settings(data) -> dict:
  """The data.* keys that determine a dataset, recorded in its metadata.json: the dataset describes itself."""
  return {k: data[k] for k in DATASET_KEYS}


def _ready(path) -> bool:
  return (epath.Path(path) / "dataset_info.json").exists()  # written last, by TFDS or storage.copy_tree


def variants(data_dir: str) -> list[str]:
  """The datasets prepared under `data_dir`, by name (seq<seq_len>_<hash>)."""
  root = epath.Path(data_dir) / NAME
  return sorted(p.name for p in root.iterdir() if _ready(p / VERSION)) if root.exists() else []


def _describe(data_dir: str, name: str) -> str:
  if (recorded := metadata(os.fspath(epath.Path(data_dir) / NAME / name / VERSION)).get("settings")) is None:
    return f"{name} (prepared before datasets recorded their settings)"
  corpus = recorded["text_files"] or recorded["tfds_name"] or "corpus:sotu"
  return f"{name} (data.text_files/tfds_name {corpus!r}, data.vocab_size={recorded['vocab_size']})"


def resolve(config):
  """`config` with the data.* settings of its dataset under data.data_dir: the one its data.* keys name, else the
  only one for its seq_len. A seq_len, vocabulary or tokenizer other than the data's is refused naming both."""
  data = config.data
  if _ready(dataset_dir(config)):
    return config
  names, where = variants(data.data_dir), epath.Path(data.data_dir) / NAME
  same = [n for n in names if n.startswith(f"seq{data.seq_len}_")]
  if not names:
    raise FileNotFoundError(f"no prepared data at {where}: run electra-prepare with this --config and "
                            f"--config.data.data_dir={data.data_dir} first")
  if not same:
    lengths = sorted({int(n[3:].split("_")[0]) for n in names})
    raise ValueError(f"data.seq_len={data.seq_len}, but the data prepared under {data.data_dir} has seq_len "
                     f"{', '.join(map(str, lengths))}: pass --config.data.seq_len=N to match it, or prepare "
                     f"seq_len {data.seq_len} with electra-prepare")
  if len(same) > 1:
    raise ValueError(f"{data.data_dir} holds {len(same)} datasets prepared for seq_len {data.seq_len}: "
                     f"{'; '.join(_describe(data.data_dir, n) for n in same)}: pass the --config.data.* overrides "
                     "electra-prepare was given for the one to use")
  path = os.fspath(where / same[0] / VERSION)
  meta = metadata(path)
  if (recorded := meta.get("settings")) is None:
    raise FileNotFoundError(f"no prepared data at {dataset_dir(config)}, and {path} was prepared before datasets "
                            "recorded their settings: run electra-prepare again with the same --config.data.* "
                            "overrides, or pass them here")
  if recorded["vocab_size"] != data.vocab_size:
    raise ValueError(f"data.vocab_size={data.vocab_size}, but the data at {path} was prepared with "
                     f"data.vocab_size={recorded['vocab_size']}: pass --config.data.vocab_size="
                     f"{recorded['vocab_size']}, or prepare this vocabulary with electra-prepare")
  if data.tokenizer and fingerprint(data.tokenizer) != meta["identity"]["tokenizer_sha256"]:
    raise ValueError(f"data.tokenizer={data.tokenizer} is not the tokenizer the data at {path} was prepared with "
                     f"({recorded['tokenizer'] or 'the one electra-prepare trained'}): pass that one, or prepare the "
                     "data with this one")
  config = copy.deepcopy(config)
  config.data.update(recorded)
  return config


def load(config) -> PreparedData:
  """The prepared dataset for `config` (found as `resolve` finds it); a one-line error when there is none."""
  return find(config)[1]


def find(config):
  """(`config` resolved, the prepared dataset it names): the one lookup of a run's data."""
  config = resolve(config)
  path = dataset_dir(config)
  tok = tokenizer_lib.Tokenizer(tokenizer_path(config))
  tok.check_vocab_size(config.data.vocab_size)
  meta = metadata(path)
  # Another tokenizer than the data's would train on ids that mean other pieces.
  recorded = meta.get("identity", {}).get("tokenizer_sha256")
  if recorded and recorded != fingerprint(tok.path):
    raise ValueError(f"tokenizer {tok.path} is not the one the data at {path} was prepared with (its SHA-256 differs "
                     "from the one recorded in metadata.json): put that tokenizer back, or run electra-prepare again "
                     "to re-tokenize the data with this one")
  return config, PreparedData(path, tok.path, tok.special_ids, tok.vocab_size, meta["stats"], tok.word_starts())
