"""A multi-process run ends in one line, rather than hangs, when one of its processes dies or stalls: heartbeats in
the coordination service's key-value store (docs/reliability.md, "A lost or stalled process")."""
import contextlib
import os
import sys
import threading
import time
from typing import Callable

import jax
from absl import logging

from electra_jax.runtime import jax_private

PERIOD_S = 1.0
STARTUP_GRACE = 3  # times timeout_s a peer not yet heard from (still starting) has before it counts as lost
PREFIX = "electra_jax/heartbeat/"
DONE = "done"
FAILED = "failed: "  # then the error's first line: a process whose loop raised an error of its own says so


class Watchdog:
  """Use as a context manager around a multi-process loop: a lost peer ends the process in one line, exit 1, after
  `on_lost()` (what to release: the lock); `saved()`: the newest complete checkpoint, in words."""

  def __init__(self, timeout_s: float, command: str, saved: Callable[[], str], on_lost: Callable[[], object]):
    self.timeout_s, self.command, self._saved, self._on_lost = timeout_s, command, saved, on_lost
    self._stop = threading.Event()
    self._ended = None  # DONE once the loop finished: what the heartbeat says from then on

  def __enter__(self):
    if jax.process_count() > 1 and self.timeout_s > 0:
      self._client = jax_private.coordination_client()
      self._answered = time.monotonic()  # when the service last answered
      self._beats = {}
      me = jax.process_index()
      self._seen = {p: (None, time.monotonic()) for p in range(jax.process_count()) if p != me}
      # Two threads: a call to a stalled service may never return, and the judge must still see the silence.
      for target, name in ((self._publish, "peer-heartbeat"), (self._judge, "peer-watchdog")):
        threading.Thread(target=target, name=name, daemon=True).start()
    return self

  def __exit__(self, exc_type, exc, _):
    if not hasattr(self, "_client"):
      return
    if exc_type is None:
      # Finished: says so, and waits, still watching, until every other process has too (docs/reliability.md).
      self._ended = DONE
      while any(beat != DONE for beat, _ in self._seen.values()):
        time.sleep(PERIOD_S)
      self._stop.set()
      return
    # Maybe a peer's loss in whatever error wraps it: the error is this process's own once every other process has
    # written two heartbeats since (the first seen may be the last a killed one wrote, read late) or has ended; else
    # the judge ends the process with its line.
    failed, beats = time.monotonic(), {p: _count(beat) for p, (beat, _) in self._seen.items()}
    while (any(_count(beat) < beats[p] + 2 for p, (beat, _) in self._seen.items())
           and time.monotonic() - failed < (STARTUP_GRACE + 1) * self.timeout_s):
      time.sleep(PERIOD_S)
    self._stop.set()
    try:  # the others end naming this error, not a silence
      self._client.key_value_set(_key(jax.process_index()), FAILED + (" ".join(str(exc).split()) or
                                                                      exc_type.__name__), allow_overwrite=True)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Could not tell the other processes that this one failed: %s", e)

  def _publish(self):
    """Writes this process's heartbeat and reads everyone's, every PERIOD_S."""
    beat, key = 0, _key(jax.process_index())
    while not self._stop.wait(PERIOD_S):
      beat += 1
      with contextlib.suppress(Exception):  # the service, in process 0, is gone: the judge sees it
        self._client.key_value_set(key, self._ended or str(beat), allow_overwrite=True)
        self._beats = dict(self._client.key_value_dir_get(PREFIX))
        self._answered = time.monotonic()

  def _judge(self):
    """Ends the process once another's heartbeat, or the service, has been silent for timeout_s."""
    seen = self._seen
    while not self._stop.wait(PERIOD_S):
      now, beats = time.monotonic(), self._beats
      if now - self._answered > self.timeout_s:
        self._lost(0, now - self._answered)
      for p, (last, since) in seen.items():
        beat = beats.get(_key(p))
        if beat is not None and beat.startswith(FAILED):
          # Its exit waits in jax.distributed's shutdown for every process: join it.
          self._end(f"process {p} of {jax.process_count()} failed: {beat[len(FAILED):]}", jax.distributed.shutdown)
        if beat != last:
          seen[p] = (beat, now)
        elif beat != DONE and now - since > self.timeout_s * (1 if beat is not None else STARTUP_GRACE):
          self._lost(p, now - since)

  def _lost(self, process: int, silent_s: float):
    self._end(f"process {process} of {jax.process_count()} stopped responding (no heartbeat for {silent_s:.0f} s, "
              f"train.peer_timeout_s={self.timeout_s:g}: it died, was lost or stalled)")

  def _end(self, what: str, shutdown: Callable[[], object] = lambda: None):
    """Releases what on_lost releases, then exits 1 after one line: `what`, and the checkpoint a rerun resumes from."""
    message = f"{what}; {self._saved()}: run every process again to resume from it"
    for release in (self._on_lost, shutdown):
      try:
        release()
      except Exception as e:  # pylint: disable=broad-except  (the line and the exit matter more)
        logging.warning("Releasing before exit failed: %s", e)
    sys.stderr.write(f"{self.command}: error: {message}\n")
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access  (the main thread may never return from its collective)


def _key(process: int) -> str:
  return f"{PREFIX}{process}"


def _count(beat: str | None) -> float:
  """A heartbeat's number (0 before the first); a process that ended (DONE, FAILED) beats no more: infinity."""
  return 0 if beat is None else int(beat) if beat.isdigit() else float("inf")
