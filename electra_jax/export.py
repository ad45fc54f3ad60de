"""electra-export: a pre-training checkpoint as an HF transformers ELECTRA directory, and HF ELECTRA back into ours.

  electra-export --workdir=runs/demo --output=exports/demo
  electra-export --workdir=runs/demo --output=exports/demo_step1000 --step=1000
  electra-export --workdir=runs/demo --output=exports/demo --overwrite                 # replace an earlier export

writes OUT/ = the discriminator (ElectraForPreTraining / ElectraModel), OUT/generator/ = the generator
(ElectraForMaskedLM), each with model.safetensors, config.json and the tokenizer: tokenizer.json (read by
AutoTokenizer, same ids and token_type_ids as our pipeline) plus our own tokenizer file (sentencepiece.model or
vocab.txt) so that `import_hf` and electra-finetune tokenize with our code. OUT may be local or gs://, and is either
complete or absent: everything is written into a temporary directory and put in place at the end (locally renamed;
on gs://, uploaded with config.json, which readers look for first, last).

Import goes the other way: `import_hf(hf_dir)` turns an HF ELECTRA directory (ours, or a released google/electra-*
discriminator saved locally, with its WordPiece vocab.txt; an optional generator in hf_dir/generator or
`generator_dir`) into (config, params) for `train.create(config)`. electra-finetune accepts such a directory as
init_from. The config is the run's own (OUT/electra_jax_config.json) for our exports, the defaults otherwise, with
the sizes of the HF config.json. The embedding-sharing mode is inferred: "shared" when the generator's embeddings
equal the discriminator's (or there is no generator: a fresh one is initialised), "untied" otherwise (a gdes run
comes back untied, its delta folded into the discriminator's table).

Literal "[CLS]"/"[SEP]"/"[MASK]"/"[PAD]"/"[UNK]" typed into text stay single special tokens in HF tokenizers; our
SentencePiece pipeline never produces special ids from text. Clean such strings from raw text.
"""
import json
import os

import jax
import ml_collections
import numpy as np
from absl import flags, logging
from etils import epath
from flax import traverse_util

from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import modeling
from electra_jax import storage
from electra_jax import tokenizer as tokenizer_lib

SPM_FILE = "sentencepiece.model"  # our tokenizer beside tokenizer.json: what import_hf and fine-tuning read
VOCAB_FILE = "vocab.txt"
WEIGHTS_FILE = "model.safetensors"
GENERATOR_DIR = "generator"
RUN_CONFIG_FILE = "electra_jax_config.json"  # the pre-training config, for import_hf


# --- The two networks as HF sees them --------------------------------------------------------------------------------

def network_params(model_config: modeling.ModelConfig, params, net: str) -> dict:
  """{"embeddings", "encoder", "head"} of `net` ("discriminator" | "generator") as a stand-alone model: its effective
  embeddings (gdes: the generator's table + delta), its encoder ("all": the discriminator's) and its head."""
  mode = model_config.embedding_sharing
  if mode in ("shared", "all"):
    emb = params["embeddings"]
  elif net == "generator" or mode == "untied":
    emb = params[f"{net}_embeddings"]
  else:
    emb = {k: v for k, v in params["discriminator_embeddings"].items() if k != "word_embeddings_delta"}
    emb["word_embeddings"] = (params["generator_embeddings"]["word_embeddings"] +
                              params["discriminator_embeddings"]["word_embeddings_delta"])
  encoder = params["discriminator" if net == "discriminator" or mode == "all" else "generator"]
  return dict(embeddings=emb, encoder=encoder, head=params.get(f"{net}_head"))  # None: objective=mlm has none


def _module_map(num_layers: int, project: bool, net: str):
  """(our module path in network_params' dict, HF module name, kind) for every module of one network."""
  rows = [(("embeddings", t), f"electra.embeddings.{t}", "table")
          for t in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
  rows.append((("embeddings", "LayerNorm"), "electra.embeddings.LayerNorm", "norm"))
  if project:
    rows.append((("encoder", "embeddings_project"), "electra.embeddings_project", "dense"))
  for i in range(num_layers):
    ours, hf = ("encoder", f"layer_{i}"), f"electra.encoder.layer.{i}"
    rows += [(ours + ("attention", n), f"{hf}.attention.self.{n}", "dense") for n in ("query", "key", "value")]
    rows += [(ours + ("attention", "output"), f"{hf}.attention.output.dense", "dense"),
             (ours + ("attention_LayerNorm",), f"{hf}.attention.output.LayerNorm", "norm"),
             (ours + ("intermediate",), f"{hf}.intermediate.dense", "dense"),
             (ours + ("output",), f"{hf}.output.dense", "dense"),
             (ours + ("output_LayerNorm",), f"{hf}.output.LayerNorm", "norm")]
  if net == "discriminator":
    rows += [(("head", "dense"), "discriminator_predictions.dense", "dense"),
             (("head", "dense_prediction"), "discriminator_predictions.dense_prediction", "dense")]
  else:
    # generator_lm_head.weight is tied to the word embeddings (tie_word_embeddings), so only its bias is stored.
    rows += [(("head", "dense"), "generator_predictions.dense", "dense"),
             (("head", "LayerNorm"), "generator_predictions.LayerNorm", "norm"),
             (("head", "bias"), "generator_lm_head.bias", "vector")]
  return rows


# Our leaf name, HF's parameter name and whether the array is transposed (Flax kernels are [in, out], torch [out, in]).
_LEAVES = {"table": [((), "weight", False)], "vector": [((), "", False)],
           "norm": [(("scale",), "weight", False), (("bias",), "bias", False)],
           "dense": [(("kernel",), "weight", True), (("bias",), "bias", False)]}


def _leaf_pairs(encoder: modeling.EncoderConfig, model_config: modeling.ModelConfig, net: str):
  """(our flat path, HF state-dict key, transpose) for every parameter of one network."""
  project = model_config.embedding_size != encoder.hidden_size
  for ours, hf, kind in _module_map(encoder.num_layers, project, net):
    for suffix, hf_leaf, transpose in _LEAVES[kind]:
      yield ours + suffix, f"{hf}.{hf_leaf}" if hf_leaf else hf, transpose


def to_hf_state_dict(model_config: modeling.ModelConfig, params, net: str) -> dict:
  """HF state dict (name → float32 numpy) of `net`."""
  flat = traverse_util.flatten_dict(jax.device_get(network_params(model_config, params, net)))
  pairs = list(_leaf_pairs(getattr(model_config, net), model_config, net))
  unmapped = set(flat) - {p for p, _, _ in pairs}
  if unmapped:
    raise ValueError(f"{net} parameters with no HF name: {sorted(unmapped)}")
  return {hf: np.ascontiguousarray(np.asarray(flat[p], np.float32).T if t else np.asarray(flat[p], np.float32))
          for p, hf, t in pairs}


def from_hf_state_dict(model_config: modeling.ModelConfig, state: dict, net: str, source: str) -> dict:
  """network_params-shaped dict of `net` from an HF state dict; every key must be used (an ElectraModel's keys,
  without the "electra." prefix, are accepted too)."""
  state = {k if k.startswith(("electra.", "discriminator_", "generator_")) else f"electra.{k}": v
           for k, v in state.items()}
  pairs = list(_leaf_pairs(getattr(model_config, net), model_config, net))
  missing = [hf for _, hf, _ in pairs if hf not in state]
  if missing:
    raise ValueError(f"{source} lacks {len(missing)} weights of an ELECTRA {net}, e.g. {missing[:3]}")
  ignorable = ("electra.embeddings.position_ids", "generator_lm_head.weight")
  unused = sorted(set(state) - {hf for _, hf, _ in pairs} - set(ignorable))
  if unused:
    raise ValueError(f"{source} has weights we do not know: {unused[:5]}")
  flat = {p: np.asarray(state[hf], np.float32).T if t else np.asarray(state[hf], np.float32) for p, hf, t in pairs}
  return traverse_util.unflatten_dict(flat)


def hf_config(model_config: modeling.ModelConfig, net: str, pad_id: int, **extra):
  """transformers.ElectraConfig of `net`."""
  import transformers  # pylint: disable=g-import-not-at-top
  e = getattr(model_config, net)
  return transformers.ElectraConfig(
      vocab_size=model_config.vocab_size, embedding_size=model_config.embedding_size, hidden_size=e.hidden_size,
      num_hidden_layers=e.num_layers, num_attention_heads=e.num_heads, intermediate_size=e.intermediate_size,
      hidden_act="gelu", hidden_dropout_prob=model_config.dropout_rate,
      attention_probs_dropout_prob=model_config.attention_dropout_rate,
      max_position_embeddings=model_config.max_position_embeddings, type_vocab_size=model_config.type_vocab_size,
      initializer_range=model_config.initializer_range, layer_norm_eps=model_config.layer_norm_eps,
      pad_token_id=pad_id, tie_word_embeddings=True,
      architectures=["ElectraForPreTraining" if net == "discriminator" else "ElectraForMaskedLM"], **extra)


# --- Tokenizer -------------------------------------------------------------------------------------------------------

def hf_tokenizer(path: str):
  """A `tokenizers.Tokenizer` that gives our Tokenizer's ids, wrapped in [CLS] A [SEP] (B [SEP]) with token types.

  SentencePiece: the .model's Unigram pieces and scores, its own precompiled normalizer, then only spaces stripped
  at the ends and runs of spaces folded (normalizers.Strip would also eat U+0085), and Metaspace. WordPiece: BERT's
  pipeline on the vocab, lowercased as our Tokenizer does.
  """
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # pylint: disable=g-import-not-at-top
  from tokenizers import pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  from tokenizers.implementations import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top

  ours = tokenizer_lib.Tokenizer(path)
  special = ours.special_ids
  if path.endswith(".txt"):
    # Our Tokenizer reads a vocab.txt with exactly this BertWordPieceTokenizer; reuse its backend.
    tok = ours._wp._tokenizer  # pylint: disable=protected-access
    assert isinstance(ours._wp, BertWordPieceTokenizer)  # pylint: disable=protected-access
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
  import transformers  # pylint: disable=g-import-not-at-top
  tok = hf_tokenizer(path)
  names = tokenizer_lib.SPECIAL_TOKENS
  # Without TokenizersBackend as tokenizer_class, model_type electra would route to BertTokenizer: wrong ids.
  hf = transformers.TokenizersBackend(
      tokenizer_object=tok, pad_token=names.pad, unk_token=names.unk, cls_token=names.cls, sep_token=names.sep,
      mask_token=names.mask, model_max_length=model_max_length,
      model_input_names=["input_ids", "token_type_ids", "attention_mask"])
  hf.save_pretrained(out_dir)
  storage.copy_file(path, os.path.join(out_dir, VOCAB_FILE if path.endswith(".txt") else SPM_FILE))


def tokenizer_file(directory: str) -> str:
  """Our tokenizer in an HF directory: an exported sentencepiece.model, else a WordPiece vocab.txt."""
  for name in (SPM_FILE, VOCAB_FILE):
    if (epath.Path(directory) / name).exists():
      return os.fspath(epath.Path(directory) / name)
  raise FileNotFoundError(f"{directory} has neither {SPM_FILE} nor {VOCAB_FILE}: no tokenizer electra_jax can read")


# --- Export ----------------------------------------------------------------------------------------------------------

def _save_network(model_config, params, net: str, tokenizer_path: str, pad_id: int, out_dir: str):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  save_file(to_hf_state_dict(model_config, params, net), os.path.join(out_dir, WEIGHTS_FILE),
            metadata={"format": "pt"})
  hf_config(model_config, net, pad_id).save_pretrained(out_dir)
  save_tokenizer(tokenizer_path, out_dir, model_config.max_position_embeddings)


def _refuse_existing(output: str, overwrite: bool):
  if epath.Path(output).exists() and not overwrite:
    raise FileExistsError(f"{output} exists; pass --overwrite to replace it")


def export(config: ml_collections.ConfigDict, params, output: str, overwrite: bool = False,
           tokenizer_path: str | None = None):
  """Writes the discriminator to `output` and the generator to `output`/generator, atomically."""
  _refuse_existing(output, overwrite)
  model_config = modeling.ModelConfig.from_config(config)
  if not tokenizer_path:
    from electra_jax import prepare  # pylint: disable=g-import-not-at-top
    tokenizer_path = prepare.tokenizer_path(config)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != model_config.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{model_config.vocab_size}")
  if "generator_head" not in params or "discriminator_head" not in params:
    raise ValueError(f"objective {config.objective.name!r} trains no generator and replaced-token head; HF's "
                     "ElectraForPreTraining/ElectraForMaskedLM pair has nothing to load")
  if jax.process_index() != 0:
    return
  with storage.staged_dir(output, last="config.json") as tmp:  # is_hf_dir looks for config.json
    _save_network(model_config, params, "discriminator", tokenizer_path, tok.special_ids.pad, tmp)
    _save_network(model_config, params, "generator", tokenizer_path, tok.special_ids.pad,
                  os.path.join(tmp, GENERATOR_DIR))
    with open(os.path.join(tmp, RUN_CONFIG_FILE), "w", encoding="utf-8") as f:
      f.write(config.to_json_best_effort(indent=2))


# --- Import ----------------------------------------------------------------------------------------------------------

def _read_weights(directory: str) -> dict:
  path = epath.Path(directory) / WEIGHTS_FILE
  if path.exists():
    from safetensors.numpy import load  # pylint: disable=g-import-not-at-top
    return load(path.read_bytes())
  path = epath.Path(directory) / "pytorch_model.bin"
  if path.exists():
    import torch  # pylint: disable=g-import-not-at-top
    with path.open("rb") as f:
      return {k: v.float().numpy() for k, v in torch.load(f, map_location="cpu", weights_only=True).items()}
  raise FileNotFoundError(f"{directory} has neither {WEIGHTS_FILE} nor pytorch_model.bin")


def _read_hf_config(directory: str) -> dict:
  path = epath.Path(directory) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{directory} is not an HF model directory: {path} is missing")
  cfg = json.loads(path.read_text())
  if cfg.get("model_type") != "electra":
    raise ValueError(f"{path}: model_type is {cfg.get('model_type')!r}, not 'electra'")
  return cfg


def is_hf_dir(directory: str) -> bool:
  path = epath.Path(directory) / "config.json"
  return path.exists() and "model_type" in json.loads(path.read_text())


def import_hf(hf_dir: str, generator_dir: str | None = None, tokenizer_path: str | None = None):
  """(config, params) of an HF ELECTRA discriminator directory (+ its generator, from `generator_dir` or
  hf_dir/generator when present): params fit `train.create(config)` and the config's data.tokenizer points at
  the directory's tokenizer (sentencepiece.model or vocab.txt)."""
  disc = _read_hf_config(hf_dir)
  if generator_dir is None and (epath.Path(hf_dir) / GENERATOR_DIR).is_dir():
    generator_dir = os.fspath(epath.Path(hf_dir) / GENERATOR_DIR)
  gen = _read_hf_config(generator_dir) if generator_dir else None
  if disc.get("hidden_act", "gelu") != "gelu":
    raise ValueError(f"{hf_dir}: hidden_act {disc['hidden_act']!r} is not supported (only exact 'gelu')")
  tokenizer_path = tokenizer_path or tokenizer_file(hf_dir)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != disc["vocab_size"]:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but {hf_dir} has vocab_size "
                     f"{disc['vocab_size']}")

  # Our own exports carry the run's config (objective, train and data settings); others start from the defaults.
  config = config_lib.base()
  run_config = epath.Path(hf_dir) / RUN_CONFIG_FILE
  if run_config.exists():
    config.update_from_flattened_dict(traverse_util.flatten_dict(json.loads(run_config.read_text()), sep="."))
  m = config.model
  m.update(num_layers=disc["num_hidden_layers"], hidden_size=disc["hidden_size"],
           num_heads=disc["num_attention_heads"], intermediate_size=disc["intermediate_size"],
           embedding_size=disc["embedding_size"], max_position_embeddings=disc["max_position_embeddings"],
           type_vocab_size=disc["type_vocab_size"], dropout_rate=disc["hidden_dropout_prob"],
           attention_dropout_rate=disc["attention_probs_dropout_prob"],
           initializer_range=disc["initializer_range"], layer_norm_eps=disc["layer_norm_eps"])
  if gen is not None:
    m.generator_fraction = gen["hidden_size"] / disc["hidden_size"]
  config.data.update(vocab_size=disc["vocab_size"], tokenizer=storage.absolute(tokenizer_path),
                     seq_len=min(config.data.seq_len, disc["max_position_embeddings"]))
  model_config = modeling.ModelConfig.from_config(config)
  if gen is not None and (model_config.generator.num_heads != gen["num_attention_heads"] or
                          model_config.generator.intermediate_size != gen["intermediate_size"] or
                          gen["num_hidden_layers"] != disc["num_hidden_layers"]):
    raise ValueError(f"{generator_dir}: the generator is not the discriminator scaled by "
                     f"{m.generator_fraction:.3g} in width (our generators are)")

  d = from_hf_state_dict(model_config, _read_weights(hf_dir), "discriminator", hf_dir)
  g = from_hf_state_dict(model_config, _read_weights(generator_dir), "generator", generator_dir) if gen else None
  shared = g is None or all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(d["embeddings"]),
                                                                  jax.tree.leaves(g["embeddings"])))
  config.objective.embedding_sharing = "shared" if shared else "untied"
  model_config = modeling.ModelConfig.from_config(config)

  # Start from a fresh init so that parts HF lacks (a generator when none is given) are initialised as ours are.
  from electra_jax import train  # pylint: disable=g-import-not-at-top
  params = jax.device_get(train.create(config).init(jax.random.key(config.train.seed)).params)
  emb_key = ("embeddings", "embeddings") if shared else ("discriminator_embeddings", "generator_embeddings")
  params[emb_key[0]] = d["embeddings"]
  params["discriminator"], params["discriminator_head"] = d["encoder"], d["head"]
  if g is not None:
    params[emb_key[1]] = g["embeddings"]
    params["generator"], params["generator_head"] = g["encoder"], g["head"]
  return config, params


# --- Entry point -----------------------------------------------------------------------------------------------------

def export_workdir(workdir: str, output: str, step: int | None = None, overwrite: bool = False):
  """Exports a pre-training workdir's checkpoint (`step`, default: the latest) to `output`."""
  _refuse_existing(output, overwrite)  # before the (slow) restore
  from electra_jax import checkpoints  # pylint: disable=g-import-not-at-top
  config, params = checkpoints.load_params(workdir, step)
  export(config, params, output, overwrite=overwrite)


def run():
  # Flags are defined here, not at import, so the library imports beside other entry points without clashes.
  own = [flags.DEFINE_string("workdir", None, "Pre-training workdir to export (config.json + checkpoints/)."),
         flags.DEFINE_string("output", None, "Directory to write (the discriminator; the generator goes in "
                             "OUTPUT/generator)."),
         flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest intact one)."),
         flags.DEFINE_bool("overwrite", False, "Replace OUTPUT if it exists.")]
  workdir, output, step, overwrite = own

  def main():
    export_workdir(workdir.value, output.value, step.value, overwrite.value)
    logging.info("Exported %s to %s", workdir.value, output.value)
  cli.run("electra-export", __doc__, main, own, required=["workdir", "output"])


if __name__ == "__main__":
  run()
