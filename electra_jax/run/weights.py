"""Where weights come from: the one reader of a pre-training workdir, a params-only export or an HF ELECTRA directory
(a sources.Source: which, and its tokenizer, told from its files) into (config, params, tokenizer), used by export,
fine-tuning and train.init_from (a workdir's whole training state for train.init_from_state), and the params-only
export itself (config.json + params/, an Orbax checkpoint of the parameter tree without optimiser state).

A new weight format is one more branch in `read`."""
import os
from typing import Any, NamedTuple

import jax
import ml_collections

from electra_jax.hf import directory as hf_directory
from electra_jax.parallel import sharding, state
from electra_jax.run import checkpoints, sources
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import storage


class Weights(NamedTuple):
  config: ml_collections.ConfigDict  # the pre-training config the parameters fit
  params: Any  # None when only the architecture was asked for
  tokenizer: str  # the tokenizer file they were trained with


def load(source: str, step: int | None = None, with_params: bool = True, generator: str | None = None) -> Weights:
  """The weights in the directory `source` (sources.py tells its kind; `generator`: an HF generator directory stored
  apart from an HF discriminator, as Google's releases keep them): `read` of it."""
  return read(sources.resolve(source, generator or ""), step, with_params)


def read(source: sources.Source, step: int | None = None, with_params: bool = True, target=None) -> Weights:
  """The weights `source` holds (a workdir's checkpoint at `step`, default the latest intact one: one whose weights
  are finite, checkpoints.Checkpointer.restore). `target`: the parameters' ShapeDtypeStructs carrying the shardings to
  place them with, which they must fit (a one-line checkpoints.OtherModelError at the first difference); default: as
  saved, whole on every device (the mesh they were trained on may not fit this host), HF weights as host arrays.
  with_params=False reads the architecture and tokenizer only. Weights that are not finite are refused in one line,
  whatever their kind: export and init_from never start from a diverged run."""
  config, params = source.config, None
  if source.kind == "hf":
    config, params = hf_directory.import_hf(source.path, source.tokenizer, source.generator or None)
    if target is not None:
      checkpoints.check_model(source.path, params, target)
      params = jax.device_put(params, jax.tree.map(lambda x: x.sharding, target))
  elif with_params and source.kind == "params":
    params = checkpoints.restore_params(os.path.join(source.path, sources.PARAMS_DIR), target)
  elif with_params:  # the checkpointer passes over (or names, at `step`) a checkpoint that is not finite
    target = None if target is None else dict(params=target)
    return Weights(config, checkpoints.read_state(source.path, config, target, step)["params"], source.tokenizer)
  bad = checkpoints.non_finite(params) if with_params else []
  if bad:
    raise ValueError(f"{source.path} holds non-finite weights (NaN/Inf in {len(bad)} arrays, e.g. {bad[0]}): they "
                     "come from a run that had diverged; export or start from an earlier checkpoint of it")
  return Weights(config, params if with_params else None, source.tokenizer)


def start_state(source: sources.Source | None, sharded: sharding.Sharded, seed: int, with_state: bool = False,
                num_steps: int = 0) -> state.TrainState:
  """A fresh pre-training run's state on `sharded`'s mesh: initialised from `seed`, with the parameters of
  train.init_from's `source` where there is one (restored onto this mesh), which must fit this config's. with_state
  (train.init_from_state): the workdir `source`'s whole TrainState instead (its latest intact checkpoint), so that a
  second phase goes on with the first's Adam moments and schedule, which must leave steps up to `num_steps`."""
  try:
    if not with_state:
      fresh = sharded.init(jax.random.key(seed))
      return fresh if source is None else fresh.replace(params=read(source, target=sharded.abstract().params).params)
    restored = checkpoints.read_state(source.path, source.config, sharded.abstract())
  except checkpoints.OtherModelError as e:
    theirs, ours = ("missing" if e.saved is None else e.saved), ("absent" if e.wanted is None else e.wanted)
    hint = ("objective, model sizes, vocabulary and embedding_sharing must match: Adam's moments have the parameters' "
            "shapes" if with_state else "model sizes, vocabulary, embedding_sharing and objective must match")
    raise ValueError(f"train.init_from={source.path} does not fit this config at {e.name}: {theirs} there, {ours} "
                     f"here ({hint})") from None
  if int(restored.step) >= num_steps:
    raise ValueError(f"train.init_from={source.path} is at step {int(restored.step)}, which leaves nothing to train "
                     f"up to train.num_steps={num_steps}: with train.init_from_state, train.num_steps counts the "
                     "steps of both runs (raise it)")
  return restored


def export_params(workdir: str, out_dir: str, step: int | None = None, overwrite: bool = False) -> str:
  """Writes the parameters of `workdir`'s checkpoint at `step` (default: the latest) to `out_dir`: config.json and
  params/, nothing else; all or nothing (storage.staged_dir). Run it on one host."""
  source = sources.resolve(workdir)
  storage.refuse_overlap(out_dir, source.inputs, "out_dir")
  storage.refuse_existing(out_dir, overwrite, "pass overwrite=True to replace it")
  loaded = read(source, step)
  with storage.staged_dir(out_dir, last="config.json") as tmp:  # sources.kind() looks for config.json first
    checkpoints.save_params(os.path.join(tmp, sources.PARAMS_DIR), loaded.params)
    workdir_lib.write_config(tmp, loaded.config)
  return storage.absolute(out_dir)


def export_hf(workdir: str, output: str, step: int | None = None, overwrite: bool = False):
  """A workdir's checkpoint (`step`, default: the latest) as an HF ELECTRA directory at `output`."""
  source = sources.resolve(workdir)
  storage.refuse_overlap(output, source.inputs, "--output")  # before the (slow) restore
  storage.refuse_existing(output, overwrite)
  loaded = read(source, step)
  hf_directory.export(loaded.config, loaded.params, output, overwrite=overwrite, tokenizer_path=loaded.tokenizer)

