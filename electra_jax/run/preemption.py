"""Stopping cleanly: SIGTERM (a preemption notice) or SIGINT (Ctrl-C) ends the run after the current step, which the
loop then saves. With several processes JAX's preemption service owns SIGTERM and makes every host stop at the same
step; Ctrl-C is routed through it. A second signal while stopping is logged and ignored: it would break off the save.
"""
import os
import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils


class Watcher:
  """`reached(step)` is True at the step where the run should save and stop. Use as a context manager."""

  def __init__(self):
    self.signal = None
    self.stop_step = None  # the step the loop saves and stops at, once it knows
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      logging.warning("Not in the main thread: SIGTERM/SIGINT will not stop the run cleanly")
      return self
    signals = (signal.SIGINT,) if jax.process_count() > 1 else (signal.SIGINT, signal.SIGTERM)
    self._previous = {s: signal.signal(s, self._handle) for s in signals}
    return self

  def _handle(self, signum, frame):
    del frame
    if self.signal is not None:  # e.g. a second Ctrl-C: raising here would break the save off with a traceback
      doing = "finishing the current step to save it" if self.stop_step is None else f"saving step {self.stop_step}"
      logging.warning("%s received again, ignored: already stopping: %s, then exiting (SIGKILL abandons it; the next "
                      "run deletes what it left)", signal.Signals(signum).name, doing)
      return
    self.signal = signal.Signals(signum).name
    logging.warning("%s received: finishing the current step, saving, then exiting", self.signal)
    if jax.process_count() > 1:
      os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier tells the other hosts

  def reached(self, step: int) -> bool:
    reached = (multihost_utils.reached_preemption_sync_point(step) if jax.process_count() > 1 else
               self.signal is not None)
    if reached and self.stop_step is None:
      self.stop_step = step
    return reached

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
