"""The training loop pre-training and fine-tuning share (preemption, the NaN/Inf guard, profiling, checkpoints); each
brings its own part as a `Body`."""
import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import os
import signal
import statistics
import sys
import threading
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from electra_jax.parallel.state import TrainState
from electra_jax.run import checkpoints, goodput
from electra_jax.run import metrics as metrics_lib
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import peers

SPIKE_WINDOW = 100  # the recent losses whose median a loss spike is measured against (train.spike_factor)


class Guard:
  """Stops the run in one line (FloatingPointError) at train.max_bad_steps non-finite steps in a row or non-finite
  weights before a save, and warns of (train.stop_on_spike: stops at) loss spikes; every checkpoint is finite."""

  def __init__(self, ckpt: checkpoints.Checkpointer, max_bad_steps: int, spike_factor: float = 0.0,
               stop_on_spike: bool = False):
    self._ckpt, self._max_bad = ckpt, max_bad_steps
    self._spike_factor, self._stop_on_spike = spike_factor, stop_on_spike
    self._bad = 0  # steps not applied in a row
    self._recent = collections.deque(maxlen=SPIKE_WINDOW)

  def check(self, step: int, loss: float, grad_norm: float, skipped: bool):
    where = f"loss={loss} grad_norm={grad_norm} at step {step}"
    if skipped:
      self._bad += 1
      if self._bad >= self._max_bad:
        raise FloatingPointError(self._stopped(f"{where}: {self._bad} non-finite steps in a row "
                                               "(train.max_bad_steps), none of them applied", step))
      logging.warning("%s: not applied (%d non-finite in a row; train.max_bad_steps=%d stops the run)", where,
                      self._bad, self._max_bad)
      return
    self._bad = 0
    median = statistics.median(self._recent) if self._recent else 0.0
    self._recent.append(loss)
    if self._spike_factor and median > 0 and loss > self._spike_factor * median:
      spike = (f"loss={loss:.4g} at step {step} is {loss / median:.0f}x the median of the last {len(self._recent) - 1} "
               f"steps' ({median:.4g}): a loss spike, the weights may be diverging")
      if self._stop_on_spike:
        raise FloatingPointError(self._stopped(f"{spike} (train.stop_on_spike)", step, gave_it=step - 1))
      logging.warning("%s", spike)

  def check_state(self, step: int, bad: list[str]):
    """`bad`: the non-finite arrays of step `step`'s state, before it is saved (a finite update may overflow)."""
    if bad:
      raise FloatingPointError(self._stopped(
          f"the state after step {step} is not finite (NaN/Inf in {len(bad)} arrays, e.g. {bad[0]}): an update at or "
          "before it overflowed the weights", step))

  def _stopped(self, why: str, step: int, gave_it: int | None = None) -> str:
    """`why` the run stops at `step`, and the checkpoint it keeps (`gave_it`: the step whose weights gave the loss)."""
    ckpt = self._ckpt
    resumed = ckpt.restored_step
    if ckpt.last_saved is None and resumed is not None and resumed == step - self._bad:  # nothing good since it
      return (f"{why}, every step since resuming from step {resumed}: its weights are finite but lead to non-finite "
              f"steps; lower train.learning_rate, or move {ckpt.directory}/{resumed} aside to resume from the one "
              "before")
    kept = ckpt.latest_step() if ckpt.last_saved is None else ckpt.last_saved
    if not kept:
      return f"{why}; stopped without saving it (no checkpoint was saved)"
    note = ", the weights that gave this loss" if kept == gave_it else ""
    return f"{why}; stopped without saving it; the newest checkpoint is kept (step {kept}{note} under {ckpt.directory})"


class Watcher:
  """SIGTERM or SIGINT ends the run after the current step, which `run` saves (`reached(step)`); with several
  processes through JAX's preemption service, at the same step. A second signal is ignored: it would break the save."""

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


class Profile:
  """A jax.profiler trace of `count` steps from step `start` into `log_dir`, in whole dispatches."""

  def __init__(self, log_dir: str, start: int, count: int):
    self.log_dir, self.start, self.end = log_dir, start, start + count - 1
    self.active = self.traced = False

  @contextlib.contextmanager
  def step(self, step: int, state: Callable[[], Any]):
    """Annotates the dispatch that ends at `step`; at `end` waits for `state()`, so the trace holds the device work."""
    if not self.traced and self.start <= step and self.end >= self.start:
      jax.profiler.start_trace(self.log_dir, create_perfetto_trace=True)  # Perfetto's too: trace_top.py reads it
      self.active = self.traced = True
    with jax.profiler.StepTraceAnnotation("train", step_num=step) if self.active else contextlib.nullcontext():
      yield
    if self.active and step >= self.end:
      jax.block_until_ready(state())
      self.stop()
      logging.info("Profiled steps %d-%d into %s (TensorBoard's profile tab)", self.start, self.end, self.log_dir)

  def stop(self):
    if self.active:
      self.active = False
      jax.profiler.stop_trace()


class InFlight:
  """The dispatches whose metrics are still on the device, read two dispatches late (the next ones queued meanwhile)."""

  def __init__(self, guard: Guard):
    self._guard = guard
    self._pending = []  # (last step, steps, its metrics on the device, whether its step logs)

  def push(self, step: int, steps: int, step_metrics: dict, log: bool, fetch_all: bool
           ) -> list[tuple[int, list[float], dict | None]]:
    """Adds a dispatch of `steps` steps ending at `step`; fetches and guards the pending ones but the newest two (all
    if `fetch_all`). Returns, in step order, (step, the applied losses since, the metrics as floats where `log`)."""
    self._pending.append((step, steps, step_metrics, log))
    keep = 0 if fetch_all else 2
    done, self._pending = self._pending[:len(self._pending) - keep], self._pending[len(self._pending) - keep:]
    values = jax.device_get([m if log else {k: m[k] for k in GUARDED} for _, _, m, log in done])
    out, losses = [], []
    for (last, steps, _, log), fetched in zip(done, values):
      fetched = {k: np.reshape(v, (steps,)) for k, v in fetched.items()}
      for i, (loss, grad_norm, skipped) in enumerate(zip(*(fetched[k] for k in GUARDED))):
        self._guard.check(last - steps + 1 + i, float(loss), float(grad_norm), bool(skipped))
        if not skipped:
          losses.append(float(loss))
      if log:
        out.append((last, losses, {k: float(v[-1]) for k, v in fetched.items()}))
        losses = []
    if not out or out[-1][0] != step:
      out.append((step, losses, None))
    return out


GUARDED = ("loss", "grad_norm", "skipped")  # what the guard reads of every step


class Body(Protocol):
  """What a loop brings to `run`."""

  def batch(self, step: int) -> dict[str, jax.Array]:
    """The global batch of step `step` (1-based)."""

  def after_step(self, step: int, state: TrainState | None, step_metrics: dict | None, losses: list[float],
                 log_now: bool, eval_now: bool, writer: metrics_lib.Writer) -> dict | None:
    """Logs and evaluates as the step asks (a log step's call a dispatch or two late, with `state` None); returns the
    progress bar's postfix. `losses`: the applied steps' since the last call."""

  def extra(self) -> dict:
    """What a checkpoint carries besides the state and rng (JSON) for the loop to resume."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """The loop's cadences and guard limits, read once from train.* (`of`) where a command starts the loop."""
  num_steps: int
  log_every: int
  eval_every: int
  profile_steps: int = 0
  peer_timeout_s: float = 0
  max_bad_steps: int = 1
  spike_factor: float = 0.0
  stop_on_spike: bool = False
  steps_per_dispatch: int = 1

  @classmethod
  def of(cls, train, num_steps: int, eval_every: int) -> "Settings":
    return cls(num_steps, train.log_every, eval_every, train.profile_steps, train.peer_timeout_s, train.max_bad_steps,
               train.spike_factor, train.stop_on_spike, train.steps_per_dispatch)


def compile_ahead(targets: Callable[[], list], name: str) -> concurrent.futures.Future:
  """The step `name` of `targets()` (a command's compile_targets, the train step first) and the save's checks of the
  train state, compiled in a thread beside the first train step rather than at the first evaluation and save."""
  def compile_():
    (_, _, (state, *_)), *others = targets()
    checkpoints.compile_checks(state)
    (_, step, args), = [t for t in others if t[0] == name]
    return step.lower(*args).compile()

  pool = concurrent.futures.ThreadPoolExecutor(1, "compile-ahead")
  compiled = pool.submit(compile_)
  pool.shutdown(wait=False)
  return compiled


def run(body: Body, state: TrainState, step_fn: Callable, rng: jax.Array, settings: Settings, *, desc: str,
        ckpt: checkpoints.Checkpointer, lock: workdir_lib.Lock, writer: metrics_lib.Writer, clock: goodput.Clock,
        closers: Sequence[Callable[[], object]], done: Callable[[], bool] = lambda: False) -> tuple[TrainState, bool]:
  """Steps `state` with `step_fn(state, batch, rng) -> (state, metrics)` to num_steps, or until `done()` or a signal:
  logs, evaluates and saves on their cadences and at the end, guarded, timed on `clock`, watching the other processes;
  closes everything however it ends. Returns (state, whether a signal stopped it)."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  s, num_steps = settings, settings.num_steps
  bar = tqdm(total=num_steps, initial=int(state.step), desc=desc, unit="step", dynamic_ncols=True,
             disable=jax.process_index() != 0)
  guard = Guard(ckpt, s.max_bad_steps, s.spike_factor, s.stop_on_spike)
  in_flight = InFlight(guard)
  k = s.steps_per_dispatch
  first = int(state.step) + k  # the first dispatch's last step
  profile = Profile(os.path.join(os.path.dirname(ckpt.directory), "tensorboard"), first + 1, s.profile_steps)
  logs = lambda step: step % s.log_every == 0 or step == num_steps
  evals = lambda step: step % s.eval_every == 0 or step == num_steps

  clock.started(resumed=ckpt.restored_step is not None)
  watchdog = peers.Watchdog(s.peer_timeout_s, lock.record["command"], ckpt.newest_complete,
                            on_lost=lambda: close_all((bar.close, lock.__exit__)))
  with watchdog, Watcher() as watcher:
    try:
      for step in range(first, num_steps + 1, k) if not done() else ():
        with clock.phase("input"):
          batch = body.batch(step)
        with clock.phase("step"), profile.step(step, lambda: state):
          state, step_metrics = step_fn(state, batch, rng)
          bar.update(k)
          stop = watcher.reached(step)
          eval_now = evals(step)
          save_now = stop or step == num_steps or ckpt.should_save(step)
          # Only an evaluation or a save needs the state of this step checked now: a log row waits for its metrics.
          fetched = in_flight.push(step, k, step_metrics, log=logs(step) or eval_now, fetch_all=eval_now or save_now)
          collect(step == first, logs(step))
        with clock.phase("eval"):
          for at, losses, at_metrics in fetched:
            now = at == step
            postfix = body.after_step(at, state if now else None, at_metrics, losses,
                                      logs(at) and at_metrics is not None, eval_now and now, writer)
            if postfix:
              bar.set_postfix(postfix)
        finished = done()
        if save_now or finished:
          with clock.phase("checkpoint"):
            guard.check_state(step, checkpoints.non_finite(state))
            lock.check()
            ckpt.save(step, state, body.extra(), force=True, rng=rng)
        if stop:
          logging.warning("Stopped by %s after step %d, saved to %s: run the same command to resume",
                          watcher.signal or "a preemption notice", step, ckpt.directory)
          return state, True
        if finished:
          break
    finally:
      gc.unfreeze()
      gc.enable()
      profile.stop()

      def record_time():
        with clock.phase("checkpoint"):
          ckpt.close()  # waits for the last asynchronous save
        split = clock.split()
        if writer.active:
          goodput.report(os.path.dirname(ckpt.directory), split, desc)
        writer.write(int(state.step), split)
      close_all((bar.close, *closers, record_time, writer.close))
  return state, False


def collect(started: bool, scheduled: bool):
  """Python's garbage collector off after the first step (a pass mid-step stalls a dispatch); a log step collects."""
  if started:
    gc.collect()
    gc.freeze()
    gc.disable()
  elif scheduled:
    gc.collect()


def close_all(closers: Sequence[Callable[[], object]]):
  """Runs every closer from a `finally:`; a closer's error is raised only when the loop had none, the first only."""
  error, closing_error = sys.exc_info()[1], None
  for close in closers:
    try:
      close()
    except Exception as e:  # pylint: disable=broad-except
      if error or closing_error:
        logging.warning("%s also failed: %s", close.__qualname__, " ".join(str(e).split()))
      else:
        closing_error = e
  if closing_error:
    raise closing_error
