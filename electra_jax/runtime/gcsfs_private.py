"""The one place that touches gcsfs's private names, to ride out a Cloud Storage outage (outage.py);
tests/test_adapters.py resolves every name in NAMES against the installed gcsfs."""
# pylint: disable=protected-access
from absl import logging

# (module, attribute path) of each private name used below.
NAMES = (("gcsfs.retry", "retry_request"), ("gcsfs.core", "GCSFileSystem._request"),
         ("gcsfs.core", "GCSFileSystem._get_file_request"), ("gcsfs.core", "GCSFileSystem._get_file_concurrent"),
         ("gcsfs.core", "GCSFile._upload_chunk"), ("gcsfs.core", "GCSFile._initiate_upload"))
_REQUESTS = ("_request", "_get_file_request", "_get_file_concurrent")


def lengthen_retries(seconds: float):
  """Makes gcsfs retry a failed request with its backoff (1, 2, 4 ... 32 s, then 32 s each) for over `seconds`."""
  from gcsfs import core, retry  # pylint: disable=g-import-not-at-top
  waits, retries = 0.0, 1
  while waits <= seconds:
    waits += min(2 ** (retries - 1), 32)
    retries += 1
  for name in _REQUESTS:
    method = getattr(core.GCSFileSystem, name)
    setattr(core.GCSFileSystem, name, retry.retry_request(retries=retries)(getattr(method, "__wrapped__", method)))


def restart_lost_uploads():
  """Makes gcsfs start an upload again whose session the store lost (a 404) while all its bytes are at hand."""
  from gcsfs.core import GCSFile  # pylint: disable=g-import-not-at-top
  upload_chunk = getattr(GCSFile._upload_chunk, "__wrapped__", GCSFile._upload_chunk)

  def restarting(self, final=False):
    try:
      return upload_chunk(self, final)
    except FileNotFoundError:
      if self.offset != 0:
        raise
      logging.warning("Cloud Storage no longer knows the upload session of %s: uploading it again", self.path)
      self._initiate_upload()
      return upload_chunk(self, final)

  restarting.__wrapped__ = upload_chunk
  GCSFile._upload_chunk = restarting
