"""Where a step's device time goes: the ops that took longest in a jax.profiler trace, as a table.

  python benchmarks/trace_top.py runs/gpu/profiles/small_128x128_fused [--top=15]

Reads the newest *.trace.json.gz under the directory (what `electra-bench --profile=DIR` writes through
jax.profiler.trace) and sums the durations of each op name on the accelerator's "XLA Ops" line (every line of the
accelerator where there is no such line; XLA's CPU client threads on a CPU, whose trace has no device). Each row is an
op name, its calls, its milliseconds per profiled step and its share of the device time summed; then the same by
kind of op (the name without its instance number: every `fusion.N` together).
"""
import collections
import glob
import gzip
import json
import os
import re
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


def top_ops(trace_dir: str, top: int = 15, steps: int = 1) -> dict:
  """{"trace", "device_ms_per_step", "ops": [{"name", "calls", "ms_per_step", "share"}, ...], "kinds": [the same by
  kind]} of the newest trace."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir} (written by jax.profiler.trace)")
  path = max(paths, key=os.path.getmtime)
  with gzip.open(path) as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  keep = set(_device_lines(_lines(events)))
  total, calls = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and (e["pid"], e.get("tid")) in keep and not e["name"].startswith("end: "):
      total[e["name"]] += e.get("dur", 0.0)
      calls[e["name"]] += 1
  kind_total, kind_calls = collections.Counter(), collections.Counter()
  for name, us in total.items():
    kind = re.sub(r"\.\d+$", "", name)
    kind_total[kind] += us
    kind_calls[kind] += calls[name]
  device_us = sum(total.values())
  rows = lambda t, c: [dict(name=name, calls=c[name], ms_per_step=us / 1e3 / steps, share=us / device_us)
                       for name, us in t.most_common(top)]
  return dict(trace=os.path.relpath(path, trace_dir), device_ms_per_step=device_us / 1e3 / steps,
              ops=rows(total, calls), kinds=rows(kind_total, kind_calls))


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("give one directory: the --profile=DIR of electra-bench")
  try:
    report = top_ops(argv[1], flags.FLAGS.top, flags.FLAGS.steps)
  except FileNotFoundError as e:
    sys.exit(f"trace_top: {e}")
  print(f"{report['trace']}: {report['device_ms_per_step']:.2f} ms of device time per step")
  for title in ("ops", "kinds"):
    print(f"by {title[:-1]}:")
    for op in report[title]:
      print(f"{op['share']:6.1%} {op['ms_per_step']:9.3f} ms {op['calls']:6d}  {op['name']}")
  print(json.dumps(report))


if __name__ == "__main__":
  flags.DEFINE_integer("top", 15, "Ops listed.")
  flags.DEFINE_integer("steps", 1, "Steps the trace holds (profile_steps in electra-bench's JSON).")
  app.run(main)
