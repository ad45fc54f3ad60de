"""One file-system layer for local paths and gs:// alike: etils.epath (over gcsfs for gs://, as Orbax's own paths
are), plus what epath lacks: recursive globs, atomic writes, directories put in place whole, local copies of
remote datasets. No TensorFlow here: the model, step and checkpoint code import this module.

What Cloud Storage guarantees, and what follows: one object's upload is atomic (readers see the old object or the
new one, never a part), so a file is replaced by writing it in place. There are no directories, only name
prefixes: "renaming" a directory copies and deletes each object, which is neither atomic nor cheap, so nothing
here renames on gs://. A directory that must be complete or absent is uploaded with the one file its readers look
for first written last. Objects cannot be appended to: metrics.jsonl is rewritten whole at each write.

Local testing against an emulator: set STORAGE_EMULATOR_HOST (`host:port` or `http://host:port`); `initialize`,
called by every entry point before any file is touched, points each library on the path at it (see docs/launch.md).
"""
import contextlib
import glob as glob_lib
import os
import shutil
import tempfile
import uuid

from etils import epath

_CHUNK = 16 << 20


def initialize():
  """Makes every gs:// access go through one client, and through the emulator when STORAGE_EMULATOR_HOST is set."""
  # epath would pick TensorFlow's gfile for gs:// whenever TensorFlow is installed: one client (gcsfs) whether or
  # not the image has TensorFlow, and gfile cannot be pointed at an emulator.
  os.environ.setdefault("EPATH_USE_TF", "false")
  host = os.environ.get("STORAGE_EMULATOR_HOST")
  if not host:
    return
  url = host if "://" in host else f"http://{host}"
  os.environ["STORAGE_EMULATOR_HOST"] = url  # google-cloud-storage 3.x (TensorBoard) uploads only with the scheme
  os.environ["TENSORSTORE_GCS_HTTP_URL"] = url  # TensorStore: Orbax's array data
  # gcsfs asks the Storage Control gRPC API for each bucket's layout; emulators lack it (a 60 s timeout per bucket).
  os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
  # Emulators take no credentials, and application-default ones may not exist. fsspec reads FSSPEC_GCS_TOKEN when
  # imported (child processes inherit it); this process may have imported it already.
  os.environ["FSSPEC_GCS_TOKEN"] = "anon"
  import fsspec  # pylint: disable=g-import-not-at-top
  fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"


def is_remote(path) -> bool:
  return "://" in os.fspath(path)


def absolute(path) -> str:
  """A local path made absolute; a URL as it is."""
  path = os.fspath(path)
  return path if is_remote(path) else os.path.abspath(path)


def glob(pattern: str) -> list[str]:
  """Sorted matches of `pattern`, where `**` matches any number of directories (zero included), locally and on
  gs:// (fsspec's glob)."""
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
  tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
  tmp.write_bytes(data)
  tmp.replace(path)


def copy_file(src, dst):
  """Streams one file between any two stores."""
  with epath.Path(src).open("rb") as r, epath.Path(dst).open("wb") as w:
    shutil.copyfileobj(r, w, _CHUNK)


def _files(directory) -> list[str]:
  """The files under `directory`, as paths relative to it (on gs://, from one listing)."""
  directory = os.fspath(directory)
  if not is_remote(directory):
    return sorted(os.path.relpath(os.path.join(d, f), directory) for d, _, files in os.walk(directory) for f in files)
  import fsspec  # pylint: disable=g-import-not-at-top
  fs, root = fsspec.core.url_to_fs(directory)
  return sorted(p[len(root.rstrip("/")) + 1:] for p in fs.find(root))


def copy_tree(src, dst, last: str | None = None):
  """Copies every file under `src` to `dst` (between any two stores), the relative path `last` after the rest."""
  files = _files(src)
  if last in files:
    files = [f for f in files if f != last] + [last]
  for f in files:
    target = epath.Path(dst) / f
    if not is_remote(target):
      target.parent.mkdir(parents=True, exist_ok=True)
    copy_file(epath.Path(src) / f, target)


def refuse_existing(path, overwrite: bool, how: str = "pass --overwrite to replace it"):
  """Before any slow work: an existing output is replaced only when asked to."""
  if not overwrite and epath.Path(path).exists():
    raise FileExistsError(f"{path} exists; {how}")


@contextlib.contextmanager
def staged_dir(out: str, last: str):
  """Yields a new local directory to write `out`'s files into; when the block ends without error they replace
  `out`. Local `out`: the directory is beside it and renamed into place (atomic; an old `out` is moved aside, then
  deleted). gs://: the old objects are deleted, then the files uploaded with `last` (the file its readers check
  first) last, so a reader sees either the whole directory or none of it."""
  remote = is_remote(out)
  out = absolute(out)
  if remote:
    tmp = tempfile.mkdtemp(prefix="electra_jax-")
  else:
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{uuid.uuid4().hex}.tmp")
    os.makedirs(tmp)
  try:
    yield tmp
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


def local_dir(directory: str, key_file: str) -> str:
  """`directory` itself if local; else a copy of it under cache_dir(), downloaded once (again when `key_file`, a
  small file that changes with the content, differs from the cached one's). For readers that cannot read gs://
  (ArrayRecord's C++ reader). Each process downloads its own copy: no host waits on another's I/O."""
  if not is_remote(directory):
    return directory
  local = os.path.join(cache_dir(), directory.replace("://", "/", 1))
  key = (epath.Path(directory) / key_file).read_bytes()
  cached = os.path.join(local, key_file)
  if os.path.exists(cached) and epath.Path(cached).read_bytes() == key:
    return local
  tmp = f"{local}.{uuid.uuid4().hex}.tmp"
  try:
    copy_tree(directory, tmp, last=key_file)
    if os.path.exists(local):
      shutil.rmtree(local, ignore_errors=True)  # stale; another process may be replacing it as well
    try:
      os.replace(tmp, local)
    except OSError:  # another process put its copy in place first
      if not (os.path.exists(cached) and epath.Path(cached).read_bytes() == key):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return local
