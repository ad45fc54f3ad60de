"""What a run reports: metrics.jsonl (one JSON object per logged step) and TensorBoard scalars, rewound to the step a
resumed run starts from. Its throughput and MFU figures come from flops.py."""
import json
import os
import sys
import time

import jax
import numpy as np
from etils import epath

from electra_jax import storage


def _import_tensorboardx():
  """tensorboardX's event writer and protos, imported with torch held off: tensorboardX imports torch where it is
  installed, only to accept torch tensors (we log floats), and that took 1.5 s of every command's start."""
  hold = "torch" not in sys.modules
  if hold:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
  try:
    from tensorboardX import event_file_writer  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
  finally:
    if hold:
      del sys.modules["torch"]
  return event_file_writer.EventFileWriter, event_pb2, summary_pb2


EventFileWriter, event_pb2, summary_pb2 = _import_tensorboardx()

TRAIN_FIELDS = ("step", "loss", "mlm_loss", "disc_loss", "mlm_accuracy", "disc_accuracy", "replaced_fraction",
                "learning_rate", "grad_norm", "tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s")


def _jsonable(v):
  if v is None:
    return None
  v = float(np.asarray(v))
  return v if np.isfinite(v) else None


class Writer:
  """Appends to <workdir>/metrics.jsonl and writes TensorBoard scalars under <workdir>/tensorboard (local or gs://;
  tensorboardX writes gs:// through google-cloud-storage). Only process 0 writes; other processes get a no-op writer.
  A gs:// object cannot be appended to: there each write uploads its line as an object of its own and Cloud Storage
  composes metrics.jsonl from the two, so a write costs its own bytes, not the file's (RemoteLog). Opening it for a
  run resuming at `start_step` drops the records a killed run logged past that step."""

  def __init__(self, workdir: str, start_step: int = 0):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    self._path = epath.Path(workdir) / "metrics.jsonl"
    _rewind(self._path, start_step)
    if storage.is_remote(workdir):
      self._jsonl = RemoteLog(self._path)
    else:
      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(self._path, "a", encoding="utf-8")
    self._tb = EventFileWriter(os.path.join(workdir, "tensorboard"))
    if start_step:  # TensorBoard hides the events a killed run logged past this restart
      self._tb.add_event(event_pb2.Event(step=start_step + 1, session_log=event_pb2.SessionLog(
          status=event_pb2.SessionLog.START)))

  def write(self, step: int, scalars: dict):
    if not self.active:
      return
    record = {"step": int(step), **{k: _jsonable(v) for k, v in scalars.items() if k != "step"}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in record.items()
              if k != "step" and v is not None]
    self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=record["step"],
                                       summary=summary_pb2.Summary(value=values)))
    self._tb.flush()

  def close(self):
    if self.active:
      self._jsonl.close()
      self._tb.close()


class RemoteLog:
  """A file on gs:// that grows by appends, as an open text file would: each flush uploads the lines written since
  as an object beside it, and Cloud Storage composes the file from the two (server-side). An object holds at most
  1,024 composed parts, so every MAX_PARTS appends the file is uploaded whole once instead: the traffic of a run of n
  writes grows as n, not n² as rewriting it at each write did."""
  MAX_PARTS = 512

  def __init__(self, path: epath.Path):
    import fsspec  # pylint: disable=g-import-not-at-top  (gs:// only: gcsfs's)
    self._fs, self._key = fsspec.core.url_to_fs(str(path))
    self._path, self._buffer, self._parts = path, "", self.MAX_PARTS  # rewritten whole at the first flush
    self._text = path.read_text() if path.exists() else ""

  def write(self, text: str):
    self._buffer += text

  def flush(self):
    if not self._buffer:
      return
    self._text += self._buffer
    if self._parts >= self.MAX_PARTS:
      storage.write(self._path, self._text)
      self._parts = 1
    else:
      part = f"{self._key}.part"
      self._fs.pipe_file(part, self._buffer.encode("utf-8"))
      self._fs.merge(self._key, [self._key, part])
      self._fs.rm_file(part)
      self._parts += 1
    self._buffer = ""

  def close(self):
    self.flush()


def _rewind(path: epath.Path, step: int):
  """Keeps the records up to `step` (dropping a line cut by a kill), so a resumed run logs each step once."""
  if not path.exists():
    return
  kept = []
  for line in path.read_text().splitlines(keepends=True):
    try:
      if json.loads(line)["step"] <= step:
        kept.append(line)
    except (ValueError, KeyError):
      pass
  storage.write(path, "".join(kept))
