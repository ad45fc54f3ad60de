"""What a run reports: metrics.jsonl and TensorBoard scalars, rewound to a resumed run's start, written by a thread of
their own so the training loop never waits on a disk or a bucket."""
import contextlib
import json
import os
import queue
import sys
import threading
import time
import types

import jax
import numpy as np
from etils import epath

from electra_jax.runtime import storage


def _import_tensorboardx():
  """tensorboardX's writers and protos, imported with torch held off (slow to import, and only for its tensors)."""
  hold = "torch" not in sys.modules
  if hold:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
  try:
    from tensorboardX import event_file_writer, record_writer  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
  finally:
    if hold:
      del sys.modules["torch"]
  return event_file_writer.EventsWriter, record_writer, event_pb2, summary_pb2


EventsWriter, record_writer, event_pb2, summary_pb2 = _import_tensorboardx()

TRAIN_FIELDS = ("step", "loss", "mlm_loss", "disc_loss", "mlm_accuracy", "disc_accuracy", "replaced_fraction",
                "learning_rate", "grad_norm", "tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s")


def _jsonable(v):
  if v is None:
    return None
  v = float(np.asarray(v))
  return v if np.isfinite(v) else None


class Writer:
  """Appends to <workdir>/metrics.jsonl and tensorboard/ on process 0 from a thread, whose first error the next
  `write` or `close` raises; opened at `start_step`, it drops what a killed run logged past it."""

  def __init__(self, workdir: str, start_step: int = 0):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    self._path = epath.Path(workdir) / "metrics.jsonl"
    _rewind(self._path, start_step)
    if storage.is_remote(workdir):
      self._jsonl = RemoteLog(self._path)
    else:
      os.makedirs(os.path.join(workdir, "tensorboard"), exist_ok=True)
      self._jsonl = open(self._path, "a", encoding="utf-8")
    self._tb = EventsWriter(os.path.join(workdir, "tensorboard", "events"))
    if start_step:  # TensorBoard hides the events a killed run logged past this restart
      self._tb.write_event(event_pb2.Event(step=start_step + 1, session_log=event_pb2.SessionLog(
          status=event_pb2.SessionLog.START)))
    self._queue, self._error = queue.SimpleQueue(), None
    self._thread = threading.Thread(target=self._drain, name="metrics-writer", daemon=True)
    self._thread.start()

  def write(self, step: int, scalars: dict):
    if not self.active:
      return
    self._raise()
    self._queue.put({"step": int(step), **{k: _jsonable(v) for k, v in scalars.items() if k != "step"}})

  def _drain(self):
    while (record := self._queue.get()) is not None:
      if self._error is not None:
        continue
      try:
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in record.items()
                  if k != "step" and v is not None]
        self._tb.write_event(event_pb2.Event(wall_time=time.time(), step=record["step"],
                                             summary=summary_pb2.Summary(value=values)))
        self._tb.flush()
      except Exception as e:  # pylint: disable=broad-except  (raised on the caller's thread)
        self._error = e

  def _raise(self):
    if self._error is not None:  # a failed writer stays failed: later records are dropped, not half-written
      raise self._error

  def close(self):
    if self.active and self._thread is not None:
      self._queue.put(None)
      self._thread.join()
      self._thread = None
      try:
        self._jsonl.close()
        self._tb.close()
      finally:
        self._raise()


class RemoteLog:
  """A file on gs:// that grows by composed appends, uploaded whole every MAX_PARTS (docs/launch.md, Cloud Storage)."""
  MAX_PARTS = 512

  def __init__(self, path, binary: bool = False):
    import fsspec  # pylint: disable=g-import-not-at-top  (gs:// only: gcsfs's)
    path = epath.Path(path)
    self._fs, self._key = fsspec.core.url_to_fs(str(path))
    self._path, self._binary, self._parts = path, binary, self.MAX_PARTS  # written whole at the first flush
    self._data = path.read_bytes() if path.exists() else b""
    self._buffer = b""

  def write(self, data: str | bytes):
    self._buffer += data if self._binary else data.encode("utf-8")

  def flush(self):
    if not self._buffer:
      return
    self._data += self._buffer
    if self._parts < self.MAX_PARTS and self._append(self._buffer):
      self._parts += 1
    else:
      storage.write(self._path, self._data)
      self._parts = 1
    self._buffer = b""

  def _append(self, new: bytes) -> bool:
    """Whether `new`, uploaded beside the file and composed onto it, made the file what was written. Not where the
    store did a request whose answer it lost and gcsfs retried it: a part composed twice, or deleted and then not
    found; the file is then written whole."""
    part = f"{self._key}.part"
    try:
      self._fs.pipe_file(part, new)
      self._fs.merge(self._key, [self._key, part])
      self._fs.rm_file(part)
    except FileNotFoundError:
      return False
    self._fs.invalidate_cache(self._key)
    return self._fs.size(self._key) == len(self._data)

  close = flush


# tensorboardX's gs:// event files through RemoteLog, not its GCS writer (docs/launch.md); a bucket has no directories.
record_writer.register_writer_factory("gs", types.SimpleNamespace(open=lambda path: RemoteLog(path, binary=True),
                                                                  directory_check=lambda path: None))


def _rewind(path: epath.Path, step: int):
  """Keeps the records up to `step` (and no line cut by a kill): a resumed run logs each step once."""
  if not path.exists():
    return
  kept = []
  for line in path.read_text().splitlines(keepends=True):
    with contextlib.suppress(ValueError, KeyError):
      if json.loads(line)["step"] <= step:
        kept.append(line)
  storage.write(path, "".join(kept))
