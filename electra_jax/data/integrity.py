"""Whether a prepared dataset's files are those electra-prepare wrote (their sizes and CRC-32s in its metadata.json),
and the one-line error naming a damaged shard, its dataset and the remedy (docs/data.md, "Damaged data")."""
import json
import os
import zlib

from etils import epath

from electra_jax.runtime import storage

_CHUNK = 4 << 20
SHARD = ".array_record-"  # in the name of every shard file, never in a description file's


class Damaged(OSError):
  """A shard that is not what electra-prepare wrote: truncated, missing, or with other bytes."""


def damaged(shard: str, dataset: str, what: str, local_copy: str | None = None) -> Damaged:
  """The error naming `shard` of `dataset`, what is wrong and the remedy; `local_copy`: a gs:// shard's deleted copy."""
  if local_copy:
    return Damaged(f"the local copy {local_copy} of shard {shard} of the prepared dataset {dataset} is damaged "
                   f"({what}): it was deleted; run the same command again to fetch it anew (if it fails again, the "
                   f"copy on Cloud Storage is damaged: {REPAIR})")
  return Damaged(f"shard {shard} of the prepared dataset {dataset} is damaged ({what}): {REPAIR}")


REPAIR = ("rebuild it with electra-prepare --repair and the run's --config (bit for bit), or copy the dataset again "
          "from where electra-prepare wrote it; then run the same command again: a run resumes where it stopped")


def crc32(path) -> int:
  crc = 0
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return crc


def file_record(path: str) -> dict:
  """{"bytes": its size, "crc32": its CRC-32} of the local file `path`: a shard's entry in metadata.json's "files"."""
  return {"bytes": os.path.getsize(path), "crc32": crc32(path)}


def record(dataset_dir: str) -> dict:
  """{shard file name: file_record} of the finished shards in the local `dataset_dir`: metadata.json's "files"."""
  return {name: file_record(os.path.join(dataset_dir, name))
          for name in sorted(os.listdir(dataset_dir)) if SHARD in name}


def size_problem(expected: dict | None, size: int | None) -> str | None:
  """What is wrong with a shard of `size` bytes (None: absent) that metadata.json records as `expected`."""
  if size is None:
    return "the file is missing"
  if expected and size != expected["bytes"]:
    return (f"{size} bytes, but electra-prepare wrote {expected['bytes']}: "
            f"{'truncated' if size < expected['bytes'] else 'longer'}")
  return None


def size_problems(dataset_dir: str) -> dict[str, str]:
  """{shard: size_problem} of the shards a dataset's metadata.json records, from one listing."""
  expected = json.loads((epath.Path(dataset_dir) / "metadata.json").read_text()).get("files", {})
  sizes = storage.file_sizes(dataset_dir)
  return {name: problem for name, record in expected.items() if (problem := size_problem(record, sizes.get(name)))}


def crc_problem(expected: dict | None, path) -> str | None:
  """What is wrong with the bytes of the shard at `path`, whose size is right, against `expected`."""
  if expected and crc32(path) != expected["crc32"]:
    return "its bytes differ from those electra-prepare wrote: CRC-32 mismatch"
  return None
