"""Where a step's device time goes: the ops that took longest in a jax.profiler trace, as a table.

  python benchmarks/trace_top.py runs/gpu/profiles/small_128x128_fused [--top=15]

Reads the newest *.trace.json.gz under the directory (what `electra-bench --profile=DIR` writes through
jax.profiler.trace) and sums the durations of each op name on the accelerator's "XLA Ops" line (every line of the
accelerator where there is no such line; XLA's CPU client threads on a CPU, whose trace has no device). Each row is an
op name, its calls and milliseconds a profiled step and its share of the device time summed; then the same by
kind of op (the name without its instance number: every `fusion.N` or `gemm_fusion_dot_N` together) and by class
(matmul, attention, elementwise, reduction/transpose, other: read off XLA's GPU kernel names), with the ops per step
and how short they are: thousands of 2-microsecond kernels a step mean a launch-bound step, not a compute-bound one.
Then the device's span a step (its first op's start to its last op's end) and the share of it busy (some op running):
a step driven by a host that cannot keep up leaves the device idle between ops. Last, the host's longest events by
name (dispatch, transfers, Python), where that idle time goes.
"""
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys

from absl import app, flags


def _lines(events: list[dict]) -> dict:
  """(pid, tid) -> "process/thread" for every thread the trace names."""
  process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
  return {(e["pid"], e.get("tid")): f"{process.get(e['pid'], '')}/{e['args']['name']}"
          for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}


def _device_lines(lines: dict) -> list:
  """The lines the device's ops run on: the accelerator's XLA Ops, else all its lines, else XLA's CPU threads."""
  device = {k: v for k, v in lines.items() if v.startswith("/device:") and not v.startswith("/device:CUSTOM")}
  ops = [k for k, v in device.items() if v.endswith("/XLA Ops")]
  return ops or list(device) or [k for k, v in lines.items() if v.startswith("/host:CPU/tf_XLA")]


CLASSES = (("attention", ("sdpa", "flash", "fmha")),
           ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "dot", "convolution")),
           ("elementwise", ("loop_",)), ("reduction/transpose", ("input_",)))


def op_class(name: str) -> str:
  return next((c for c, marks in CLASSES if any(m in name.lower() for m in marks)), "other")


def top_ops(trace_dir: str, top: int = 15, steps: int = 1) -> dict:
  """{"trace", "device_ms_per_step", "span_ms_per_step", "busy_share", "ops_per_step", "median_op_us",
  "share_under_5us", "ops": [{"name", "calls_per_step", "ms_per_step", "share"}, ...], "kinds": [the same by kind],
  "classes": [the same by class], "host": [the same for the host's events, share of the device's span]} of the newest
  trace."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir} (written by jax.profiler.trace)")
  path = max(paths, key=os.path.getmtime)
  with gzip.open(path) as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  lines = _lines(events)
  keep = set(_device_lines(lines))
  spans = [e for e in events if e.get("ph") == "X" and not e["name"].startswith("end: ")]
  device = [e for e in spans if (e["pid"], e.get("tid")) in keep]
  if not device:
    raise FileNotFoundError(f"no device ops in {path}")
  durations = [(e["name"], e.get("dur", 0.0)) for e in device]
  device_us = sum(us for _, us in durations)
  span_us = max(e["ts"] + e.get("dur", 0.0) for e in device) - min(e["ts"] for e in device)
  busy_us, end = 0.0, float("-inf")  # the union of the ops' intervals: nested or concurrent ones count once
  for start, stop in sorted((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in device):
    busy_us += max(0.0, stop - max(start, end))
    end = max(end, stop)
  # The host's events on its own lines (a CPU client's trace has no device: its op lines are the device's).
  host = [(e["name"], e.get("dur", 0.0)) for e in spans
          if (e["pid"], e.get("tid")) not in keep and lines.get((e["pid"], e.get("tid")), "").startswith("/host")]

  def rows(events, key=lambda n: n, total_us=device_us) -> list[dict]:
    total, calls = collections.Counter(), collections.Counter()
    for name, us in events:
      total[key(name)] += us
      calls[key(name)] += 1
    return [dict(name=name, calls_per_step=calls[name] / steps, ms_per_step=us / 1e3 / steps, share=us / total_us)
            for name, us in total.most_common(top)]

  return dict(trace=os.path.relpath(path, trace_dir), device_ms_per_step=device_us / 1e3 / steps,
              span_ms_per_step=span_us / 1e3 / steps, busy_share=busy_us / span_us if span_us else 1.0,
              ops_per_step=len(durations) / steps, median_op_us=statistics.median(us for _, us in durations),
              share_under_5us=sum(us < 5 for _, us in durations) / len(durations), ops=rows(durations),
              kinds=rows(durations, lambda n: re.sub(r"[._]\d+$", "", n)), classes=rows(durations, op_class),
              host=rows(host, total_us=span_us or device_us))


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("give one directory: the --profile=DIR of electra-bench")
  try:
    report = top_ops(argv[1], flags.FLAGS.top, flags.FLAGS.steps)
  except FileNotFoundError as e:
    sys.exit(f"trace_top: {e}")
  print(f"{report['trace']}: {report['device_ms_per_step']:.2f} ms of device time a step in "
        f"{report['ops_per_step']:.0f} ops (median {report['median_op_us']:.1f} us, "
        f"{report['share_under_5us']:.0%} under 5 us), busy {report['busy_share']:.0%} of its "
        f"{report['span_ms_per_step']:.2f} ms span")
  for key, title in (("ops", "op"), ("kinds", "kind"), ("classes", "class"), ("host", "host event (share of span)")):
    print(f"by {title}:")
    for op in report[key]:
      print(f"{op['share']:6.1%} {op['ms_per_step']:9.3f} ms {op['calls_per_step']:7.1f} a step  {op['name']}")
  print(json.dumps(report))


if __name__ == "__main__":
  flags.DEFINE_integer("top", 15, "Ops listed.")
  flags.DEFINE_integer("steps", 1, "Steps the trace holds (profile_steps in electra-bench's JSON).")
  app.run(main)
