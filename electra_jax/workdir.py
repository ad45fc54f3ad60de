"""A pre-training workdir's own files and checks: config.json (written, read, compared when a run resumes) and the
fingerprints that tie a checkpoint to its tokenizer. Paths may be local or gs:// (storage.py)."""
import hashlib
import json
import os

import jax
import ml_collections
from absl import logging
from etils import epath

from electra_jax import storage

# Keys that may change when a workdir resumes: length, logging and checkpoint cadence, layout and locations. Any other
# difference means another run, which resuming would silently mix in.
RESUMABLE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every", "train.eval_batches",
                  "train.checkpoint_every", "train.keep_checkpoints", "train.debug_nan_at_step", "mesh.", "model.remat",
                  "data.data_dir", "data.num_workers")


def fingerprint(path: str) -> str:
  """SHA-256 of a file (the tokenizer): a checkpoint only continues with the tokenizer it was trained with."""
  return hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def config_changes(old: dict, new: dict) -> list[str]:
  """'key: old -> new' for every key both configs have that differs, except RESUMABLE_KEYS."""
  old, new = _flat(old), _flat(new)
  return [f"{k}: {old[k]!r} -> {new[k]!r}" for k in sorted(old.keys() & new.keys())
          if old[k] != new[k] and not k.startswith(RESUMABLE_KEYS)]


def check_workdir(workdir: str, config: ml_collections.ConfigDict, allow_config_change: bool = False):
  """Before anything is written: the workdir can be written, and holds no other run unless `allow_config_change`."""
  if not storage.is_remote(workdir):
    existing = os.path.abspath(workdir)
    while not os.path.exists(existing):
      existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
      raise NotADirectoryError(f"workdir {workdir} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
      raise PermissionError(f"workdir {workdir} is not writable (no write access to {existing})")
  if not epath.Path(workdir, "config.json").exists():
    return
  changes = config_changes(load_config(workdir).to_dict(), json.loads(config.to_json()))
  if changes and not allow_config_change:
    raise ValueError(f"workdir {workdir} holds another run (its config.json differs: {'; '.join(changes)}): use a "
                     "new --workdir, or pass --allow_config_change to continue it with this config")
  if changes:
    logging.warning("Continuing %s with a changed config (--allow_config_change): %s", workdir, "; ".join(changes))


def write_config(workdir: str, config: ml_collections.ConfigDict):
  """<workdir>/config.json, written atomically by process 0."""
  if jax.process_index() == 0:
    storage.write(epath.Path(workdir) / "config.json", config.to_json_best_effort(indent=2))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a pre-training run (or a params-only export) wrote to <dir>/config.json."""
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{workdir} is not a pre-training workdir: {path} is missing")
  try:
    return ml_collections.ConfigDict(json.loads(path.read_text()))
  except ValueError as e:
    raise ValueError(f"{path} is not a valid config ({e})") from e
