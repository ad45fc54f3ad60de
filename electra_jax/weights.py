"""Where weights come from: the one resolver of a pre-training workdir, a params-only export or an HF ELECTRA
directory (sources.py tells which, from its files) into (config, params, tokenizer), used by export, fine-tuning and
train.init_from (a workdir's whole training state for train.init_from_state), and the params-only export itself (config.json + params/, an Orbax
checkpoint of the parameter tree without optimiser state).

A new weight format is one more branch in `load`."""
import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from electra_jax import checkpoints, modeling, objectives, optim, sharding, sources, state, storage
from electra_jax import workdir as workdir_lib
from electra_jax.data import prepared
from electra_jax.hf import directory as hf_directory


class Weights(NamedTuple):
  config: ml_collections.ConfigDict  # the pre-training config the parameters fit (abstract(config))
  params: Any  # None when only the architecture was asked for
  tokenizer: str  # the tokenizer file they were trained with


def abstract(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None,
             tx: optax.GradientTransformation | None = None):
  """The parameters `config` builds, as ShapeDtypeStructs traced by jax.eval_shape (nothing compiled, nothing
  allocated), each carrying its sharding on `mesh` where one is given: what weights are restored onto. With the
  optimiser `tx`, the whole TrainState instead: a pre-training checkpoint is restored whole."""
  model = modeling.Electra(modeling.ModelConfig.from_config(config))

  def init(rng):
    params = objectives.init_params(model, config, rng)
    return params if tx is None else state.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  boxed = jax.eval_shape(init, jax.random.key(0))
  shapes = nn.meta.unbox(boxed)
  return shapes if mesh is None else state.abstract(shapes, sharding.tree_shardings(boxed, mesh))


def load(source: str, step: int | None = None, with_params: bool = True, generator: str | None = None) -> Weights:
  """The weights in `source` (a workdir's checkpoint at `step`, default the latest intact one), on this host's devices
  (HF weights: host arrays). `generator`: an HF generator directory stored apart from an HF discriminator (Google's
  releases keep them in two directories). with_params=False reads the architecture and tokenizer only."""
  what = sources.kind(source)
  if what == "hf":
    config, params = hf_directory.import_hf(source, generator_dir=generator)
    return Weights(config, params if with_params else None, config.data.tokenizer)
  if generator:
    raise ValueError(f"a separate generator ({generator}) goes with an HF discriminator directory, not a {what}")
  config = workdir_lib.load_config(source)
  tokenizer = prepared.tokenizer_path(config)
  if not with_params:
    return Weights(config, None, tokenizer)
  mesh = sharding.create_mesh(**config.mesh)
  if what == "params":
    return Weights(config, checkpoints.restore_params(os.path.join(source, sources.PARAMS_DIR), abstract(config, mesh)),
                   tokenizer)
  target = abstract(config, mesh, optim.create(config.train)[0])
  return Weights(config, _restore(source, config, target, step).params, tokenizer)


def _restore(workdir: str, config: ml_collections.ConfigDict, target, step: int | None = None) -> state.TrainState:
  """The TrainState of `workdir`'s checkpoint at `step` (default: the latest intact one), written with `config`,
  placed as `target` says."""
  if checkpoints.latest_step(workdir) is None:
    raise FileNotFoundError(f"{workdir} has no checkpoint under {workdir}/checkpoints")
  ckpt = checkpoints.Checkpointer(workdir, config, read_only=True)  # `workdir` may be a live run's
  try:
    return ckpt.restore(target, step).state
  finally:
    ckpt.close()


def for_config(config: ml_collections.ConfigDict, sharded: state.Sharded, source: str, generator: str = ""):
  """The weights in `source` (with an HF discriminator, `generator`'s: a separate generator directory) placed on
  `sharded`'s mesh, after checking that they fit `config` (the plan checked their tokenizer)."""
  loaded = load(source, generator=generator or None)
  _check_fit(source, abstract(config), loaded.params,
             "model sizes, vocabulary, embedding_sharing and objective must match")
  return jax.device_put(loaded.params, sharded.state.params)


def state_for_config(config: ml_collections.ConfigDict, sharded: state.Sharded, source: str) -> state.TrainState:
  """train.init_from_state: the whole TrainState of the pre-training workdir `source` (its latest intact checkpoint:
  parameters, optimiser state and step) placed on `sharded`'s mesh, so that a second phase (e.g. at a longer
  data.seq_len) goes on with the first's Adam moments and learning-rate schedule. One-line errors where its optimiser
  state does not fit this run's optimiser, or where its step leaves no step to train (the plan checked that `source`
  is a workdir with the data's tokenizer)."""
  saved = load(source, with_params=False)
  target = sharded.abstract()
  _check_fit(source, target, abstract(saved.config, tx=optim.create(saved.config.train)[0]),
             "objective, model sizes, vocabulary and embedding_sharing must match: Adam's moments have the parameters' "
             "shapes")
  restored = _restore(source, saved.config, target)
  step, num_steps = int(restored.step), config.train.num_steps
  if step >= num_steps:
    raise ValueError(f"train.init_from={source} is at step {step}, which leaves nothing to train up to "
                     f"train.num_steps={num_steps}: with train.init_from_state, train.num_steps counts the steps of "
                     "both runs (raise it)")
  return restored


def _check_fit(source: str, ours, theirs, hint: str):
  """A one-line error at the first path where init_from's tree `theirs` and this config's `ours` differ in shape."""
  ours, theirs = _shapes(ours), _shapes(theirs)
  for path in sorted(ours.keys() | theirs.keys()):
    if ours.get(path) != theirs.get(path):
      raise ValueError(f"train.init_from={source} does not fit this config at {path}: {theirs.get(path, 'missing')} "
                       f"there, {ours.get(path, 'absent')} here ({hint})")


def _shapes(tree) -> dict:
  return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def export_params(workdir: str, out_dir: str, step: int | None = None, overwrite: bool = False) -> str:
  """Writes the parameters of `workdir`'s checkpoint at `step` (default: the latest) to `out_dir`: config.json and
  params/, nothing else; all or nothing (storage.staged_dir). Run it on one host."""
  storage.refuse_overlap(out_dir, sources.inputs(workdir), "out_dir")
  storage.refuse_existing(out_dir, overwrite, "pass overwrite=True to replace it")
  loaded = load(workdir, step)
  with storage.staged_dir(out_dir, last="config.json") as tmp:  # sources.kind() looks for config.json first
    checkpoints.save_params(os.path.join(tmp, sources.PARAMS_DIR), loaded.params)
    workdir_lib.write_config(tmp, loaded.config)
  return storage.absolute(out_dir)


def export_hf(workdir: str, output: str, step: int | None = None, overwrite: bool = False):
  """A workdir's checkpoint (`step`, default: the latest) as an HF ELECTRA directory at `output`."""
  storage.refuse_overlap(output, sources.inputs(workdir), "--output")  # before the (slow) restore
  storage.refuse_existing(output, overwrite)
  loaded = load(workdir, step)
  hf_directory.export(loaded.config, loaded.params, output, overwrite=overwrite, tokenizer_path=loaded.tokenizer)

