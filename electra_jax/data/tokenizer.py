"""Tokenizers: a SentencePiece unigram model trained with [PAD], [UNK], [CLS], [SEP], [MASK] at ids 0-4 (the last three
control symbols no text encodes to), or loaded, or a WordPiece `vocab.txt` (Google's checkpoints) with its own ids."""
import io
import os
import re
from typing import Iterable

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_model
from sentencepiece import sentencepiece_pb2
from etils import epath

from electra_jax.data.special_ids import SpecialIds
from electra_jax.runtime import storage

SCORE_GRID = 64
# SentencePiece's max_sentence_length (its default): longer sentences are left out of its training.
MAX_SENTENCE_BYTES = 4192
SPECIAL_TOKENS = SpecialIds(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]")


class Tokenizer:
  """Text <-> ids without special tokens; `special_ids` says where [CLS]/[SEP]/... live in this vocabulary."""

  def __init__(self, path: str):
    """Every tokenizer a command reads: an empty, truncated or other file is a one-line ValueError naming it."""
    self.path = os.fspath(path)
    data = epath.Path(self.path).read_bytes()  # gs:// works too
    wordpiece = self.path.endswith(".txt")
    what = "a WordPiece vocab.txt" if wordpiece else "a SentencePiece model"
    if not data:
      raise ValueError(f"tokenizer {self.path} is empty, not {what}")
    try:
      if wordpiece:
        self._init_wordpiece(data)
      else:
        self._sp = spm.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, UnicodeDecodeError) as e:  # SentencePiece's parse error names no file
      raise ValueError(f"tokenizer {self.path} is not {what} (truncated, or another kind of file)") from e
    if not wordpiece:
      self.vocab_size = self._sp.get_piece_size()
      self.special_ids = SpecialIds(*(self._sp.piece_to_id(t) for t in SPECIAL_TOKENS))
      if list(self.special_ids) != list(range(5)):
        raise ValueError(f"{self.path}: special tokens must have ids 0-4, found {self.special_ids}")

  def _init_wordpiece(self, data: bytes):
    from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top

    vocab = {tok: i for i, tok in enumerate(data.decode("utf-8").splitlines())}
    if missing := [t for t in SPECIAL_TOKENS if t not in vocab]:
      raise ValueError(f"{self.path}: WordPiece vocab lacks {missing}")
    # Google's vocab files are uncased unless their name says otherwise.
    lowercase = "uncased" in self.path or "cased" not in self.path
    self.wordpiece = BertWordPieceTokenizer(vocab, lowercase=lowercase, strip_accents=lowercase)
    self.vocab_size = len(vocab)
    self.special_ids = SpecialIds(*(vocab[t] for t in SPECIAL_TOKENS))
    self._sp = None

  def encode(self, text: str) -> list[int]:
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    if self._sp is not None:
      return self._sp.encode(texts)
    return [e.ids for e in self.wordpiece.encode_batch(texts, add_special_tokens=False)]

  def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """encode_batch's ids, each with its piece's (begin, end) character span in the text, less the whitespace a
    SentencePiece "▁word" piece counts in: an answer or a word is found in the text from these. Byte-fallback pieces
    of one character and a lone "▁" may have empty spans."""
    if self._sp is None:
      encoded = [(e.ids, e.offsets) for e in self.wordpiece.encode_batch(texts, add_special_tokens=False)]
    else:
      encoded = []  # SentencePiece gives UTF-8 byte offsets (in every 0.2.x): mapped to characters
      for text, proto in zip(texts, self._sp.encode(texts, out_type="serialized_proto")):
        pieces = sentencepiece_pb2.SentencePieceText.FromString(proto).pieces
        char_at = np.cumsum([0] + [len(c.encode("utf-8")) for c in text])  # byte offset of each character
        spans = np.searchsorted(char_at, [(p.begin, p.end) for p in pieces]).reshape(-1, 2)
        encoded.append(([p.id for p in pieces], spans.tolist()))
    return [(list(ids), [(end - len(text[begin:end].lstrip()), end) for begin, end in spans])  # leading space cut
            for text, (ids, spans) in zip(texts, encoded)]

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids]
    return self._sp.decode(ids) if self._sp is not None else self.wordpiece.decode(ids, skip_special_tokens=False)

  def normalize(self, text: str) -> str:
    """The text as the tokenizer sees it (NFKC, folded spaces): what decode(encode(text)) gives back."""
    if self._sp is not None:
      return self._sp.normalize(text).replace("\u2581", " ").strip()  # U+2581 is SentencePiece's space
    return self.wordpiece.normalizer.normalize_str(text)

  def word_starts(self) -> tuple[bool, ...]:
    """Per id: the piece begins a word (SentencePiece's with U+2581; WordPiece's but "##" continuations, [UNK] a whole
    word, as in BERT); never [PAD], [CLS], [SEP] or [MASK]. Whole-word masking's words."""
    if self._sp is not None:
      starts = [self._sp.id_to_piece(i).startswith("\u2581") for i in range(self.vocab_size)]
    else:
      starts = [not self.wordpiece.id_to_token(i).startswith("##") for i in range(self.vocab_size)]
    never = set(self.special_ids) - {self.special_ids.unk}
    return tuple(start and i not in never for i, start in enumerate(starts))

  def check_vocab_size(self, vocab_size: int):
    if self.vocab_size != vocab_size:
      raise ValueError(f"tokenizer {self.path} has {self.vocab_size} tokens but data.vocab_size is {vocab_size}; "
                       f"set --config.data.vocab_size={self.vocab_size} or use a matching tokenizer")


def train_sentencepiece(sentences: Iterable[str], path: str, vocab_size: int, max_sentences: int = 1_000_000,
                        num_threads: int | None = None, source: str = "the corpus") -> Tokenizer:
  """Trains a unigram model on (at most `max_sentences` of) `sentences` and writes it to `path` atomically. A vocab_size
  SentencePiece cannot reach on this text (`source`, for the message) is a ValueError, a failed write an OSError."""
  model = io.BytesIO()
  counts = {"sentences": 0, "too_long": 0}

  def counted():
    for s in sentences:
      counts["sentences"] += 1
      counts["too_long"] += len(s.encode("utf-8")) > MAX_SENTENCE_BYTES
      yield s
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=counted(), model_writer=model, model_type="unigram", vocab_size=vocab_size,
        pad_id=0, pad_piece=SPECIAL_TOKENS.pad, unk_id=1, unk_piece=SPECIAL_TOKENS.unk, bos_id=-1, eos_id=-1,
        control_symbols=[SPECIAL_TOKENS.cls, SPECIAL_TOKENS.sep, SPECIAL_TOKENS.mask],  # ids 2, 3, 4
        byte_fallback=True,  # no [UNK] for rare characters, so decoding gives the text back
        input_sentence_size=max_sentences, max_sentence_length=MAX_SENTENCE_BYTES, shuffle_input_sentence=True,
        num_threads=num_threads or os.cpu_count(), minloglevel=2)
  except RuntimeError as e:  # SentencePiece's C++ checks; its message, less their source location and condition
    if counts["sentences"] and counts["too_long"] == counts["sentences"]:
      raise ValueError(f"every line of {source} is longer than SentencePiece's limit of {MAX_SENTENCE_BYTES} bytes per "
                       "sentence (max_sentence_length), so none is left to train a tokenizer on: break the text into "
                       "shorter lines (data.split_sentences cuts them only at sentence ends)") from e
    reason = re.sub(r"^[A-Z_]+: \S+\(\d+\) \[[^\]]*\]\s*", "", str(e)) or str(e)
    if most := re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", reason):
      raise ValueError(f"data.vocab_size={vocab_size} is too large for {source}: SentencePiece can make "
                       f"at most {most[1]} pieces of it; set --config.data.vocab_size={most[1]} or less, or give it "
                       "more text") from e
    raise ValueError(f"SentencePiece cannot train a data.vocab_size={vocab_size} tokenizer on {source}: "
                     f"{reason}") from e
  # SentencePiece sums piece scores in float32, HF tokenizers in float64: where two segmentations tie (e.g. "000" as
  # "0"+"00" or "00"+"0") rounding makes them choose differently. On a 1/64 grid every sum is exact in both.
  proto = sp_model.ModelProto.FromString(model.getvalue())
  for piece in proto.pieces:
    piece.score = round(piece.score * SCORE_GRID) / SCORE_GRID
  try:
    storage.write(path, proto.SerializeToString())  # atomic: its temporary is deleted when the write fails
  except OSError as e:
    raise OSError(f"writing the tokenizer {path} failed ({e.strerror or e}): nothing of it was kept; free space or "
                  "fix the cause, then re-run") from e
  return Tokenizer(path)
