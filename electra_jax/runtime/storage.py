"""One file-system layer for local paths and gs:// alike (docs/launch.md, "Cloud Storage"): etils.epath over gcsfs, as
Orbax's paths are, plus recursive globs, atomic writes, directories put in place whole and local copies of remote
files; on gs://, where a directory cannot be renamed, one is uploaded with the file its readers look for first last."""
import contextlib
import errno
import glob as glob_lib
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.parse
import uuid
from typing import Callable, Iterable

from etils import epath

_CHUNK = 16 << 20
LEFTOVER_AGE_S = 24 * 3600  # a temporary of another host (or an unnamed owner) untouched this long is abandoned


def initialize():
  """Every gs:// access through gcsfs (not TensorFlow's gfile), and the emulator's settings (docs/launch.md)."""
  os.environ.setdefault("EPATH_USE_TF", "false")
  host = os.environ.get("STORAGE_EMULATOR_HOST")
  if not host:
    return
  url = host if "://" in host else f"http://{host}"
  os.environ["STORAGE_EMULATOR_HOST"] = url  # google-cloud-storage 3.x uploads only with the scheme
  os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
  os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # a gRPC probe emulators lack
  # No credentials. fsspec reads FSSPEC_GCS_TOKEN when imported (children inherit it); it may be imported already.
  os.environ["FSSPEC_GCS_TOKEN"] = "anon"
  import fsspec  # pylint: disable=g-import-not-at-top
  fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"


def check_reachable(timeout_s: float = 10.0):
  """One TCP connect to Cloud Storage: an unreachable one is one line at once, not a minute of gcsfs's retries."""
  if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
    return
  url = urllib.parse.urlsplit(endpoint())
  host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
  try:
    socket.create_connection((host, port), timeout=timeout_s).close()
  except OSError as e:
    raise OSError(f"gs:// paths need Cloud Storage, but {host}:{port} cannot be reached ({e}): check the network "
                  "(or STORAGE_EMULATOR_HOST, for an emulator)") from None


def endpoint() -> str:
  """The URL gs:// paths go to: the emulator's (as initialize left it) or Google's."""
  return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"


def is_remote(path) -> bool:
  return "://" in os.fspath(path)


def absolute(path) -> str:
  """A local path made absolute; a URL as it is."""
  path = os.fspath(path)
  return path if is_remote(path) else os.path.abspath(path)


def glob(pattern: str) -> list[str]:
  """Sorted matches of `pattern`, where `**` matches any number of directories (zero included), gs:// too."""
  if not is_remote(pattern):
    return sorted(glob_lib.glob(pattern, recursive=True))
  import fsspec  # pylint: disable=g-import-not-at-top
  fs, _ = fsspec.core.url_to_fs(pattern)
  return sorted(fs.unstrip_protocol(p) for p in fs.glob(pattern))


def write(path, data: bytes | str):
  """Writes a whole file atomically: locally beside it, then renamed; on gs:// in place (an upload is atomic)."""
  path = epath.Path(path)
  data = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(path):
    path.write_bytes(data)
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  remove_leftovers(path)
  tmp = epath.Path(temp_path(path))
  try:
    tmp.write_bytes(data)
    tmp.replace(path)
  except BaseException as e:
    tmp.unlink(missing_ok=True)  # e.g. disk full: no partial temporary stays behind
    if isinstance(e, OSError) and e.errno in DISK_FULL:
      raise OSError(e.errno, f"{e.strerror}: writing {path} needs {size(len(data))}, and its disk has "
                    f"{size(free_space(path))} free") from e
    raise


def copy_file(src, dst):
  """Streams one file between any two stores; an upload whose session the store lost midway is started again."""
  if os.fspath(src).startswith("gs://") and os.fspath(dst).startswith("gs://"):
    import fsspec  # pylint: disable=g-import-not-at-top
    fs, _ = fsspec.core.url_to_fs(os.fspath(dst))
    fs.copy(os.fspath(src), os.fspath(dst))
    return
  for attempt in range(2):
    try:
      with epath.Path(src).open("rb") as r, epath.Path(dst).open("wb") as w:
        shutil.copyfileobj(r, w, _CHUNK)
      return
    except FileNotFoundError as e:  # gcsfs's error for a 404 on the session's URL names it (upload_id=...)
      if attempt or not is_remote(dst) or "upload_id=" not in str(e):
        raise


def file_sizes(directory) -> dict[str, int]:
  """{path relative to `directory`: size in bytes} of the files under it (on gs://, from one listing)."""
  directory = os.fspath(directory)
  if not is_remote(directory):
    return {os.path.relpath(os.path.join(d, f), directory): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(directory) for f in files}
  import fsspec  # pylint: disable=g-import-not-at-top
  fs, root = fsspec.core.url_to_fs(directory)
  return {p[len(root.rstrip("/")) + 1:]: int(info["size"]) for p, info in fs.find(root, detail=True).items()}


def copy_tree(src, dst, last: str | None = None):
  """Copies every file under `src` to `dst` (between any two stores), the relative path `last` after the rest."""
  for f in sorted(file_sizes(src), key=lambda f: (f == last, f)):
    target = epath.Path(dst) / f
    if not is_remote(target):
      target.parent.mkdir(parents=True, exist_ok=True)
    copy_file(epath.Path(src) / f, target)


def refuse_existing(path, overwrite: bool, how: str = "pass --overwrite to replace it"):
  """Before any slow work: an existing output is replaced only when asked to."""
  if not overwrite and epath.Path(path).exists():
    raise FileExistsError(f"{path} exists; {how}")


def refuse_overlap(output, inputs: Iterable[tuple[str, str]], name: str = "output"):
  """A one-line ValueError when `output` is, contains or is inside one of `inputs` ((path, what it is))."""
  canonical = lambda path: os.fspath(path).rstrip("/") if is_remote(path) else os.path.realpath(path)
  out = canonical(output)
  for path, what in inputs:
    p = canonical(path)
    relation = ("is" if out == p else "contains" if p.startswith(out + "/") else
                "is inside" if out.startswith(p + "/") else None)
    if relation:
      raise ValueError(f"{name} {output} {relation} {path} ({what}), which this command reads: {name} must lie "
                       "apart from what it reads")


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # disk full, quota: where free space is the remedy
NO_SPACE = (*DISK_FULL, errno.EFBIG)  # and the file size limit


def no_space(e: Exception, errnos: tuple = NO_SPACE) -> bool:
  """Whether `e` is a write that ran out of space (of `errnos`), by errno or in words (some writers give no errno)."""
  return getattr(e, "errno", None) in errnos or any(os.strerror(n) in str(e) for n in errnos)


def free_space(path) -> int:
  """The bytes free on the local disk that holds (or would hold) `path`."""
  path = os.path.abspath(os.fspath(path))
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def size(n: int) -> str:
  """A byte count in words: 512 bytes, 3.5 KiB, 1.2 MiB."""
  return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} bytes"


@contextlib.contextmanager
def staged_dir(out: str, last: str):
  """Yields a new local directory for `out`'s files, which replace `out` if the block ends without error (on gs://
  uploaded with `last` last); no space is one OSError naming `out`, an earlier `out` left as it was."""
  remote = is_remote(out)
  out = absolute(out)
  # A killed writer's leftovers go when `out` is next written.
  beside = os.path.join(tempfile.gettempdir(), "electra_jax-staged") if remote else out
  os.makedirs(os.path.dirname(beside), exist_ok=True)
  remove_leftovers(beside)
  tmp = temp_path(beside)
  os.makedirs(tmp)
  try:
    try:
      yield tmp
    except (OSError, RuntimeError) as e:
      if not no_space(e):
        raise
      written = sum(file_sizes(tmp).values())
      shutil.rmtree(tmp, ignore_errors=True)
      free = shutil.disk_usage(os.path.dirname(tmp)).free  # with the staged part deleted again
      kept = f"the earlier {out} is unchanged" if epath.Path(out).exists() else "nothing of it was kept"
      raise OSError(f"writing {out} failed, no space: it needs more than the {size(free)} free on the disk of "
                    f"{os.path.dirname(tmp)} (it had written {size(written)} when the disk filled): {kept}; free "
                    "space or write elsewhere, then re-run") from e
    if remote:
      if epath.Path(out).exists():
        epath.Path(out).rmtree()  # first, so that no stale object outlives the upload
      copy_tree(tmp, out, last)
    else:
      old = f"{tmp}.old"
      if os.path.exists(out):
        os.replace(out, old)  # moved aside whole; deleted once the new one is in place
      os.replace(tmp, out)
      shutil.rmtree(old, ignore_errors=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def cache_dir() -> str:
  """Where remote data is copied to be read locally: $ELECTRA_JAX_CACHE, else ~/.cache/electra_jax."""
  return os.environ.get("ELECTRA_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "electra_jax")


class LocalCopy:
  """A local mirror of the remote `directory` under cache_dir(), each file fetched when first asked for, shared by a
  host's processes: one per version (the SHA-256 of `key_files`), the others' deleted."""

  def __init__(self, directory: str, *key_files: str):
    self.remote = directory
    key = hashlib.sha256(b"".join((epath.Path(directory) / f).read_bytes() for f in key_files)).hexdigest()[:16]
    base = os.path.join(cache_dir(), directory.replace("://", "/", 1))
    self.path = os.path.join(base, key)
    os.makedirs(self.path, exist_ok=True)
    for entry in os.listdir(base):  # an earlier version's copy, or a whole-directory copy of older code
      old = os.path.join(base, entry)
      with contextlib.suppress(OSError):  # another process of this host may delete it first
        if entry != key:
          shutil.rmtree(old) if os.path.isdir(old) else os.unlink(old)

  def fetch(self, name: str, check: Callable[[str], None] | None = None) -> str:
    """The local path of file `name`, fetched first unless here; `check(path)` raises before a bad one is in place."""
    local = os.path.join(self.path, name)
    if not os.path.exists(local):
      os.makedirs(os.path.dirname(local), exist_ok=True)
      remove_leftovers(local)
      tmp = temp_path(local)
      try:
        copy_file(epath.Path(self.remote) / name, tmp)
        if check:
          check(tmp)
        os.replace(tmp, local)
      finally:
        if os.path.exists(tmp):
          os.unlink(tmp)
    return local


def this_host() -> str:
  """This machine, and its pid namespace where there is one (containers sharing a hostname see other pids)."""
  try:
    namespace = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))  # "pid:[4026531836]"
  except OSError:
    return socket.gethostname()
  return f"{socket.gethostname()}~{namespace}"


def process_gone(host: str, pid: int) -> bool:
  """Whether `pid` of `host` (this_host's form) has surely ended; only this host's can be looked at."""
  if host != this_host() or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  except PermissionError:  # another user's: it runs
    return False
  return proc_stat(pid)[:1] in (["Z"], ["X"])  # killed but not yet reaped by its parent: gone all the same


def read_local(path: str) -> str:
  """A small local file's text, stripped, or '' where it cannot be read (/proc, /sys). Not through epath, which
  decides once, at its first use, whether gs:// goes through TensorFlow: a command may read these before
  initialize() has said no."""
  try:
    with open(path, encoding="utf-8") as f:
      return f.read().strip()
  except OSError:
    return ""


def proc_stat(pid: int) -> list[str]:
  """The fields of /proc/<pid>/stat after the command's name, the state first (Linux), or []."""
  return read_local(f"/proc/{pid}/stat").rpartition(")")[2].split()


def temp_path(path) -> str:
  """A new temporary name beside local `path` that names its writer, so that a dead writer's can be told."""
  directory, name = os.path.split(os.fspath(path))
  return os.path.join(directory, f".{name}.{this_host()}-{os.getpid()}-{uuid.uuid4().hex}.tmp")


def remove_leftovers(path):
  """Deletes temp_path(path)'s of writers that are gone (of this host) or untouched for LEFTOVER_AGE_S."""
  directory, name = os.path.split(os.fspath(path))
  try:
    entries = os.listdir(directory or ".")
  except OSError:
    return
  for entry in entries:
    m = re.fullmatch(rf"\.{re.escape(name)}\.(.+)\.tmp(\.old)?", entry)
    if not m:
      continue
    full = os.path.join(directory, entry)
    owner = re.fullmatch(r"(.+)-(\d+)-[0-9a-f]{32}", m[1])
    with contextlib.suppress(OSError):  # gone meanwhile, or not ours to delete
      abandoned = (owner and process_gone(owner[1], int(owner[2]))) or (
          time.time() - os.lstat(full).st_mtime > LEFTOVER_AGE_S)
      if abandoned:
        shutil.rmtree(full) if os.path.isdir(full) and not os.path.islink(full) else os.unlink(full)
