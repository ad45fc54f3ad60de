"""An HF transformers ELECTRA directory, written from our parameters (`export`: the discriminator, the generator in
generator/, and the run's config) and read back into them (`import_hf`: ours, or a released google/electra-* one).
Literal "[CLS]" and the like in raw text are special tokens to HF tokenizers, never to ours: clean them from text."""
import json
import os

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from etils import epath

from electra_jax import config as config_lib
from electra_jax.data import prepared
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.hf import convert
from electra_jax.hf import tokenizer as hf_tokenizer
from electra_jax.model import modeling, objectives
from electra_jax.runtime import storage

WEIGHTS_FILE = "model.safetensors"
GENERATOR_DIR = "generator"
RUN_CONFIG_FILE = "electra_jax_config.json"  # the pre-training config, for import_hf


def write_model(out_dir: str, state_dict: dict, hf_config: dict, tokenizer_path: str, model_max_length: int):
  """One HF model directory: model.safetensors, config.json (convert.hf_config's) and the tokenizer."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  save_file(state_dict, os.path.join(out_dir, WEIGHTS_FILE), metadata={"format": "pt"})
  storage.write(os.path.join(out_dir, "config.json"), json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  hf_tokenizer.save_tokenizer(tokenizer_path, out_dir, model_max_length)


def export(config: ml_collections.ConfigDict, params, output: str, overwrite: bool = False,
           tokenizer_path: str | None = None):
  """The discriminator to `output`, the generator to `output`/generator and the run's config: complete or absent."""
  storage.refuse_existing(output, overwrite)
  model_config = modeling.ModelConfig.from_config(config)
  tokenizer_path = tokenizer_path or prepared.tokenizer_path(config)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != model_config.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{model_config.vocab_size}")
  if "generator_head" not in params or "discriminator_head" not in params:
    raise ValueError(f"objective {config.objective.name!r} trains no generator and replaced-token head; HF's "
                     "ElectraForPreTraining/ElectraForMaskedLM pair has nothing to load")
  if jax.process_index() != 0:
    return
  with storage.staged_dir(output, last="config.json") as tmp:  # sources.kind looks for config.json
    for net, out_dir in (("discriminator", tmp), ("generator", os.path.join(tmp, GENERATOR_DIR))):
      write_model(out_dir, convert.to_hf_state_dict(model_config, params, net),
                  convert.hf_config(model_config, net, tok.special_ids.pad), tokenizer_path,
                  model_config.max_position_embeddings)
    storage.write(os.path.join(tmp, RUN_CONFIG_FILE), config.to_json_best_effort(indent=2))


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


def import_hf(hf_dir: str, tokenizer_path: str, generator_dir: str | None = None):
  """(config, params) of an HF ELECTRA directory (+ its generator, `generator_dir` or hf_dir/generator); "shared"
  embeddings when the generator's equal the discriminator's (or there is none), else "untied"."""
  disc = _read_hf_config(hf_dir)
  if generator_dir is None and (epath.Path(hf_dir) / GENERATOR_DIR).is_dir():
    generator_dir = os.fspath(epath.Path(hf_dir) / GENERATOR_DIR)
  gen = _read_hf_config(generator_dir) if generator_dir else None
  if disc.get("hidden_act", "gelu") != "gelu":
    raise ValueError(f"{hf_dir}: hidden_act {disc['hidden_act']!r} is not supported (only exact 'gelu')")
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != disc["vocab_size"]:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but {hf_dir} has vocab_size "
                     f"{disc['vocab_size']}")

  # Our own exports carry the run's config (objective, train and data settings); others start from the defaults.
  config = config_lib.base()
  run_config = epath.Path(hf_dir) / RUN_CONFIG_FILE
  if run_config.exists():
    config = config_lib.from_saved(json.loads(run_config.read_text()), config, os.fspath(run_config))
  m = config.model
  m.update({ours: disc[hf] for ours, hf in convert.HF_NAMES.items()})
  if gen is not None:
    m.generator_fraction = gen["hidden_size"] / disc["hidden_size"]
  config.data.update(vocab_size=disc["vocab_size"], tokenizer=tokenizer_path,
                     seq_len=min(config.data.seq_len, disc["max_position_embeddings"]))
  model_config = modeling.ModelConfig.from_config(config)
  if gen is not None and (model_config.generator.num_heads != gen["num_attention_heads"] or
                          model_config.generator.intermediate_size != gen["intermediate_size"] or
                          gen["num_hidden_layers"] != disc["num_hidden_layers"]):
    raise ValueError(f"{generator_dir}: the generator is not the discriminator scaled by "
                     f"{m.generator_fraction:.3g} in width (our generators are)")

  disc_weights, gen_weights = _read_weights(hf_dir), _read_weights(generator_dir) if gen is not None else None
  d = convert.from_hf_state_dict(model_config, disc_weights, "discriminator", hf_dir)
  g = None if gen is None else convert.from_hf_state_dict(model_config, gen_weights, "generator", generator_dir)
  shared = g is None or all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(d["embeddings"]),
                                                                  jax.tree.leaves(g["embeddings"])))
  config.objective.embedding_sharing = "shared" if shared else "untied"
  model_config = modeling.ModelConfig.from_config(config)

  emb_key = ("embeddings", "embeddings") if shared else ("discriminator_embeddings", "generator_embeddings")
  loaded = {emb_key[0]: d["embeddings"], "discriminator": d["encoder"], "discriminator_head": d["head"]}
  if g is not None:
    loaded.update({emb_key[1]: g["embeddings"], "generator": g["encoder"], "generator_head": g["head"]})
  # Parts HF lacks (a generator when none is given) initialised as ours are, only then (that init compiles slowly).
  model = modeling.Electra(model_config)
  init = jax.jit(lambda rng: nn.meta.unbox(objectives.init_params(model, config.objective.name, config.data.seq_len,
                                                                  rng)))
  rng = jax.random.key(config.train.seed)
  missing = set(jax.eval_shape(init, rng)) - set(loaded)
  params = dict(jax.device_get(init(rng)), **loaded) if missing else loaded
  return config, params
