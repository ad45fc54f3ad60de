"""Orbax checkpoints of a pre-training workdir: the train state, the input position and the config, saved together
under <workdir>/checkpoints/<step>/ so a run resumes exactly where it stopped."""
import json
import os

import jax
import ml_collections
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every train.checkpoint_every steps (asynchronously), keeps the last train.keep_checkpoints."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict):
    self.config = config
    self._manager = ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir) if "://" not in workdir else workdir, "checkpoints"),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.train.keep_checkpoints,
                                             save_interval_steps=config.train.checkpoint_every,
                                             enable_async_checkpointing=True),
        item_names=("state", "data", "config"))

  def latest_step(self):
    return self._manager.latest_step()

  def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
    return self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state),
        config=ocp.args.JsonSave(json.loads(self.config.to_json()))), force=force)

  def restore(self, abstract_state, step=None):
    """(state, data_state) of `step` (default: the latest), placed with the shardings of `abstract_state`."""
    step = self._manager.latest_step() if step is None else step
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    return restored.state, restored.data

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()


def abstract(tree, shardings):
  """ShapeDtypeStructs carrying the target shardings: what Orbax restores onto (the current mesh)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a pre-training run wrote to <workdir>/config.json."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir} is not a pre-training workdir: {path} is missing")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


def load_params(workdir: str, step=None):
  """(config, params) of a pre-training workdir's checkpoint at `step` (default: the latest), on this host's
  devices: what export and fine-tuning start from."""
  from electra_jax import train  # pylint: disable=g-import-not-at-top
  config = load_config(workdir)
  ckpt = Checkpointer(workdir, config)
  if ckpt.latest_step() is None:
    raise FileNotFoundError(f"{workdir} has no checkpoint under {workdir}/checkpoints")
  exp = train.create(config)
  state, _ = ckpt.restore(abstract(jax.eval_shape(exp.init, jax.random.key(0)), exp.state_sharding), step)
  ckpt.close()
  return config, state.params
