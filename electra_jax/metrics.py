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
  A gs:// object cannot be appended to: there metrics.jsonl is rewritten whole at each write (an upload is
  atomic). Opening it for a run resuming at `start_step` drops the records a killed run logged past that step."""

  def __init__(self, workdir: str, start_step: int = 0):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    self._path = epath.Path(workdir) / "metrics.jsonl"
    _rewind(self._path, start_step)
    if storage.is_remote(workdir):
      self._jsonl, self._text = None, self._path.read_text() if self._path.exists() else ""
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
    if self._jsonl is None:
      self._text += json.dumps(record) + "\n"
      storage.write(self._path, self._text)
    else:
      self._jsonl.write(json.dumps(record) + "\n")
      self._jsonl.flush()
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in record.items()
              if k != "step" and v is not None]
    self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=record["step"],
                                       summary=summary_pb2.Summary(value=values)))
    self._tb.flush()

  def close(self):
    if self.active:
      if self._jsonl is not None:
        self._jsonl.close()
      self._tb.close()


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
