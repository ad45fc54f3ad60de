"""Closing a loop's resources (progress bar, writers, checkpointer) after it ends, however it ends."""
import sys
from typing import Callable, Sequence

from absl import logging


def close_all(closers: Sequence[Callable[[], object]]):
  """Call from a `finally:`. Every closer runs (a checkpointer's close waits for a pending save), and none replaces
  the loop's own error: a closer's error is raised only when the loop had none, and only the first one."""
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
