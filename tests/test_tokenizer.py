"""The tokenizer: fixed special ids, never produced from text, round trip, WordPiece vocab.txt, clear size errors."""
import subprocess
import sys

import pytest


from electra_jax.data import corpus as corpus_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data.special_ids import SpecialIds


@pytest.fixture(scope="module")
def tok(tiny_data):
  return tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)


def test_trained_sentencepiece_has_fixed_special_ids(tok, tiny_data):
  assert tok.special_ids == SpecialIds(0, 1, 2, 3, 4)
  assert tok.vocab_size == tiny_data[0].data.vocab_size == tiny_data[1].vocab_size
  assert tok.path.endswith(".model")


def test_plain_text_never_encodes_to_special_ids(tok):
  text = "[CLS] [SEP] [MASK] [PAD] [UNK] <s> </s> Ünïcødé ✓ 漢字 \x00 tab\there"
  ids = tok.encode(text)
  assert ids and min(ids) >= 5  # byte fallback: not even [UNK]
  assert tok.decode(ids) == tok.normalize(text)


def test_round_trip_on_real_text(tok):
  lines = list(corpus_lib.Corpus(max_documents=5).lines())
  assert len(lines) > 100
  for line, ids in zip(lines, tok.encode_batch(lines)):
    assert ids == tok.encode(line)
    assert tok.decode(ids) == tok.normalize(line)


def test_vocab_size_mismatch_names_both_numbers(tok):
  with pytest.raises(ValueError, match=r"2000 tokens but data.vocab_size is 30522"):
    tok.check_vocab_size(30522)


def test_wordpiece_vocab_txt(tmp_path):
  # BERT's layout: [PAD] 0, [unused*], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then pieces.
  words = ["the", "union", "state", "of", "is", "strong", "##ly", ",", "."]
  vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(vocab) + "\n")
  tok = tokenizer_lib.Tokenizer(str(path))
  assert tok.special_ids == SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103)
  assert tok.vocab_size == len(vocab)
  ids = tok.encode("The State of the Union is strongly strong.")
  assert [vocab[i] for i in ids] == ["the", "state", "of", "the", "union", "is", "strong", "##ly", "strong", "."]
  assert tok.decode(ids) == "the state of the union is strongly strong."
  assert tok.encode("zebra") == [100]


def test_tokenizer_and_packing_import_without_tensorflow():
  code = ("import sys, electra_jax.data.tokenizer, electra_jax.data.packing, electra_jax.data.corpus; "
          "sys.exit('tensorflow' in sys.modules)")
  assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
