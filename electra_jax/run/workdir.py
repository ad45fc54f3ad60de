"""A training workdir's own files: config.json (read back onto today's schema) and plan.json (what the run's plan
decided), whether it can be written or emptied, and the lock that keeps it one writer's. Local or gs:// paths."""
import contextlib
import itertools
import json
import os
import socket
import threading
import time
import uuid

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from electra_jax import config as config_lib
from electra_jax.runtime import jax_private, storage

PLAN_FILE = "plan.json"


def check_writable(workdir: str, name: str = "workdir"):
  """The local output directory `workdir` (`name` in the errors) can be written or created; gs:// is not checked."""
  if storage.is_remote(workdir):
    return
  existing = os.path.abspath(workdir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise NotADirectoryError(f"{name} {workdir} cannot be created: {existing} is a file")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise PermissionError(f"{name} {workdir} is not writable (no write access to {existing})")


def saved_config(workdir: str, schema=config_lib.base) -> ml_collections.ConfigDict | None:
  """load_config(workdir, schema), or None where `workdir` has no config.json."""
  return load_config(workdir, schema) if epath.Path(workdir, "config.json").exists() else None


def holds_files(workdir: str) -> bool:
  """Whether `workdir` holds anything but its lock."""
  path = epath.Path(workdir)
  return path.exists() and any(p.name != LOCK_FILE for p in path.iterdir())


def empty(workdir: str):
  """Deletes everything in `workdir` but the lock (ours, held until the run ends): --config.overwrite."""
  logging.warning("Replacing %s (--config.overwrite)", workdir)
  for p in epath.Path(workdir).iterdir():
    if p.name != LOCK_FILE:
      p.rmtree() if p.is_dir() else p.unlink()


def write_config(workdir: str, config: ml_collections.ConfigDict):
  """<workdir>/config.json, written atomically by process 0."""
  if jax.process_index() == 0:
    storage.write(epath.Path(workdir) / "config.json", config.to_json_best_effort(indent=2))


def write_plan(workdir: str, config: ml_collections.ConfigDict, plan: dict):
  """<workdir>/config.json and plan.json (its data or task, tokenizer, start), by process 0, once every check passed."""
  write_config(workdir, config)
  if jax.process_index() == 0:
    storage.write(epath.Path(workdir) / PLAN_FILE, json.dumps(plan, indent=2))


def load_config(workdir: str, schema=config_lib.base) -> ml_collections.ConfigDict:
  """The config a run (or a params-only export) wrote to <dir>/config.json, migrated onto `schema()` (from_saved)."""
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{workdir} is not a pre-training workdir: {path} is missing")
  try:
    return config_lib.from_saved(json.loads(path.read_text()), schema(), os.fspath(path))
  except (ValueError, TypeError, AttributeError) as e:
    raise ValueError(f"{path} is not a valid config ({e})") from e


LOCK_FILE = ".lock"
HEARTBEAT_S = 10  # how often the holder rewrites its lock
STALE_S = 300  # a lock of another machine that stays unchanged this long, while a newcomer watches, is taken over
WATCH_S = 1  # how often a newcomer looks at the lock it watches
_entered = itertools.count()  # the Locks this process entered: their key in the coordination service


class Lock:
  """<workdir>/.lock, one writer's while readers read on: its holder's record, created only where none exists and
  rewritten every HEARTBEAT_S, taken over once its process ended or (another machine's) it stayed unchanged for STALE_S
  while watched (docs/reliability.md). Process 0 takes it for all; `check()` tells a holder that lost it."""

  def __init__(self, workdir: str, command: str):
    self.workdir = workdir
    self.path = os.path.join(storage.absolute(workdir), LOCK_FILE)
    self._file = None if jax.process_index() else _GcsFile(self.path) if storage.is_remote(self.path) else (
        _LocalFile(self.path))
    self.record = dict(command=command, host=socket.gethostname(), host_id=storage.this_host(), boot=_boot(),
                       pid=os.getpid(), started=_started(os.getpid()), since=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       beat=0, token=uuid.uuid4().hex)
    self.lost = None  # the one-line reason, once the lock was taken over
    self._version = None  # what our lock is now (a Version)
    self._written = 0.0  # when (monotonic) the last write of our lock that landed began
    self._writing = threading.Lock()  # a rewrite, and check()'s look at the lock, one at a time
    self._created = None  # the topmost directory this lock created (removed on release when empty)
    self._stop = threading.Event()
    self._thread = None

  def __enter__(self):
    refusal = None
    if jax.process_index() == 0:
      try:
        self._acquire()
      except Exception as e:  # pylint: disable=broad-except  (raised below, once the others know)
        refusal = e
    if jax.process_count() > 1:  # the others stop too, in the same line
      refusal = _tell_others(f"electra_jax/lock/{next(_entered)}", refusal)
    if refusal is not None:
      raise refusal
    return self

  def __exit__(self, *exc):
    if self._version is None:
      return
    self._stop.set()
    self._thread.join()
    try:
      if self.lost is None:
        self._file.delete(self._version)
    except Exception as e:  # pylint: disable=broad-except  (never hide the run's own error)
      logging.warning("Could not delete the workdir lock %s: %s", self.path, e)
    self._version = None
    if self._created:  # a run that wrote nothing else leaves no directory behind
      directory = os.path.dirname(self.path)
      while os.path.commonpath([directory, self._created]) == self._created:
        try:
          os.rmdir(directory)
        except OSError:
          break
        directory = os.path.dirname(directory)

  def check(self):
    """Raises OSError on every process once the lock was taken over or not rewritten for STALE_S - HEARTBEAT_S."""
    if self._version is not None and self.lost is None:
      with self._writing:
        try:
          holder, version = self._file.read()
        except Exception as e:  # pylint: disable=broad-except  (a network blip: as long as the rewrites land)
          logging.warning("Could not read the workdir lock %s: %s", self.path, e)
          holder, version = self.record, self._version
        if version != self._version:
          self.lost = f"now held by {_who(holder)}" if holder else "its lock file was deleted"
        elif time.monotonic() - self._written > STALE_S - HEARTBEAT_S:
          self.lost = f"it could not be rewritten for {time.monotonic() - self._written:.0f} s"
    lost = self.lost
    if jax.process_count() > 1:
      lost = bool(multihost_utils.broadcast_one_to_all(np.int32(bool(lost)))) and (lost or "process 0 lost it")
    if lost:
      raise OSError(f"stopped without saving: the lock on workdir {self.workdir} was taken over ({lost})")

  def _acquire(self):
    if not storage.is_remote(self.path):
      directory = os.path.dirname(self.path)
      while not os.path.exists(directory):
        self._created, directory = directory, os.path.dirname(directory)
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
    for _ in range(20):  # each round loses only to another writer's create or takeover in between
      self._written = time.monotonic()
      self._version = self._file.create(self._data())
      if self._version is not None:
        break
      holder, version = self._file.read()
      if version is None:  # released meanwhile
        continue
      if holder and _here(holder):
        if not _ended(holder):
          raise self._in_use(holder)
        reason = f"{_who(holder)} has ended"
      else:
        now = self._watch(holder, version)
        if now is not None:  # it changed: the same holder's heartbeat refuses; a release or another holder, again
          if holder and now.get("token") == holder.get("token"):
            raise self._in_use(now)
          continue
        reason = f"{_who(holder)} left its lock unchanged for {STALE_S} s while this run watched it"
      logging.warning("Taking over the lock on %s: %s", self.workdir, reason)
      self._file.delete(version)  # only if unchanged: a race with another taker is decided by the create
    else:
      raise OSError(f"could not lock workdir {self.workdir}: its lock {self.path} kept changing")
    self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
    self._thread.start()

  def _in_use(self, holder: dict) -> OSError:
    return OSError(f"workdir {self.workdir} is in use by {_who(holder)}: wait for it to end or stop it; a lock whose "
                   f"holder has gone is taken over (on its machine at once, from another once it has stayed unchanged "
                   f"for {STALE_S} s; lock file {self.path})")

  def _watch(self, holder: dict | None, version) -> dict | None:
    """Watches the lock for STALE_S: its record ({} once released) as soon as it changes, None if it never did."""
    logging.warning("Workdir %s is locked by %s on another machine: watching its lock for up to %d s (taken over if "
                    "it stays unchanged, refused as soon as its holder rewrites it)", self.workdir, _who(holder),
                    STALE_S)
    start = time.monotonic()
    while time.monotonic() - start < STALE_S:
      time.sleep(WATCH_S)
      now, now_version = self._file.read()
      if now_version != version or now != holder:
        return now or {}
    return None

  def _data(self) -> bytes:
    self.record["beat"] += 1
    return json.dumps(self.record).encode()

  def _beat(self):
    while not self._stop.wait(HEARTBEAT_S):
      with self._writing:
        began = time.monotonic()
        try:
          version = self._file.replace(self._data(), self._version)
        except Exception as e:  # pylint: disable=broad-except  (a network blip: the next beat tries again)
          logging.warning("Could not refresh the workdir lock %s: %s", self.path, e)
          continue
        if version is None:
          holder, _ = self._file.read()
          self.lost = f"now held by {_who(holder)}" if holder else "its lock file was deleted"
          logging.error("Lost the lock on workdir %s: %s", self.workdir, self.lost)
          return
        self._version, self._written = version, began


def _tell_others(key: str, refusal: Exception | None) -> Exception | None:
  """Process 0's refusal (or None) for every process, through the key-value store (a collective would time out)."""
  client = jax_private.coordination_client()
  if jax.process_index() == 0:
    client.key_value_set(key, "" if refusal is None else str(refusal) or type(refusal).__name__)
    return refusal
  try:
    answer = client.blocking_key_value_get(key, int((STALE_S + 300) * 1000))
  except Exception as e:  # pylint: disable=broad-except  (process 0 is gone, or still watching)
    answer = f"process 0 did not say whether it locked workdir {key} ({' '.join(str(e).split())})"
  return OSError(answer) if answer else None


def _boot() -> str:
  """This boot of this machine (Linux), or '' where it cannot be told: a pid names a process within one boot only."""
  return storage.read_local("/proc/sys/kernel/random/boot_id")


def _started(pid: int) -> int | None:
  """When process `pid` started, in clock ticks since boot (Linux), or None: tells a pid reused by another process."""
  fields = storage.proc_stat(pid)
  return int(fields[19]) if len(fields) > 19 else None


def _here(holder: dict) -> bool:
  """Whether the holder's process is one this process can look at: the same host, pid namespace and boot."""
  return holder.get("host_id") == storage.this_host() and holder.get("boot", _boot()) == _boot()


def _ended(holder: dict) -> bool:
  """Whether the process of a holder _here has ended (its pid gone, or now another process's)."""
  pid = int(holder.get("pid", -1))
  return storage.process_gone(holder["host_id"], pid) or holder.get("started", _started(pid)) != _started(pid)


def _who(holder: dict | None) -> str:
  if not holder:
    return "another run (its lock is being written)"
  return (f"{holder.get('command', 'another run')} (pid {holder.get('pid')} on host {holder.get('host')}, since "
          f"{holder.get('since')})")


# Which lock file a store holds now: locally (inode, mtime in ns), on gs:// the object's generation.
Version = tuple[int, int] | int


def _parse(data: bytes, version: Version) -> tuple[dict | None, Version]:
  """(the holder's record, or None while it is being written, version)."""
  try:
    return json.loads(data), version
  except ValueError:
    return None, version


class _LocalFile:
  """The lock file on a local (or network) file system: created with O_CREAT|O_EXCL, replaced and deleted by renames
  (not atomic with their check, but a takeover only follows STALE_S of silence)."""

  def __init__(self, path: str):
    self.path = path

  def _version(self, st: os.stat_result) -> Version:
    return st.st_ino, st.st_mtime_ns

  def _write(self, f, data: bytes) -> Version:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
    return self._version(os.fstat(f.fileno()))

  def read(self) -> tuple[dict | None, Version | None]:
    try:
      with open(self.path, "rb") as f:
        return _parse(f.read(), self._version(os.fstat(f.fileno())))
    except FileNotFoundError:
      return None, None

  def create(self, data: bytes) -> Version | None:
    storage.remove_leftovers(self.path)  # replace()'s temporaries of a killed holder
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return None
    with os.fdopen(fd, "wb") as f:
      return self._write(f, data)

  def replace(self, data: bytes, version: Version) -> Version | None:
    if self.read()[1] != version:
      return None
    tmp = storage.temp_path(self.path)
    try:
      with open(tmp, "wb") as f:
        new = self._write(f, data)
      os.replace(tmp, self.path)
    except BaseException:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
      raise
    return new

  def delete(self, version: Version):
    moved = storage.temp_path(self.path)
    try:
      os.rename(self.path, moved)
    except FileNotFoundError:
      return
    if self._version(os.stat(moved)) != version:  # another writer's: back in place, unless a third took the name
      with contextlib.suppress(FileExistsError):
        os.link(moved, self.path)
    os.unlink(moved)


class _GcsFile:
  """The lock object on gs://: every change is conditional on the generation it replaces, so Cloud Storage decides."""

  def __init__(self, path: str):
    from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    bucket, self.name = path[len("gs://"):].split("/", 1)
    self.bucket = gcs.Client().bucket(bucket)  # STORAGE_EMULATOR_HOST (storage.initialize) points it at an emulator
    self.lost_races = (exceptions.PreconditionFailed, exceptions.NotFound)

  def read(self) -> tuple[dict | None, Version | None]:
    try:
      blob = self.bucket.get_blob(self.name)
      if blob is None:
        return None, None
      data = blob.download_as_bytes(if_generation_match=blob.generation)
    except self.lost_races:
      return None, None
    return _parse(data, blob.generation)

  def create(self, data: bytes) -> Version | None:
    return self.replace(data, 0)  # generation 0: no object yet

  def replace(self, data: bytes, version: Version) -> Version | None:
    blob = self.bucket.blob(self.name)
    try:
      blob.upload_from_string(data, content_type="application/json", if_generation_match=version)
    except self.lost_races:
      return None
    return blob.generation

  def delete(self, version: Version):
    with contextlib.suppress(*self.lost_races):
      self.bucket.blob(self.name).delete(if_generation_match=version)
