"""Where a run's wall time goes (PHASES; goodput: the share spent on steps), for metrics.jsonl and the final lines."""
import contextlib
import json
import time

from absl import logging
from etils import epath

PHASES = ("startup", "restart", "compile", "input", "step", "eval", "checkpoint", "other")


class Clock:
  """Seconds per phase since the run started (monotonic clock); `phase` times a block."""

  def __init__(self):
    self.t0 = time.monotonic()
    self.seconds = dict.fromkeys(PHASES, 0.0)
    self.stepped = False  # the first "step" phase is "compile"

  @contextlib.contextmanager
  def phase(self, name: str):
    if name == "step" and not self.stepped:
      name, self.stepped = "compile", True
    t = time.monotonic()
    try:
      yield
    finally:
      self.seconds[name] += time.monotonic() - t

  def started(self, resumed: bool):
    """Marks the first step's start: the time until now was startup, or restart for a run that resumed."""
    self.seconds["restart" if resumed else "startup"] = time.monotonic() - self.t0

  def split(self) -> dict:
    """{"time_<phase>_s": seconds, "time_wall_s", "goodput"}: the phases add up to the wall time."""
    wall = time.monotonic() - self.t0
    seconds = dict(self.seconds, other=max(0.0, wall - sum(v for k, v in self.seconds.items() if k != "other")))
    return {**{f"time_{k}_s": round(v, 2) for k, v in seconds.items()}, "time_wall_s": round(wall, 2),
            "goodput": round(seconds["step"] / wall, 4) if wall else 0.0}


def describe(split: dict) -> str:
  """One line: the wall time, each non-zero phase's seconds and share, the goodput."""
  wall = split["time_wall_s"] or 1.0
  parts = [f"{k} {split[f'time_{k}_s']:.0f} s ({100 * split[f'time_{k}_s'] / wall:.0f}%)" for k in PHASES
           if split[f"time_{k}_s"] >= 0.5]
  return f"wall {split['time_wall_s']:.0f} s: {', '.join(parts)}; goodput {100 * split['goodput']:.1f}%"


def total(workdir: str) -> dict | None:
  """The split summed over the sessions metrics.jsonl records (None for one session)."""
  path = epath.Path(workdir) / "metrics.jsonl"
  rows = [r for r in map(json.loads, path.read_text().splitlines()) if "goodput" in r] if path.exists() else []
  if len(rows) < 2:
    return None
  summed = {k: sum(r.get(k) or 0.0 for r in rows) for k in (*(f"time_{p}_s" for p in PHASES), "time_wall_s")}
  return dict(summed, goodput=summed["time_step_s"] / summed["time_wall_s"] if summed["time_wall_s"] else 0.0)


def report(workdir: str, split: dict, desc: str):
  """Logs this run's split and, for a resumed workdir, the total over its sessions."""
  logging.info("Time of this %s run: %s", desc, describe(split))
  if overall := total(workdir):
    logging.info("Time of %s over its sessions: %s", workdir, describe(overall))
