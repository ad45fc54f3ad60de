"""Our tokenizer as HF sees it: tokenizer.json (same ids and token types as our pipeline) and tokenizer_config.json for
AutoTokenizer, beside our own tokenizer file (SPM_FILE or VOCAB_FILE: sources.py finds it there)."""
import json
import os

from etils import epath

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.runtime import storage

SPM_FILE = "sentencepiece.model"  # our tokenizer beside tokenizer.json: what import_hf and fine-tuning read
VOCAB_FILE = "vocab.txt"


def hf_tokenizer(path: str):
  """A `tokenizers.Tokenizer` that gives our Tokenizer's ids, wrapped in [CLS] A [SEP] (B [SEP]) with token types:
  for SentencePiece the .model's pieces and its own normalizer (normalizers.Strip would also eat U+0085)."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # pylint: disable=g-import-not-at-top
  from tokenizers import pre_tokenizers, processors  # pylint: disable=g-import-not-at-top

  ours = tokenizer_lib.Tokenizer(path)
  special = ours.special_ids
  if path.endswith(".txt"):
    tok = Tokenizer.from_str(ours.wordpiece.to_str())  # the very pipeline our Tokenizer encodes a vocab.txt with
  else:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(epath.Path(path).read_bytes())
    tok = Tokenizer(models.Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=special.unk,
                                   byte_fallback=proto.trainer_spec.byte_fallback))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
        normalizers.Replace(Regex(" {2,}"), " "),
        normalizers.Replace(Regex("^ | $"), "")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
  names = tokenizer_lib.SPECIAL_TOKENS
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
  tok.post_processor = processors.TemplateProcessing(
      single=f"{names.cls} $A {names.sep}", pair=f"{names.cls} $A {names.sep} $B:1 {names.sep}:1",
      special_tokens=[(names.cls, special.cls), (names.sep, special.sep)])
  return tok


def save_tokenizer(path: str, out_dir: str, model_max_length: int):
  """tokenizer.json + tokenizer_config.json for AutoTokenizer, and our tokenizer file, into out_dir."""
  os.makedirs(out_dir, exist_ok=True)
  hf_tokenizer(path).save(os.path.join(out_dir, "tokenizer.json"))
  names = tokenizer_lib.SPECIAL_TOKENS
  # Written by hand: transformers 5 saves a class name 4.x cannot load; PreTrainedTokenizerFast loads in both, and
  # without a tokenizer_class model_type electra would route to BertTokenizer (wrong ids for SentencePiece).
  config = dict(tokenizer_class="PreTrainedTokenizerFast", pad_token=names.pad, unk_token=names.unk,
                cls_token=names.cls, sep_token=names.sep, mask_token=names.mask, model_max_length=model_max_length,
                model_input_names=["input_ids", "token_type_ids", "attention_mask"])
  storage.write(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config, indent=2))
  storage.copy_file(path, os.path.join(out_dir, VOCAB_FILE if path.endswith(".txt") else SPM_FILE))
