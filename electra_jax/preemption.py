"""Stopping cleanly: SIGTERM (a spot/preemptible VM's notice) or SIGINT (Ctrl-C) ends the run after the current step,
which the loop then saves.

One process: a handler notes the signal. Several: JAX's preemption service owns SIGTERM and makes every host agree on
the step to stop at (`multihost_utils.reached_preemption_sync_point`), so all of them save the same step; Ctrl-C is
routed through it by re-sending SIGTERM to this process. A second Ctrl-C interrupts at once.
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
    if self.signal is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait for the save
    self.signal = signal.Signals(signum).name
    logging.warning("%s received: finishing the current step, saving, then exiting", self.signal)
    if jax.process_count() > 1:
      os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier tells the other hosts

  def reached(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.signal is not None

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
