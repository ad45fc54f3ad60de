"""Where weights come from: the one reader of a sources.Source (a new format is one more branch in `read`), for
export, fine-tuning and train.init_from, and the params-only export (config.json + params/, an Orbax checkpoint)."""
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
  """`read` of the directory `source` (`generator`: an HF discriminator's generator, apart in Google's releases)."""
  return read(sources.resolve(source, generator or ""), step, with_params)


def read(source: sources.Source, step: int | None = None, with_params: bool = True, target=None) -> Weights:
  """The weights `source` holds (a workdir's at `step`, default the latest intact), placed per `target`, which they must
  fit (default: whole on every device; HF: host arrays); with_params=False: no params. Non-finite weights: an error."""
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
  if bad := (checkpoints.non_finite(params) if with_params else []):
    raise ValueError(f"{source.path} holds non-finite weights (NaN/Inf in {len(bad)} arrays, e.g. {bad[0]}): they "
                     "come from a run that had diverged; export or start from an earlier checkpoint of it")
  return Weights(config, params if with_params else None, source.tokenizer)


def start_state(source: sources.Source | None, sharded: sharding.Sharded, seed: int, with_state: bool = False,
                num_steps: int = 0) -> state.TrainState:
  """A fresh pre-training run's state on `sharded`'s mesh, from `seed`, with init_from's `source` parameters where
  there is one; with_state (init_from_state): `source`'s whole TrainState, whose step must leave some to `num_steps`."""
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
  """`workdir`'s parameters at `step` as config.json and params/ in `out_dir`, all or nothing, on one host."""
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

