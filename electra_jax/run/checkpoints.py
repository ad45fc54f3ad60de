"""Orbax checkpoints: a training workdir's (asynchronous, atomic, checked against their checksums when restored:
docs/reliability.md, "Checkpoints"), and bare parameter trees (a params-only export)."""
import contextlib
import json
import os
import re
import time
import zlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from electra_jax.data import prepared
from electra_jax.parallel import sharding
from electra_jax.runtime import outage, storage

# Each host writes whole arrays: Orbax's default slice per replica costs a dispatched op for each of hundreds of arrays.
ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                                        override=True)

RETRIES = 3  # failed saves on gs:// saved again in a row (Checkpointer._retry)
TOKENIZER_KEY = "tokenizer_sha256"  # the checkpointer's own key in the `data` item; the loop's payload has the rest


class Restored(NamedTuple):
  state: Any
  extra: dict  # the payload save() was given
  rng: jax.Array | None  # None for checkpoints written without one
  config: dict  # the config the checkpoint was written with


class CorruptCheckpointError(ValueError):
  """A checkpoint that cannot be read, or whose arrays differ from the checksums saved with it."""

  def __init__(self, step: int, message: str):
    super().__init__(message)
    self.step = step


class OtherModelError(ValueError):
  """A checkpoint of another model: at `name` its array is `saved`, the run's `wanted` (a shape or None)."""

  def __init__(self, where: str, name: str, saved, wanted, saved_config: dict | None = None):
    super().__init__(f"{where} holds a model of other shapes than this config builds (e.g. {name}: {saved} saved, "
                     f"{wanted} here): resume with the settings it was written with, or use a new --workdir")
    self.where, self.name, self.saved, self.wanted = where, name, saved, wanted
    self.saved_config = saved_config or {}


class Checkpointer:
  """Saves asynchronously, keeps the last train.keep_checkpoints; every process must call save and close."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict, tokenizer_path: str | None = None,
               read_only: bool = False):
    """`workdir`: an absolute path. read_only: a reader's (export, init_from), which deletes nothing of a live run."""
    self.config = config
    self.directory = os.path.join(workdir, "checkpoints")
    self.last_saved = None
    self.restored_step = None
    self._failure = None  # the failed save's one-line error, once reported
    self._state_bytes = 0
    self._pending = None  # (step, its save's args, its state) of the newest save: what a failed last save retries
    self._retries = 0
    self._tokenizer = prepared.fingerprint(tokenizer_path) if tokenizer_path else None
    if read_only:  # every option Orbax would otherwise turn off with a warning each
      self._options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False,
                                                   lightweight_initialize=True)
    else:
      self._options = ocp.CheckpointManagerOptions(
          max_to_keep=config.train.keep_checkpoints, enable_async_checkpointing=True, cleanup_tmp_directories=True,
          create=False,  # the first save creates the directory: a run that fails its checks writes nothing
          # Every checkpoint_every steps and at a preemption; not Orbax's default extra save at a run's first step.
          save_decision_policy=ocp.checkpoint_managers.AnySavePolicy([
              ocp.checkpoint_managers.FixedIntervalPolicy(config.train.checkpoint_every),
              ocp.checkpoint_managers.PreemptionCheckpointingPolicy()]))
    self._manager = self._open()

  def _open(self) -> ocp.CheckpointManager:
    with _without_read_only_notice():
      return ocp.CheckpointManager(
          self.directory, options=self._options,
          # PyTree's handler (Standard's is a strict wrapper of it) restores a part of the state: init_from's params.
          item_handlers=dict(state=ocp.PyTreeCheckpointHandler(),
                             **{k: ocp.JsonCheckpointHandler() for k in ("data", "rng", "config", "checksums")}))

  def latest_step(self):
    return self._manager.latest_step()

  def check_start(self, step: int):
    """A run continues from `step` only where a dispatch of train.steps_per_dispatch steps ends, as its saves do."""
    k = self.config.train.steps_per_dispatch
    if step % k:
      raise ValueError(f"the run starts from step {step}, not a multiple of train.steps_per_dispatch={k}: continue it "
                       f"with a train.steps_per_dispatch that divides {step}")

  def newest_complete(self) -> str:
    """The newest complete checkpoint in words, as storage has it now (a save in flight is not one)."""
    try:
      steps = ocp.path.step.checkpoint_steps(self.directory)
    except (OSError, ValueError):  # no checkpoints/ yet
      steps = []
    return (f"the newest complete checkpoint is step {max(steps)} under {self.directory}" if steps else
            f"no checkpoint was complete yet under {self.directory}")

  def should_save(self, step: int) -> bool:
    return self._manager.should_save(step)

  def save(self, step: int, state, extra: dict | None = None, force: bool = False,
           rng: jax.Array | None = None) -> bool:
    """Starts saving (a failed earlier save raises here); `extra`: the loop's JSON payload, given back by restore."""
    if not (force or self._manager.should_save(step)):
      return False
    data = dict(extra or {}, **{TOKENIZER_KEY: self._tokenizer})
    self._state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))  # what a full disk's line says it needs
    rng_data = None if rng is None else np.asarray(jax.random.key_data(rng)).tolist()
    args = ocp.args.Composite(
        state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data), rng=ocp.args.JsonSave(rng_data),
        config=ocp.args.JsonSave(json.loads(self.config.to_json())), checksums=ocp.args.JsonSave(checksums(state)))
    try:
      try:
        saved = self._manager.save(step, args=args, force=force)  # raises a failure of the save before, if any
        self._retries = 0  # that save completed
      except Exception as e:  # pylint: disable=broad-except
        if not self._retry(e):
          raise
        saved = self._manager.save(step, args=args, force=force)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(e) from e
    if saved:
      self.last_saved, self._pending = step, (step, args, state)
    return saved

  def _retry(self, e: Exception) -> bool:
    """Whether to save again after the failed save `e` (readied): on gs://, single-process, RETRIES in a row at most."""
    if not storage.is_remote(self.directory) or jax.process_count() > 1 or self._retries >= RETRIES:
      return False
    self._retries += 1
    logging.warning("saving a checkpoint under %s failed (%s): saving again once the store answers (retry %d of %d)",
                    self.directory, _first_line(e), self._retries, RETRIES)
    deadline = time.monotonic() + outage.timeout_s()
    while not outage.answering(timeout=5) and time.monotonic() < deadline:
      time.sleep(1)
    with contextlib.suppress(Exception):  # the failed save's error, raised again
      self._manager.close()
    self._manager = self._open()
    return True

  def restore(self, abstract_state=None, step: int | None = None, set_aside_corrupt: bool = False) -> Restored:
    """The checkpoint at `step` (default: the newest intact one; newer corrupt ones set aside if `set_aside_corrupt`),
    placed with `abstract_state`'s shardings (a dict: that part; None: whole on every device), or a one-line error."""
    if step is not None:
      return self._restore(abstract_state, step)
    if not self._manager.all_steps():
      raise FileNotFoundError(f"no checkpoint under {self.directory}")
    for _ in range(5):  # a live run (read by export or init_from) may delete a step while it is read: look again
      corrupt, vanished = [], False
      for step in sorted(self._manager.all_steps(), reverse=True):
        try:
          restored = self._restore(abstract_state, step)
        except CorruptCheckpointError as e:
          if (epath.Path(self.directory) / str(step)).exists():
            corrupt.append(e)
          else:
            vanished = True
          continue
        for e in corrupt:
          kept = self._set_aside(e.step) if set_aside_corrupt else "it is kept"
          logging.warning("%s: using step %d instead, the newest intact checkpoint (%s)", e, step, kept)
        if set_aside_corrupt and corrupt:
          self._manager.reload()
        return restored
      if not vanished:
        break
      self._manager.reload()
    raise ValueError(f"no intact checkpoint under {self.directory}: {'; '.join(map(str, corrupt))}. Move them "
                     "aside to start afresh, or use a new --workdir")

  def _restore(self, abstract_state, step: int) -> Restored:
    where = f"checkpoint {os.path.join(self.directory, str(step))}"
    items = dict(data=ocp.args.JsonRestore(), rng=ocp.args.JsonRestore(), config=ocp.args.JsonRestore())
    if (epath.Path(self.directory) / str(step) / "checksums").exists():  # none in checkpoints of older code
      items["checksums"] = ocp.args.JsonRestore()
    try:
      saved = self._manager.restore(step, args=ocp.args.Composite(**items))
      saved_state = self._manager.item_metadata(step).state.tree
    except Exception as e:  # pylint: disable=broad-except  (Orbax and TensorStore raise many kinds)
      raise _unreadable(step, where, e) from e
    if abstract_state is None:
      abstract_state = as_saved(saved_state)
    elif isinstance(abstract_state, dict):  # a part of the state
      saved_state = {k: saved_state.get(k) for k in abstract_state}
    check_model(where, saved_state, abstract_state, saved.config)
    extra = dict(saved.data)
    tokenizer = extra.pop(TOKENIZER_KEY, None)
    if self._tokenizer and tokenizer not in (None, self._tokenizer):
      raise ValueError(f"{where} was trained with another tokenizer (their SHA-256 differ): resume with the "
                       "tokenizer it was trained with, or use a new --workdir")
    try:
      state = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          abstract_state, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state),
          partial_restore=True))).state
    except Exception as e:  # pylint: disable=broad-except
      raise _unreadable(step, where, e) from e
    if "checksums" in items:
      saved_sums = saved.checksums
      sums, saved_sums = ((checksums(state)["arrays"], saved_sums["arrays"]) if saved_sums.get("kind") == CHECKSUM
                          else (_crc32s(state), saved_sums))  # older checkpoints': CRC-32s, computed on the host
      if differ := sorted(k for k, v in sums.items() if saved_sums.get(k) != v):
        raise CorruptCheckpointError(step, f"{where} is corrupt: the bytes of {len(differ)} of its {len(sums)} arrays "
                                     f"(e.g. {differ[0]}) differ from the checksums saved with it")
    bad = non_finite(state)
    if bad:  # written by older code, which could save a diverged state: no start for a run nor an export
      raise CorruptCheckpointError(step, f"{where} holds non-finite values (NaN/Inf in {len(bad)} arrays, e.g. "
                                   f"{bad[0]}): the run that wrote it had diverged")
    rng = None if saved.rng is None else jax.random.wrap_key_data(np.asarray(saved.rng, np.uint32))
    self.restored_step = step
    return Restored(state, extra, rng, saved.config)

  def _set_aside(self, step: int) -> str:
    path = epath.Path(self.directory) / str(step)
    n = 1  # <step>.corrupt, else <step>.corrupt2, ...
    while (target := path.with_name(f"{step}.corrupt{n if n > 1 else ''}")).exists():
      n += 1
    if jax.process_index() == 0:
      path.rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"electra_jax set aside {step}")
    return f"kept as {target}"

  def close(self):
    """Waits for the pending save, then closes; raises if it failed (unless save() already raised that failure)."""
    reported = self._failure is not None
    try:
      try:
        self._wait()
      finally:
        self._manager.close()
    except Exception as e:  # pylint: disable=broad-except
      error = self._save_failed(e)
      if not reported:
        raise error from e

  def _wait(self):
    """Waits for the pending save; saves it again (`_retry`) where it failed and its state is still at hand."""
    try:
      self._manager.wait_until_finished()
      self._retries = 0
    except Exception as e:  # pylint: disable=broad-except
      leaves = jax.tree.leaves(self._pending[2]) if self._pending else []
      donated = any(x.is_deleted() for x in leaves if isinstance(x, jax.Array))
      if self._pending is None or donated or not self._retry(e):
        raise
      step, args, _ = self._pending
      self._manager.save(step, args=args, force=True)
      self._wait()

  def _save_failed(self, e: Exception) -> OSError:
    """The one-line error of a failed save, once its temporary directories are gone, whichever thread saw it first."""
    if self._failure is None:
      space = ""
      if storage.no_space(e, storage.DISK_FULL) and not storage.is_remote(self.directory):
        space = (f"; no space: a checkpoint needs about {storage.size(self._state_bytes)}, and its disk has "
                 f"{storage.size(storage.free_space(self.directory))} free")
      self._failure = OSError(f"saving a checkpoint under {self.directory} failed ({_first_line(e)}{space}); the "
                              "earlier checkpoints are intact: free space or fix the cause, then re-run to resume")
      with contextlib.suppress(Exception):  # the save's other threads stop; the same failure is raised again
        self._manager.wait_until_finished()
      if jax.process_index() == 0:
        _remove_tmp_dirs(self.directory)
    return self._failure


def check_model(where: str, saved_tree, wanted_tree, saved_config: dict | None = None):
  """An OtherModelError naming an array whose shape differs, or a ValueError where only the optimiser's layout does."""
  shapes = lambda tree: {name: tuple(v.shape) for name, v in _named_leaves(tree)}
  saved, wanted = shapes(saved_tree), shapes(wanted_tree)
  if saved != wanted:
    differ = sorted(set(saved.items()) ^ set(wanted.items()))
    if all(name.startswith("opt_state.") for name, _ in differ):  # the same model, another optimiser layout
      flat = {k: _flat_rows(shapes) for k, shapes in (("saved", saved), ("wanted", wanted))}
      if None not in flat.values():  # flat both, laid out for another split of the weights
        raise ValueError(f"{where} holds its optimiser state flat over mesh.fsdp={flat['saved']}, this run over "
                         f"{flat['wanted']}: resume with --config.mesh.data=-1 --config.mesh.fsdp={flat['saved']} "
                         "(optim.py; the flat update's layout follows the weights' split)")
      layout = lambda rows: "per weight array" if rows is None else "flat"
      raise ValueError(f"{where} holds its optimiser state {layout(flat['saved'])}, this run "
                       f"{layout(flat['wanted'])}: resume with --config.train.flat_update={flat['saved'] is not None} "
                       "(optim.py; a flat update runs on GPUs and CPUs)")
    name = next(n for n, _ in differ if not n.startswith("opt_state."))  # a weight says more than a moment
    raise OtherModelError(where, name, saved.get(name), wanted.get(name), saved_config)


def as_saved(tree_metadata):
  """Orbax's metadata of a saved tree as its ShapeDtypeStructs, whole on every device: a reader's default target."""
  replicated = sharding.replicated(sharding.create_mesh(-1, 1))
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=replicated), tree_metadata)


def _remove_tmp_dirs(directory: str, quiet_s: float = 1.0, limit_s: float = 60.0):
  """Deletes <step>.orbax-checkpoint-tmp* until none appears for `quiet_s` (TensorStore finishes started writes)."""
  quiet_since = start = time.monotonic()
  while time.monotonic() - quiet_since < quiet_s and time.monotonic() - start < limit_s:
    for tmp in epath.Path(directory).glob("*.orbax-checkpoint-tmp*"):
      quiet_since = time.monotonic()
      with contextlib.suppress(OSError):  # changed while deleting it: the next round finishes it
        tmp.rmtree()
    time.sleep(0.05)


@contextlib.contextmanager
def _without_read_only_notice():
  """Orbax warns "Given directory is read only" whenever a read-only manager is made: what a reader is meant to be."""
  drop = lambda record: "Given directory is read only" not in record.getMessage()
  logging.get_absl_logger().addFilter(drop)
  try:
    yield
  finally:
    logging.get_absl_logger().removeFilter(drop)


def _first_line(e: BaseException) -> str:
  text = str(e).strip().split(" See full TensorStore details")[0]  # Orbax's addition: a bound method's repr
  return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _unreadable(step: int, where: str, e: Exception) -> CorruptCheckpointError:
  return CorruptCheckpointError(step, f"{where} is unreadable ({_first_line(e)})")


def _named_leaves(tree):
  """('params.discriminator.layer_0...', leaf): the same names for a TrainState and Orbax's metadata tree."""
  return ((".".join(re.findall(r"\w+", jax.tree_util.keystr(k))), v)
          for k, v in jax.tree_util.tree_leaves_with_path(tree))


def _flat_rows(shapes: dict) -> int | None:
  """The mesh.fsdp a flat optimiser state was laid out for (its matrix's rows, else 1), or None for one per weight."""
  moments = [shape for name, shape in shapes.items() if name.startswith("opt_state.")]
  if len(moments) > sum(name.startswith("params.") for name in shapes):
    return None
  return next((shape[0] for shape in moments if len(shape) == 2), 1)


CHECKSUM = "sum32"  # the kind of checksums() a checkpoint holds; older ones hold bare CRC-32s (_crc32s)


def checksums(tree) -> dict:
  """{"kind": CHECKSUM, "arrays": {name: checksum}}: each array's 32-bit words times an odd multiplier of their place,
  summed modulo 2^32, where the arrays live (docs/reliability.md): the same on any mesh, and no copy to the host."""
  names, leaves = zip(*_named_leaves(tree)) if jax.tree.leaves(tree) else ((), ())
  return dict(kind=CHECKSUM, arrays=dict(zip(names, map(int, jax.device_get(_sums(list(leaves)))))))


class _Ahead:
  """A jitted function of a list of arrays, compiled ahead for a run's state (compile_checks)."""

  def __init__(self, fn):
    self._jit, self._compiled = jax.jit(fn), {}

  def compile(self, structs: list):
    self._compiled[_key(structs)] = self._jit.lower(structs).compile()

  def __call__(self, leaves: list):
    return self._compiled.get(_key(leaves), self._jit)(leaves)


def _key(leaves: list) -> tuple:
  return tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves)  # numpy arrays too (weights.py)


def compile_checks(abstract_state):
  """Compiles checksums() and non_finite() for `abstract_state` ahead, rather than at the first save."""
  _sums.compile([x for _, x in _named_leaves(abstract_state)])
  _all_finite.compile([x for _, x in _named_leaves(abstract_state) if jnp.issubdtype(x.dtype, jnp.inexact)])


_sums = _Ahead(lambda leaves: [_sum32(x) for x in leaves])


def _sum32(x: jax.Array) -> jax.Array:
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  else:  # 8-byte types become two words (a trailing dimension), narrower ones one
    words = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32))
    words = words.astype(jnp.uint32)
  place = jnp.zeros(words.shape, jnp.uint32)  # row-major index, from iotas: a reshape would move a split array
  for axis, stride in enumerate(np.cumprod((words.shape + (1,))[:0:-1])[::-1]):
    place += jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride % 2**32)
  return jnp.sum(words * (place * 2 + 1) * jnp.uint32(0x9E3779B1), dtype=jnp.uint32)


def non_finite(tree) -> list[str]:
  """The names of `tree`'s floating-point arrays that hold a NaN or Inf."""
  named = [(name, x) for name, x in _named_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  flags = jax.device_get(_all_finite([x for _, x in named])) if named else []
  return [name for (name, _), finite in zip(named, flags) if not finite]


_all_finite = _Ahead(lambda leaves: [jnp.isfinite(x).all() for x in leaves])


def _crc32s(tree) -> dict:
  """{name: CRC-32 of the global array's bytes}: older checkpoints' checksums, each array copied to the host."""
  crc = lambda x: zlib.crc32(np.ascontiguousarray(sharding.to_host(x)).reshape(-1).view(np.uint8))
  return {name: crc(x) for name, x in _named_leaves(tree)}


def latest_step(workdir: str) -> int | None:
  """The newest complete step under workdir/checkpoints, or None (no CheckpointManager: its thread may print)."""
  return max(ocp.path.step.checkpoint_steps(epath.Path(storage.absolute(workdir)) / "checkpoints"), default=None)


def read_state(workdir: str, config: ml_collections.ConfigDict, target=None, step: int | None = None):
  """The state (or `target`'s part) of `workdir`'s checkpoint at `step` (default: the latest intact), read only."""
  with contextlib.closing(Checkpointer(workdir, config, read_only=True)) as ckpt:
    return ckpt.restore(target, step).state


def save_params(directory: str, params):
  """A bare parameter tree as one Orbax checkpoint at `directory` (a params-only export)."""
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(storage.absolute(directory), params)


def restore_params(directory: str, abstract_params=None):
  """save_params' tree at the absolute `directory`, placed per `abstract_params` (None: whole on every device)."""
  with ocp.StandardCheckpointer() as ckptr:
    saved = ckptr.metadata(directory).item_metadata.tree
    if abstract_params is None:
      abstract_params = as_saved(saved)
    check_model(directory, saved, abstract_params)
    return ckptr.restore(directory, abstract_params)
