"""When Cloud Storage stops answering for $ELECTRA_JAX_STORAGE_TIMEOUT_S, a thread that asks it every few seconds ends
the command in one line, exit 1, whatever thread waits on it (docs/reliability.md, "Cloud Storage stops answering")."""
import os
import sys
import threading
import time
import urllib.parse

from electra_jax.runtime import gcsfs_private, storage

TIMEOUT_ENV = "ELECTRA_JAX_STORAGE_TIMEOUT_S"
TIMEOUT_S = 120.0  # google-cloud-storage's own default deadline: the lock and TensorBoard uploads last as long


def timeout_s() -> float:
  """The bound, from TIMEOUT_ENV; a one-line ValueError for a value that is not a positive number."""
  value = os.environ.get(TIMEOUT_ENV, "")
  try:
    seconds = float(value) if value else TIMEOUT_S
  except ValueError:
    seconds = -1.0
  if not seconds > 0:
    raise ValueError(f"{TIMEOUT_ENV}={value!r} must be a number of seconds above 0")
  return seconds


def answering(timeout: float) -> bool:
  """Whether the store answers an HTTP request within `timeout` seconds (any status below 500: even a refusal)."""
  import requests  # pylint: disable=g-import-not-at-top
  try:
    return requests.get(storage.endpoint(), timeout=timeout).status_code < 500
  except requests.RequestException:
    return False


def watch(command: str):
  """From now on, ends this process in one line, exit 1, once the store has not answered for timeout_s()."""
  seconds = timeout_s()
  period = min(5.0, seconds / 4)  # between probes
  gcsfs_private.lengthen_retries(seconds + 2 * period)  # past the watcher's line: it ends the command
  gcsfs_private.restart_lost_uploads()
  threading.Thread(target=_watch, args=(command, seconds, period), name="storage-watch", daemon=True).start()


def _watch(command: str, seconds: float, period: float):
  answered = time.monotonic()
  while True:
    # A probe before every judgement: a thread held back on a busy host is no silence.
    if answering(timeout=period * 2):
      answered = time.monotonic()
    elif time.monotonic() - answered > seconds:
      host = urllib.parse.urlsplit(storage.endpoint()).netloc
      # On a line of its own: a progress bar may have left the cursor at the end of its line.
      sys.stderr.write(f"\n{command}: error: Cloud Storage ({host}) has not answered for {seconds:g} s "
                       f"({TIMEOUT_ENV}={seconds:g}): stopped; what was complete before is kept (a checkpoint or "
                       "upload cut off midway is never read as complete): run the same command again once the store "
                       "answers\n")
      sys.stderr.flush()
      os._exit(1)  # pylint: disable=protected-access  (the thread waiting on the store may never return)
    time.sleep(period)
