"""Ahead of time: a command's steps compiled from ShapeDtypeStructs for a slice's or GPU host's devices (topology.py),
with no accelerator, and what the compiler says of each: its memory plan per device (or how far it runs out of HBM),
FLOPs and cost model's time (TPU only), and its kernels by kind (kernel_counts, which electra-bench shares)."""
import collections
import dataclasses
import re
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# libtpu's words when a program does not fit: its temporaries (found early) or its whole plan exceed the HBM.
_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"
                  r"|Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm")


@dataclasses.dataclass(frozen=True)
class Report:
  """One compiled step, per device."""
  name: str
  lower_s: float
  compile_s: float
  argument_bytes: int
  output_bytes: int
  alias_bytes: int  # outputs that reuse (donated) argument buffers
  temp_bytes: int
  code_bytes: int
  flops: float | None  # XLA's count: matmuls, elementwise work, the optimiser's update (None: XLA:GPU has none)
  seconds: float | None  # the TPU cost model's time for one step, if it has one: an estimate, not a measurement
  kernels: dict = dataclasses.field(default_factory=dict)  # kernel_counts of the compiled step

  @property
  def peak_bytes(self) -> int:
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


class OutOfMemory(Exception):
  """No memory plan within the HBM: what the compiler needed and had, for the temporaries or (`whole`) the plan."""

  def __init__(self, name: str, need_bytes: int, available_bytes: int, whole: bool, message: str):
    super().__init__(message)
    self.name, self.need_bytes, self.available_bytes, self.whole = name, need_bytes, available_bytes, whole

  def temporaries(self, fixed_bytes: int) -> tuple[int, int]:
    """(needed, available) for the temporaries, given what does not grow with the batch (`fixed_bytes`)."""
    return (self.need_bytes - fixed_bytes, self.available_bytes - fixed_bytes) if self.whole else (
        self.need_bytes, self.available_bytes)


def gib(n: float) -> str:
  return f"{n / 2**30:.2f} GiB"


def key_struct(sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding)


def compile_step(name: str, jitted: Callable, args: tuple, memory_limit: int | None = None) -> Report:
  """Compiles `jitted` for `args` (ShapeDtypeStructs); OutOfMemory when no plan fits the HBM or `memory_limit` bytes."""
  t0 = time.perf_counter()
  lowered = jitted.lower(*args)
  t1 = time.perf_counter()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    found = _OOM.search(str(e))
    if "RESOURCE_EXHAUSTED" not in str(e) or not found:
      raise
    groups = found.groups()
    whole = groups[0] is None
    need, need_unit, have, have_unit = groups[4:] if whole else groups[:4]
    raise OutOfMemory(name, int(float(need) * UNITS[need_unit]), int(float(have) * UNITS[have_unit]), whole,
                      " ".join(str(e).split())) from None
  t2 = time.perf_counter()
  m = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}  # None from XLA:GPU without a device
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  seconds = cost.get("optimal_seconds")
  report = Report(name, t1 - t0, t2 - t1, m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes,
                  m.temp_size_in_bytes, m.generated_code_size_in_bytes,
                  float(cost["flops"]) if "flops" in cost else None,
                  seconds if seconds and seconds > 0 else None,  # libtpu gives v4, and unknown ops, a negative time
                  kernel_counts(compiled.as_text())["kernel_kinds"])
  if memory_limit is not None and report.peak_bytes > memory_limit:
    raise OutOfMemory(name, report.peak_bytes, memory_limit, True, f"{name}'s plan needs {gib(report.peak_bytes)} "
                      f"per device where {gib(memory_limit)} is available")
  return report


@dataclasses.dataclass(frozen=True)
class Fit:
  """The largest per-device batch whose train step the compiler placed in HBM, and how it was found."""
  rows_per_device: int
  report: Report
  predicted: int  # what the linear growth of the plan predicted before the confirming compile(s)
  missed: int = 0  # > 0: every larger try (this many) ran out of HBM, so this is the smallest batch, not the largest


def largest_fit(compile_at: Callable[[int], Report], too_large: OutOfMemory, rows_per_device: int,
                multiple: int = 1, tries: int = 3) -> Fit | None:
  """The largest per-device batch (a multiple of `multiple`) that fits, where the temporaries' growth (a line through
  the plan at `multiple` rows and `too_large`'s need, then a curve through the nearest misses) meets the HBM, in at
  most `tries` confirming compiles. None when even `multiple` rows do not fit."""
  try:
    fits = (multiple, compile_at(multiple))
  except OutOfMemory:
    return None
  fixed = fits[1].peak_bytes - fits[1].temp_bytes  # weights, optimiser state, code: the same at any batch
  available = too_large.temporaries(fixed)[1]
  points = [(fits[0], fits[1].temp_bytes), (rows_per_device, too_large.temporaries(fixed)[0])]
  predicted = None
  for _ in range(tries):
    crossing = _crossing(points[:1] + points[1:][-2:], available)  # the plan and the two nearest misses
    rows = min(points[-1][0] - multiple, int(crossing // multiple) * multiple)
    predicted = predicted or rows
    if rows <= fits[0]:
      break
    try:
      return Fit(rows, compile_at(rows), predicted)
    except OutOfMemory as e:
      points.append((rows, e.temporaries(fixed)[0]))
  return Fit(fits[0], fits[1], predicted, missed=len(points) - 2)


def _crossing(points: list[tuple[int, int]], level: int) -> float:
  """Where the line (two points) or parabola (three) through (rows, bytes) reaches `level`, between their rows."""
  x, y = np.array(points, dtype=float).T
  lo, hi = x[0], x[-1]
  if len(points) == 3:
    roots = np.roots(np.polyfit(x, y - level, 2))
    if inside := [r.real for r in roots if abs(r.imag) < 1e-9 and lo < r.real < hi]:
      return max(inside)
  (x0, x1), (y0, y1) = x[-2:], y[-2:]
  return x1 + (level - y1) * (x1 - x0) / (y1 - y0) if y1 != y0 else lo


def int_batch(sharding, batch: int, seq_len: int, steps: int = 1, **extra) -> dict:
  """ShapeDtypeStructs of a batch (ids, `extra` name -> (shape, dtype)) laid out by `sharding`, `steps` stacked."""
  shapes = dict(input_ids=((batch, seq_len), jnp.int32), segment_ids=((batch, seq_len), jnp.int32), **extra)
  lead = (steps,) if steps > 1 else ()
  return {k: jax.ShapeDtypeStruct((*lead, *shape), dtype, sharding=sharding) for k, (shape, dtype) in shapes.items()}


# XLA:GPU launches a kernel per fusion, custom call, copy and collective of ENTRY, and of a loop's body each trip.
KERNEL_KINDS = ("gemm", "cudnn", "elementwise", "reduction", "triton", "rng", "collective", "copy", "other")
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
              "partition-id", "replica-id", "add-dependency", "all-reduce-done", "all-gather-done",
              "collective-permute-done", "copy-done", "async-done", "send-done", "recv-done"}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                "collective-broadcast", "ragged-all-to-all", "async-start", "send", "recv")


def _instructions(computation: str) -> list[tuple[str, str]]:
  """(line, opcode) of each instruction of HLO text ('%x = SHAPE opcode(operands), ...')."""
  found = ((line, re.search(r" = .*?(?<![\w:])([a-z][\w-]*)\(", line)) for line in computation.splitlines())
  return [(line, m.group(1)) for line, m in found if m]


def _computation(text: str, name: str | None) -> str:
  """The body of the computation `name` (None: the ENTRY computation) of an HLO module's text."""
  start = text.index("\nENTRY " if name is None else f"\n%{name} ")
  return text[start:text.index("\n}", start)]


def _kind(line: str, op: str) -> str:
  target = re.search(r'custom_call_target="([^"]+)"|"fusion_backend_config":\{"kind":"([^"]+)"', line)
  target = target and (target.group(1) or target.group(2)) or ""
  if "gemm" in target or target.startswith("__cublas"):
    return "gemm"
  if target.startswith("__cudnn"):
    return "cudnn"
  if op == "rng-bit-generator" or re.search(r'op_name="[^"]*threefry', line):
    return "rng"
  if target.startswith("__triton"):
    return "triton"
  if op == "fusion":
    return {"kLoop": "elementwise", "kInput": "reduction"}.get(re.search(r"kind=(\w+)", line).group(1), "other")
  return "collective" if op.startswith(_COLLECTIVES) else "copy" if op in ("copy", "copy-start") else "other"


def kernel_counts(hlo_text: str) -> dict:
  """What a compiled program (`compiled.as_text()`) is made of: its ENTRY computation's instructions and fusions, the
  module's reduce ops, and its kernels by kind (KERNEL_KINDS; gemm: Triton or cuBLAS, triton: other Triton fusions)."""
  kinds = collections.Counter()

  def visit(computation: str, times: int):
    for line, op in _instructions(computation):
      if op == "while":
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
        visit(_computation(hlo_text, re.search(r"body=%([^\s,]+)", line).group(1)),
              times * (int(trips.group(1)) if trips else 1))
      elif op not in _NO_KERNEL:
        kinds[_kind(line, op)] += times

  entry = _computation(hlo_text, None)
  visit(entry, 1)
  ops = [op for _, op in _instructions(entry)]
  return dict(hlo_instructions=len(ops), fusions=ops.count("fusion"),
              reduces=[op for _, op in _instructions(hlo_text)].count("reduce"), kernels=sum(kinds.values()),
              kernel_kinds={k: kinds[k] for k in KERNEL_KINDS})
