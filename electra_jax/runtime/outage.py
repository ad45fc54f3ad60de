"""When Cloud Storage stops answering: the libraries retry with backoff for a bounded time, then the command ends in
one line and exit status 1 (not pages of retry tracebacks, nor a run stalled for a quarter of an hour).

The bound is $ELECTRA_JAX_STORAGE_TIMEOUT_S (default TIMEOUT_S). A thread asks the store for an answer every few
seconds, any HTTP answer below 500 counting; once none has come for the bound, it prints the line and ends the process,
whatever thread waits on the store (a save's background commit, a metrics upload, a restore, a collective whose peer
waits on it). gcsfs's own retries (files, checkpoint metadata, metrics.jsonl) are lengthened to outlast the bound, so a
shorter outage is ridden out rather than ending in gcsfs's error (an upload whose session a restarted store lost is
started again, and a checkpoint save that failed all the same is saved again: checkpoints.py); TensorStore (Orbax's
arrays) retries for about 15 minutes and google-cloud-storage (the workdir lock, TensorBoard) for 2 by default.

What was complete before stays: Orbax counts a gs:// checkpoint only once its commit_success.txt is written, last,
so a save cut off midway is never restored (the rerun saves that step again); a staged upload (storage.staged_dir)
writes the file its readers look for last."""
import os
import sys
import threading
import time
import urllib.parse

from absl import logging

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


def endpoint() -> str:
  """The URL gs:// paths go to: the emulator's ($STORAGE_EMULATOR_HOST, as storage.initialize left it) or Google's."""
  return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"


def answering(timeout: float) -> bool:
  """Whether the store answers an HTTP request within `timeout` seconds (any status below 500: even a refusal)."""
  import requests  # pylint: disable=g-import-not-at-top
  try:
    return requests.get(endpoint(), timeout=timeout).status_code < 500
  except requests.RequestException:
    return False


def lengthen_gcsfs_retries(seconds: float):
  """Makes gcsfs retry a failed request with its own backoff (1, 2, 4 ... 32 s, then 32 s each) for longer than
  `seconds` (by default it gives up after about 30 s)."""
  import gcsfs  # pylint: disable=g-import-not-at-top
  from gcsfs import retry  # pylint: disable=g-import-not-at-top
  waits, retries = 0.0, 1
  while waits <= seconds + 2 * _period(seconds):  # past the watcher's line: it, not gcsfs's error, ends the command
    waits += min(2 ** (retries - 1), 32)
    retries += 1
  fs = gcsfs.GCSFileSystem
  for name in ("_request", "_get_file_request", "_get_file_concurrent"):
    method = getattr(fs, name)
    setattr(fs, name, retry.retry_request(retries=retries)(getattr(method, "__wrapped__", method)))


def restart_lost_uploads():
  """Makes gcsfs start an upload again when the store no longer knows its session (a 404 on the session's URL: a
  store that was restarted, or a session that expired during an outage) and none of its bytes was accepted yet, so
  that all of them are still at hand: every file under gcsfs's block size (5 MiB), as are Orbax's checkpoint metadata
  and metrics.jsonl. Without this the upload, hence a save, fails with FileNotFoundError."""
  from gcsfs.core import GCSFile  # pylint: disable=g-import-not-at-top
  upload_chunk = getattr(GCSFile._upload_chunk, "__wrapped__", GCSFile._upload_chunk)  # pylint: disable=protected-access

  def restarting(self, final=False):
    try:
      return upload_chunk(self, final)
    except FileNotFoundError:
      if self.offset != 0:
        raise
      logging.warning("Cloud Storage no longer knows the upload session of %s: uploading it again", self.path)
      self._initiate_upload()  # pylint: disable=protected-access
      return upload_chunk(self, final)

  restarting.__wrapped__ = upload_chunk
  GCSFile._upload_chunk = restarting  # pylint: disable=protected-access


def _period(seconds: float) -> float:
  return min(5.0, seconds / 4)


def watch(command: str):
  """From now on, ends this process with one line and exit status 1 once the store has not answered for
  timeout_s(); lengthens gcsfs's retries to match, and has it start an upload again whose session the store lost.
  For commands that use gs:// paths."""
  seconds = timeout_s()
  lengthen_gcsfs_retries(seconds)
  restart_lost_uploads()
  threading.Thread(target=_watch, args=(command, seconds), name="storage-watch", daemon=True).start()


def _watch(command: str, seconds: float):
  period = _period(seconds)
  answered = time.monotonic()
  while True:
    # A probe before every judgement: a thread held back (a busy host) never counts as silence.
    if answering(timeout=period * 2):
      answered = time.monotonic()
    elif time.monotonic() - answered > seconds:
      host = urllib.parse.urlsplit(endpoint()).netloc
      # On a line of its own: a progress bar may have left the cursor at the end of its line.
      sys.stderr.write(f"\n{command}: error: Cloud Storage ({host}) has not answered for {seconds:g} s "
                       f"({TIMEOUT_ENV}={seconds:g}): stopped; what was complete before is kept (a checkpoint or "
                       "upload cut off midway is never read as complete): run the same command again once the store "
                       "answers\n")
      sys.stderr.flush()
      os._exit(1)  # pylint: disable=protected-access  (the thread waiting on the store may never return)
    time.sleep(period)
