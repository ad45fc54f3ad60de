"""What a run reports: metrics.jsonl (one JSON object per logged step), TensorBoard scalars, and the FLOP/MFU
accounting shared by training and the benchmark.

FLOPs of one training step (forward + backward = 3 × forward; a multiply-add is 2 FLOPs):
  6 · N_matmul · tokens for each network's dense layers (embedding lookups are gathers, not matmuls),
  + 12 · layers · L² · hidden · B for non-causal self-attention (QKᵀ and PV),
  + 6 · (hidden·emb + emb·vocab) · B·P for an MLM head, applied only at the P masked positions per sequence
    (All-Tokens MLM applies it at every position).
objectives.py composes these per objective.
"""
import json
import os

import jax
import numpy as np
from etils import epath

from electra_jax import modeling, storage

# Dense bf16 peak FLOP/s per JAX device. A TPU v2/v3 chip shows up as two devices (one per core).
PEAK_FLOPS = {
    "TPU v2": 22.5e12,
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
    "Tesla V100": 125e12,
}

TRAIN_FIELDS = ("step", "loss", "mlm_loss", "disc_loss", "mlm_accuracy", "disc_accuracy", "replaced_fraction",
                "learning_rate", "grad_norm", "tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s")


def peak_flops(device=None):
  """The device's peak, or None where unknown (CPUs)."""
  kind = (device or jax.devices()[0]).device_kind
  return next((v for k, v in PEAK_FLOPS.items() if kind.startswith(k)), None)


def encoder_flops(mc: modeling.ModelConfig, e: modeling.EncoderConfig, batch: int, seq_len: int) -> float:
  per_layer = 4 * e.hidden_size ** 2 + 2 * e.hidden_size * e.intermediate_size
  matmul = e.num_layers * per_layer + (mc.embedding_size * e.hidden_size if mc.embedding_size != e.hidden_size else 0)
  return 6 * matmul * batch * seq_len + 12 * e.num_layers * seq_len ** 2 * e.hidden_size * batch


def mlm_head_flops(mc: modeling.ModelConfig, hidden: int, positions: int) -> float:
  return 6 * (hidden * mc.embedding_size + mc.embedding_size * mc.vocab_size) * positions


def throughput(step_flops: float, tokens: int, seconds: float) -> dict:
  """tokens/s, TFLOP/s per device and MFU (None where the peak is unknown) over `seconds`."""
  per_device = step_flops / seconds / jax.device_count()
  peak = peak_flops()
  return dict(tokens_per_sec=tokens / seconds, tflops_per_device=per_device / 1e12,
              mfu=None if peak is None else per_device / peak)


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
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._path = epath.Path(workdir) / "metrics.jsonl"
    _rewind(self._path, start_step)
    if storage.is_remote(workdir):
      self._jsonl, self._text = None, self._path.read_text() if self._path.exists() else ""
    else:
      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(self._path, "a", encoding="utf-8")
    # purge_step hides events a killed run logged past the checkpoint it resumes from.
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=start_step + 1 if start_step else None)

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
    for k, v in record.items():
      if k != "step" and v is not None:
        self._tb.add_scalar(k, v, step)
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
