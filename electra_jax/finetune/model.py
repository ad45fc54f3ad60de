"""The fine-tuned models, MODELS[task.type](model_config, num_labels)(input_ids, segment_ids, deterministic=...) ->
float32 logits: the discriminator's encoder ("electra") under a task head named as in HF transformers."""
import functools

import flax.linen as nn
import jax.numpy as jnp

from electra_jax.model import modeling


class ClassificationHead(nn.Module):
  """dropout → dense(H) → GELU → dropout → dense(num_labels), as HF's ElectraClassificationHead."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, h, *, deterministic: bool):
    c = self.config
    drop = modeling.Dropout(c.dropout_rate)
    h = drop(h, deterministic=deterministic)
    h = nn.gelu(modeling.dense(c, c.discriminator.hidden_size, ("hidden", "mlp"), "dense")(h), approximate=False)
    h = drop(h, deterministic=deterministic)
    return modeling.dense(c, self.num_labels, ("mlp", None), "out_proj")(h).astype(jnp.float32)


def _encode(config: modeling.ModelConfig, input_ids, segment_ids, deterministic: bool):
  """The discriminator's final hidden states, from submodule "electra" of the calling compact module."""
  return modeling.Electra(config, name="electra").encode(input_ids, segment_ids, deterministic=deterministic)


class Classifier(nn.Module):
  """[B, num_labels] logits (1: regression) of the head ("classifier") on [CLS], as ElectraForSequenceClassification."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    return ClassificationHead(self.config, self.num_labels, name="classifier")(h[:, 0], deterministic=deterministic)


class PerPiece(nn.Module):
  """[B, L, num_labels] logits of a dense layer (`head`) at every position, after dropout where `dropout`: HF's
  ElectraForTokenClassification ("classifier", its classifier_dropout unset: the hidden rate) and
  ElectraForQuestionAnswering ("qa_outputs", no dropout; [..., 0] the start logits, [..., 1] the end logits)."""
  config: modeling.ModelConfig
  num_labels: int = 2
  head: str = "classifier"
  dropout: bool = True

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    if self.dropout:
      h = modeling.Dropout(self.config.dropout_rate)(h, deterministic=deterministic)
    return modeling.dense(self.config, self.num_labels, ("hidden", None), self.head)(h).astype(jnp.float32)


TokenClassifier = PerPiece
QuestionAnswering = functools.partial(PerPiece, head="qa_outputs", dropout=False)
MODELS = {"classification": Classifier, "regression": Classifier, "token_classification": TokenClassifier,
          "qa": QuestionAnswering}

