"""A data_dir checked end to end (electra-check): every dataset prepared there, each shard read whole, the record
counts and the tokenizer against what electra-prepare recorded. Every problem is one line; nothing is written."""
import dataclasses
import os

import ml_collections
from etils import epath

from electra_jax.data import input_pipeline, integrity, prepared
from electra_jax.data import tokenizer as tokenizer_lib


@dataclasses.dataclass
class Report:
  problems: list[str] = dataclasses.field(default_factory=list)  # one line each
  checked: list[str] = dataclasses.field(default_factory=list)  # one line per dataset found well


def check(data_dir: str) -> Report:
  report = Report()
  names = prepared.variants(data_dir)
  if not names:
    report.problems.append(f"no prepared data at {epath.Path(data_dir) / prepared.NAME}: run electra-prepare with "
                           f"--config.data.data_dir={data_dir} first (or copy its data_dir whole)")
  for name in names:
    dataset = os.fspath(epath.Path(data_dir) / prepared.NAME / name / prepared.VERSION)
    problems, shards, examples = verify(dataset)
    problems = _tokenizer_problems(data_dir, dataset, prepared.metadata(dataset)) + problems
    report.problems += problems
    if not problems:
      report.checked.append(f"{dataset}: {shards} shards, {examples} examples, every record read; tokenizer as "
                            "recorded")
  return report


def verify(dataset: str) -> tuple[list[str], int, int]:
  """(one line per problem, shards, examples) of a dataset read whole: what electra-check and prepare --repair find."""
  problems, shards, examples = [], 0, 0
  recorded = prepared.metadata(dataset).get("stats", {})
  for split in ("train", "validation"):
    reader = input_pipeline.Reader(dataset, split, fail_fast=False)
    for s in range(len(reader.shard_lengths)):
      try:
        reader.verify(s)
      except integrity.Damaged as e:
        problems.append(str(e))
    counted = recorded.get(split, {}).get("examples")
    if counted is not None and counted != reader.num_examples:
      problems.append(f"the {split} split of the prepared dataset {dataset} has {reader.num_examples} examples, "
                      f"but electra-prepare counted {counted}: {integrity.REPAIR}")
    shards, examples = shards + len(reader.shard_lengths), examples + reader.num_examples
  return problems, shards, examples


def _tokenizer_problems(data_dir: str, dataset: str, meta: dict) -> list[str]:
  """The tokenizer the commands would pair with `dataset` against the SHA-256 that electra-prepare recorded."""
  if (settings := meta.get("settings")) is None:
    return []  # prepared before datasets recorded their settings: the run names its tokenizer
  config = ml_collections.ConfigDict({"data": dict(settings, data_dir=data_dir)})
  path = prepared.tokenizer_path(config)
  if not epath.Path(path).exists():
    return [f"tokenizer {path}, which the data at {dataset} was prepared with, is missing: copy the data_dir whole"]
  try:
    tokenizer_lib.Tokenizer(path).check_vocab_size(settings["vocab_size"])
  except ValueError as e:
    return [str(e)]
  if prepared.fingerprint(path) != meta.get("identity", {}).get("tokenizer_sha256"):
    return [f"tokenizer {path} is not the one the data at {dataset} was prepared with (its SHA-256 differs from the "
            "one recorded in metadata.json): copy it again, or run electra-prepare again"]
  return []
