"""The fine-tuned models: the discriminator's encoder ("electra") with a task head named as in HF transformers, where
the encoder weights come from, and the optimiser with layer-wise LR decay.

  Classifier          [B, num_labels] from the [CLS] state  (ElectraForSequenceClassification; 1 label: regression)
  TokenClassifier     [B, L, num_labels], one per piece      (ElectraForTokenClassification)
  QuestionAnswering   [B, L, 2]: start and end logits        (ElectraForQuestionAnswering, num_labels=2)

Each is built as MODELS[task.type](model_config, num_labels) and called as model(input_ids, segment_ids,
deterministic=...), float32 logits out."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from electra_jax import config as config_lib
from electra_jax import modeling, optim, sources, weights
from electra_jax import tokenizer as tokenizer_lib
from electra_jax.hf import convert as hf_convert


class ClassificationHead(nn.Module):
  """dropout → dense(H) → GELU → dropout → dense(num_labels), as HF's ElectraClassificationHead."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, h, *, deterministic: bool):
    c = self.config
    drop = modeling.Dropout(c.dropout_rate)
    h = drop(h, deterministic=deterministic)
    h = nn.gelu(modeling.dense(c, c.discriminator.hidden_size, ("hidden", "mlp"), "dense")(h),
                approximate=False)
    h = drop(h, deterministic=deterministic)
    return modeling.dense(c, self.num_labels, ("mlp", None), "out_proj")(h).astype(jnp.float32)


def _encode(config: modeling.ModelConfig, input_ids, segment_ids, deterministic: bool):
  """The discriminator's final hidden states, from submodule "electra" of the module whose compact call this is."""
  return modeling.Electra(config, name="electra").encode(input_ids, segment_ids, deterministic=deterministic)


class Classifier(nn.Module):
  """The discriminator's encoder ("electra") and the classification head ("classifier") on its [CLS] state."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    return ClassificationHead(self.config, self.num_labels, name="classifier")(h[:, 0], deterministic=deterministic)


class TokenClassifier(nn.Module):
  """The encoder, then dropout → dense(num_labels) ("classifier") at every position, as HF's
  ElectraForTokenClassification (its classifier_dropout is unset: the hidden dropout rate)."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    h = modeling.Dropout(self.config.dropout_rate)(h, deterministic=deterministic)
    return modeling.dense(self.config, self.num_labels, ("hidden", None), "classifier")(h).astype(jnp.float32)


class QuestionAnswering(nn.Module):
  """The encoder, then dense(2) ("qa_outputs") at every position, no dropout, as HF's ElectraForQuestionAnswering:
  [..., 0] the start logits, [..., 1] the end logits."""
  config: modeling.ModelConfig
  num_labels: int = 2

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    return modeling.dense(self.config, self.num_labels, ("hidden", None), "qa_outputs")(h).astype(jnp.float32)


MODELS = {"classification": Classifier, "regression": Classifier, "token_classification": TokenClassifier,
          "qa": QuestionAnswering}


def lr_multiplier(path, num_layers: int, decay: float) -> float:
  """Layer-wise LR decay as the official _get_layer_lrs: depth 0 for the embeddings (and their projection), i + 1
  for encoder layer i, L + 2 for the task head, and lr · decay^(L + 2 - depth): the embeddings decay^(L+2), layer i
  decay^(L+1-i), the head 1."""
  names = [getattr(k, "key", str(k)) for k in path]
  if "electra" not in names:
    return 1.0
  layer = [int(n[len("layer_"):]) for n in names if re.fullmatch(r"layer_\d+", n)]
  return decay ** (num_layers + 1 - layer[0] if layer else num_layers + 2)


def layerwise_lr_decay(num_layers: int, decay: float) -> optax.GradientTransformation:
  """Scales each parameter's update by lr_multiplier: after the optimiser, that is the per-layer learning rate
  (weight decay included, as in the official code)."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * lr_multiplier(p, num_layers, decay), updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def optimizer(train, num_steps: int, num_layers: int):
  """train.optimizer's recipe with a warm-up over train.warmup_fraction of num_steps, and layer-wise LR decay."""
  tx, schedule = optim.build(train, train.warmup_fraction * num_steps, num_steps)
  return optax.chain(tx, layerwise_lr_decay(num_layers, train.layer_decay)), schedule


def load_source(ft: ml_collections.ConfigDict, init: sources.Source | None, tokenizer: str, with_params: bool = True):
  """(pre-training config, its params or None) of a run's plan: init's (its architecture alone under random_init or
  without `with_params`: no checkpoint read), or for random init (None) config.model's sizes with `tokenizer`'s
  vocabulary."""
  if init is None:
    config = config_lib.base()
    config.model.update(ft.model.to_dict())
    config.data.update(vocab_size=tokenizer_lib.Tokenizer(tokenizer).vocab_size, tokenizer=tokenizer)
    return config, None
  source = weights.read(init, ft.init_step or None, with_params=with_params and not ft.random_init)
  return source.config, source.params


def encoder_params(mc: modeling.ModelConfig, params):
  """The discriminator's encoder in the Classifier's layout (its effective embeddings: gdes folded), from the
  parameters of the pre-training model `mc` describes."""
  d = hf_convert.network_params(mc, params, "discriminator")
  return {"embeddings": d["embeddings"], "discriminator": d["encoder"]}
