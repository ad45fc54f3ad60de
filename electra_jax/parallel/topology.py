"""Cloud TPU slices and NVIDIA GPU hosts as their compilers see them, from any host: an accelerator type (`parse`) or
a GPU and count (`parse_gpu`) become devices a program is compiled for, never run on (jax.experimental.topologies via
libtpu, the `tpu` extra, or the CUDA plugin, the `gpu-compile` extra, from gpu_targets/), and each device's HBM."""
import contextlib
import dataclasses
import math
import os
import re

from electra_jax.runtime import packages


@dataclasses.dataclass(frozen=True)
class Generation:
  devices_per_chip: int  # JAX devices a chip shows (v2/v3: one per core; megacore and single-core chips: one)
  cores_in_name: bool  # the type's number counts TensorCores (v2-v5p), else chips (v5e, v6e)
  dims: int  # torus dimensions
  hbm_gib: float  # per chip
  chip_config: str  # libtpu's name for how a chip's cores show up
  host_chips: int  # chips per host in a multi-host slice
  single_host_chips: int  # the most chips one host holds (v5e/v6e: up to 8 chips sit on one host)


GENERATIONS = {
    "v2": Generation(2, True, 2, 16, "default", 4, 4),
    "v3": Generation(2, True, 2, 32, "default", 4, 4),
    "v4": Generation(1, True, 3, 32, "megacore", 4, 4),
    "v5e": Generation(1, False, 2, 16, "default", 4, 8),
    "v5p": Generation(1, True, 3, 95, "megacore", 4, 4),
    "v6e": Generation(1, False, 2, 32, "default", 4, 8),
}
ALIASES = {"v5litepod": "v5e"}


@dataclasses.dataclass(frozen=True)
class Slice:
  """One accelerator type, times num_slices."""
  accelerator_type: str  # as given, normalised: v5e-16 (gcloud: v5litepod-16)
  generation: str
  spec: Generation
  chips: int  # per slice
  num_slices: int
  shape: tuple[int, ...]  # the chips' torus
  host_bounds: tuple[int, int, int]  # chips per host, as x, y, z

  @property
  def num_devices(self) -> int:
    return self.chips * self.spec.devices_per_chip * self.num_slices

  @property
  def num_hosts(self) -> int:
    return max(1, self.chips // math.prod(self.host_bounds)) * self.num_slices

  @property
  def hbm_bytes_per_device(self) -> int:
    return int(self.spec.hbm_gib * 2**30) // self.spec.devices_per_chip

  @property
  def name(self) -> str:
    return self.accelerator_type if self.num_slices == 1 else f"{self.num_slices} x {self.accelerator_type}"

  def devices(self) -> list:
    """The slice's (or slices') devices, from libtpu's topology description."""
    with _libtpu_environment(self.accelerator_type):
      return _described(f"a {self.name} TPU slice", "libtpu", platform="tpu",
                        topology_name=f"{self.generation}:{'x'.join(map(str, self.shape))}",
                        chip_config_name=self.spec.chip_config, chips_per_host_bounds=self.host_bounds,
                        num_slices=self.num_slices)


def _described(what: str, package: str, **description) -> list:
  """The devices of jax.experimental.topologies' description of `what` (`package` provides it)."""
  packages.require(package, f"compiling for {what}")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    return list(topologies.get_topology_desc(**description).devices)
  except Exception as e:  # pylint: disable=broad-except  (the compilers' errors have no common type)
    raise ValueError(f"cannot describe {what}: {' '.join(str(e).split())[:300]}") from None


@contextlib.contextmanager
def _libtpu_environment(accelerator_type: str):
  """What libtpu reads as it starts (a TPU VM's type and hosts, without which it logs errors; quiet logs; no lock file,
  so that processes may describe slices at once), set only while it does: this machine is no TPU VM to children."""
  settings = dict(TPU_ACCELERATOR_TYPE=accelerator_type, TPU_WORKER_HOSTNAMES="localhost", TPU_STDERR_LOG_LEVEL="2",
                  ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  unset = [k for k in settings if k not in os.environ]
  os.environ.update({k: settings[k] for k in unset})
  try:
    yield
  finally:
    for k in unset:
      os.environ.pop(k, None)


def _torus(chips: int, dims: int) -> tuple[int, ...]:
  """The chips' shape: 2-D slices as near-square as powers of two go (8 -> 2x4, 32 -> 4x8); 3-D ones 2x2x1 for 4
  chips, then from 2x2x2 by doubling z, then y, then x (16 -> 2x2x4, 32 -> 2x4x4, 64 -> 4x4x4), as Cloud TPU lays
  them out."""
  if dims == 2:
    a = 2 ** (int(math.log2(chips)) // 2)
    return (a, chips // a)
  shape = [min(chips, 2), min(max(chips // 2, 1), 2), 2 if chips >= 8 else 1]
  axis = 2
  while math.prod(shape) < chips:
    shape[axis] *= 2
    axis = (axis - 1) % 3
  return tuple(shape)


def parse(accelerator_type: str, num_slices: int = 1) -> Slice:
  """An accelerator type as gcloud names it (v3-8, v4-32, v5litepod-16 or v5e-16, v5p-8, v6e-8)."""
  match = re.fullmatch(r"(v\d[a-z]*)-(\d+)", accelerator_type.strip().lower())
  generation = match and ALIASES.get(match.group(1), match.group(1))
  if not match or generation not in GENERATIONS:
    raise ValueError(f"unknown TPU accelerator type {accelerator_type!r}: expected GENERATION-SIZE with GENERATION one "
                     f"of {', '.join(GENERATIONS)} (or v5litepod), e.g. v3-8, v4-32, v5e-16")
  spec = GENERATIONS[generation]
  size = int(match.group(2))
  chips = size // 2 if spec.cores_in_name else size
  if chips < 1 or chips & (chips - 1) or (spec.cores_in_name and size % 2):
    raise ValueError(f"TPU accelerator type {accelerator_type!r}: the size must be a power of two"
                     f"{' cores (two a chip)' if spec.cores_in_name else ' chips'}")
  if num_slices < 1:
    raise ValueError(f"--num_slices={num_slices} must be at least 1")
  shape = _torus(chips, spec.dims)
  host = shape + (1,) * (3 - len(shape)) if chips <= spec.single_host_chips else (2, 2, 1)  # chips per host
  return Slice(f"{generation}-{size}", generation, spec, chips, num_slices, shape, host)


# XLA's descriptions of each GPU (stream_executor.GpuTargetConfigProto in text form, shipped in gpu_targets/).
GPUS = {"h100": "h100.txtpb", "h200": "h200.txtpb", "a100": "a100.txtpb"}
GPUS_PER_HOST = 8  # an HGX/DGX host; larger counts are whole hosts of 8
# What JAX's GPU allocator takes of a device's memory at start-up, unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise.
DEFAULT_MEM_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class GpuHosts:
  """`num_devices` NVIDIA GPUs of one kind, on one host or on hosts of GPUS_PER_HOST."""
  gpu: str
  num_devices: int

  @property
  def num_hosts(self) -> int:
    return max(1, self.num_devices // GPUS_PER_HOST)

  @property
  def name(self) -> str:
    return self.gpu if self.num_devices == 1 else f"{self.num_devices} x {self.gpu}"

  @property
  def target_config(self) -> str:
    with open(os.path.join(os.path.dirname(__file__), "gpu_targets", GPUS[self.gpu]), encoding="utf-8") as f:
      return f.read()

  @property
  def hbm_bytes_per_device(self) -> int:
    """A device's memory times XLA_PYTHON_CLIENT_MEM_FRACTION (JAX's allocator's share): aot.py holds plans to it."""
    memory = int(re.search(r"device_memory_size: (\d+)", self.target_config).group(1))
    return int(memory * float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION)))

  def devices(self) -> list:
    """The GPUs, from XLA's description of the device (no GPU needed; nothing is autotuned without one)."""
    return _described(f"{self.name} GPUs", "jax_cuda12_plugin", platform="cuda", target_config=self.target_config,
                      topology=f"1x{self.num_hosts}x{min(self.num_devices, GPUS_PER_HOST)}")


def parse_gpu(spec: str) -> GpuHosts:
  """GPU[:COUNT]: h100, h200 or a100 (80 GB SXM), COUNT up to GPUS_PER_HOST or whole hosts of GPUS_PER_HOST."""
  gpu, _, count = spec.strip().lower().partition(":")
  if gpu not in GPUS or not re.fullmatch(r"\d*", count):
    raise ValueError(f"unknown GPU {spec!r}: expected GPU[:COUNT] with GPU one of {', '.join(GPUS)}, e.g. h100, "
                     "h200:8, a100:16")
  n = int(count or 1)
  if n < 1 or (n > GPUS_PER_HOST and n % GPUS_PER_HOST):
    raise ValueError(f"--gpu={spec}: the count must be 1 to {GPUS_PER_HOST} GPUs (one host) or a multiple of "
                     f"{GPUS_PER_HOST} (hosts of {GPUS_PER_HOST})")
  return GpuHosts(gpu, n)
