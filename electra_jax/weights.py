"""Where weights come from: the one reader of a pre-training workdir, a params-only export or an HF ELECTRA directory
(a sources.Source: which, and its tokenizer, told from its files) into (config, params, tokenizer), used by export,
fine-tuning and train.init_from (a workdir's whole training state for train.init_from_state), and the params-only
export itself (config.json + params/, an Orbax checkpoint of the parameter tree without optimiser state).

A new weight format is one more branch in `read`."""
import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from electra_jax import checkpoints, modeling, objectives, optim, sharding, sources, state, storage
from electra_jax import workdir as workdir_lib
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
    params = objectives.init_params(model, config.objective.name, config.data.seq_len, rng)
    return params if tx is None else state.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  boxed = jax.eval_shape(init, jax.random.key(0))
  shapes = nn.meta.unbox(boxed)
  return shapes if mesh is None else state.abstract(shapes, sharding.tree_shardings(boxed, mesh))


def load(source: str, step: int | None = None, with_params: bool = True, generator: str | None = None) -> Weights:
  """The weights in the directory `source` (sources.py tells its kind; `generator`: an HF generator directory stored
  apart from an HF discriminator, as Google's releases keep them): `read` of it."""
  return read(sources.resolve(source, generator or ""), step, with_params)


def read(source: sources.Source, step: int | None = None, with_params: bool = True,
         mesh: jax.sharding.Mesh | None = None) -> Weights:
  """The weights `source` holds (a workdir's checkpoint at `step`, default the latest intact one), on `mesh` (default:
  every device, each holding them whole: the mesh they were trained on may not fit this host; HF weights: host
  arrays). with_params=False reads the architecture and tokenizer only."""
  if source.kind == "hf":
    config, params = hf_directory.import_hf(source.path, source.generator or None, source.tokenizer)
    return Weights(config, params if with_params else None, source.tokenizer)
  config = source.config
  if not with_params:
    return Weights(config, None, source.tokenizer)
  mesh = mesh or sharding.create_mesh(-1, 1)
  if source.kind == "params":
    return Weights(config, checkpoints.restore_params(os.path.join(source.path, sources.PARAMS_DIR),
                                                      abstract(config, mesh)), source.tokenizer)
  target = abstract(config, mesh, optim.create(config.train)[0])
  return Weights(config, _restore(source.path, config, target, step).params, source.tokenizer)


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


def params_onto(source: sources.Source, sharded: state.Sharded):
  """The weights in `source` placed on `sharded`'s mesh (restored onto it: the source's own mesh may not fit this
  host), after checking that they fit its parameters (the plan checked their tokenizer)."""
  loaded = read(source, mesh=sharded.mesh)
  _check_fit(source.path, sharded.abstract().params, loaded.params,
             "model sizes, vocabulary, embedding_sharing and objective must match")
  return jax.device_put(loaded.params, sharded.state.params)


def state_onto(source: sources.Source, sharded: state.Sharded, num_steps: int) -> state.TrainState:
  """train.init_from_state: the whole TrainState of the pre-training workdir `source` (its latest intact checkpoint:
  parameters, optimiser state and step) placed on `sharded`'s mesh, so that a second phase (e.g. at a longer
  data.seq_len) goes on with the first's Adam moments and learning-rate schedule. One-line errors where its optimiser
  state does not fit this run's optimiser, or where its step leaves no step to train up to `num_steps` (the plan
  checked that `source` is a workdir with the data's tokenizer)."""
  config = source.config
  target = sharded.abstract()
  _check_fit(source.path, target, abstract(config, tx=optim.create(config.train)[0]),
             "objective, model sizes, vocabulary and embedding_sharing must match: Adam's moments have the parameters' "
             "shapes")
  restored = _restore(source.path, config, target)
  step = int(restored.step)
  if step >= num_steps:
    raise ValueError(f"train.init_from={source.path} is at step {step}, which leaves nothing to train up to "
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
  source = sources.resolve(workdir)
  storage.refuse_overlap(out_dir, source.inputs(), "out_dir")
  storage.refuse_existing(out_dir, overwrite, "pass overwrite=True to replace it")
  loaded = read(source, step)
  with storage.staged_dir(out_dir, last="config.json") as tmp:  # sources.kind() looks for config.json first
    checkpoints.save_params(os.path.join(tmp, sources.PARAMS_DIR), loaded.params)
    workdir_lib.write_config(tmp, loaded.config)
  return storage.absolute(out_dir)


def export_hf(workdir: str, output: str, step: int | None = None, overwrite: bool = False):
  """A workdir's checkpoint (`step`, default: the latest) as an HF ELECTRA directory at `output`."""
  source = sources.resolve(workdir)
  storage.refuse_overlap(output, source.inputs(), "--output")  # before the (slow) restore
  storage.refuse_existing(output, overwrite)
  loaded = read(source, step)
  hf_directory.export(loaded.config, loaded.params, output, overwrite=overwrite, tokenizer_path=loaded.tokenizer)

