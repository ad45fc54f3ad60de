"""One training step's FLOPs per objective, and the throughput, TFLOP/s and MFU they make over a measured time (the
formulas: docs/benchmarks.md, "How the figures are computed")."""
from typing import NamedTuple

import jax
import ml_collections

from electra_jax.model import masking, modeling, objectives

# Dense bf16 peak FLOP/s per JAX device. A TPU v2/v3 chip shows up as two devices (one per core).
PEAK_FLOPS = {
    "TPU v2": 22.5e12,
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5": 459e12,  # v5p (v5e is "TPU v5 lite", matched above)
    "TPU v6 lite": 918e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
    "Tesla V100": 125e12,
}


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


class Costs(NamedTuple):
  """FLOPs of the pieces of one training step that the objectives add up."""
  generator: float  # G's encoder and MLM head at the masked positions, trained
  discriminator: float  # D's encoder
  rtd_head: float  # D's replaced-token head over every token
  d_mlm_masked: float  # D's MLM head at the masked positions
  d_mlm_all: float  # D's MLM head at every position, and the copy gate
  stage_fraction: float  # two_stage_fraction


def costs(mc: modeling.ModelConfig, objective: objectives.ObjectiveConfig, batch: int, seq_len: int,
          two_stage_fraction: float | None = None) -> Costs:
  """The pieces of one training step of `mc` under `objective` at `batch` × `seq_len` (Objective.flops adds them)."""
  d, g = mc.discriminator, mc.generator
  masked = batch * masking.max_predictions(objective.mask_prob, seq_len)
  return Costs(
      generator=encoder_flops(mc, g, batch, seq_len) + mlm_head_flops(mc, g.hidden_size, masked),
      discriminator=encoder_flops(mc, d, batch, seq_len),
      rtd_head=6 * (d.hidden_size ** 2 + d.hidden_size) * batch * seq_len,
      d_mlm_masked=mlm_head_flops(mc, d.hidden_size, masked),
      d_mlm_all=mlm_head_flops(mc, d.hidden_size, batch * seq_len) + 6 * d.hidden_size ** 2 * batch * seq_len,
      stage_fraction=objective.two_stage_fraction if two_stage_fraction is None else two_stage_fraction)


def step_flops(config: ml_collections.ConfigDict, two_stage_fraction: float | None = None) -> float:
  """FLOPs of one training step of the config (two_stage: the run's mean; `two_stage_fraction` 1: stage 1's, 0: 2's)."""
  objective = objectives.ObjectiveConfig.from_config(config)
  return objectives.get(objective.name).flops(costs(
      modeling.ModelConfig.from_config(config), objective, config.train.batch_size, config.data.seq_len,
      two_stage_fraction))


def throughput(step_flops: float, tokens_per_step: int, steps: int, seconds: float) -> dict:
  """tokens/s, TFLOP/s per device and MFU (None where the peak is unknown) of `steps` steps in `seconds`."""
  per_device = step_flops * steps / seconds / jax.device_count()
  peak = peak_flops()
  return dict(tokens_per_sec=tokens_per_step * steps / seconds, tflops_per_device=per_device / 1e12,
              mfu=None if peak is None else per_device / peak)
