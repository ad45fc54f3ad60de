"""Ids of the special tokens. Our SentencePiece models fix them at 0-4; Google's WordPiece vocab.txt has its own."""
from typing import NamedTuple


class SpecialIds(NamedTuple):
  pad: int = 0
  unk: int = 1
  cls: int = 2
  sep: int = 3
  mask: int = 4
