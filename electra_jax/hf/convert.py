"""Our parameter tree <-> HF transformers' ELECTRA state dicts and configs: one network at a time, rename-free
(modeling.py names parameters as HF does); only Flax's [in, out] kernels are transposed."""
import jax
import numpy as np
from flax import traverse_util

from electra_jax.model import modeling


def network_params(model_config: modeling.ModelConfig, params, net: str) -> dict:
  """{"embeddings", "encoder", "head"} of `net` as a stand-alone model (gdes: the table is the generator's + delta)."""
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
  """HF state dict (name → float32 numpy) of `net`; without its head when params have none (a fine-tuned encoder)."""
  network = network_params(model_config, params, net)
  flat = traverse_util.flatten_dict(jax.device_get({k: v for k, v in network.items() if v is not None}))
  pairs = [p for p in _leaf_pairs(getattr(model_config, net), model_config, net)
           if network["head"] is not None or p[0][0] != "head"]
  if unmapped := set(flat) - {p for p, _, _ in pairs}:
    raise ValueError(f"{net} parameters with no HF name: {sorted(unmapped)}")
  return {hf: np.ascontiguousarray(np.asarray(flat[p], np.float32).T if t else np.asarray(flat[p], np.float32))
          for p, hf, t in pairs}


def from_hf_state_dict(model_config: modeling.ModelConfig, state: dict, net: str, source: str) -> dict:
  """network_params-shaped dict of `net` from an HF state dict (ElectraModel's keys too); every key must be used."""
  state = {k if k.startswith(("electra.", "discriminator_", "generator_")) else f"electra.{k}": v
           for k, v in state.items()}
  pairs = list(_leaf_pairs(getattr(model_config, net), model_config, net))
  if missing := [hf for _, hf, _ in pairs if hf not in state]:
    raise ValueError(f"{source} lacks {len(missing)} weights of an ELECTRA {net}, e.g. {missing[:3]}")
  ignorable = ("electra.embeddings.position_ids", "generator_lm_head.weight")
  if unused := sorted(set(state) - {hf for _, hf, _ in pairs} - set(ignorable)):
    raise ValueError(f"{source} has weights we do not know: {unused[:5]}")
  flat = {p: np.asarray(state[hf], np.float32).T if t else np.asarray(state[hf], np.float32) for p, hf, t in pairs}
  return traverse_util.unflatten_dict(flat)


# config.model's keys (an EncoderConfig's, then ModelConfig's) as HF's ElectraConfig names them.
HF_NAMES = dict(num_layers="num_hidden_layers", hidden_size="hidden_size", num_heads="num_attention_heads",
                intermediate_size="intermediate_size", embedding_size="embedding_size",
                max_position_embeddings="max_position_embeddings", type_vocab_size="type_vocab_size",
                dropout_rate="hidden_dropout_prob", attention_dropout_rate="attention_probs_dropout_prob",
                initializer_range="initializer_range", layer_norm_eps="layer_norm_eps")


def hf_config(model_config: modeling.ModelConfig, net: str, pad_id: int, architecture: str = "", **extra) -> dict:
  """The config.json of `net` for transformers.ElectraConfig, as plain JSON (no transformers or torch to write it)."""
  e = getattr(model_config, net)
  default = "ElectraForPreTraining" if net == "discriminator" else "ElectraForMaskedLM"
  sizes = {hf: getattr(e if hasattr(e, ours) else model_config, ours) for ours, hf in HF_NAMES.items()}
  return dict(model_type="electra", architectures=[architecture or default], vocab_size=model_config.vocab_size,
              hidden_act="gelu", pad_token_id=pad_id, tie_word_embeddings=True, **sizes, **extra)
