"""The fine-tuned models, MODELS[task.type](model_config, num_labels)(input_ids, segment_ids, deterministic=...) ->
float32 logits: the discriminator's encoder ("electra") under a task head named as in HF transformers."""
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
    h = nn.gelu(modeling.dense(c, c.discriminator.hidden_size, ("hidden", "mlp"), "dense")(h),
                approximate=False)
    h = drop(h, deterministic=deterministic)
    return modeling.dense(c, self.num_labels, ("mlp", None), "out_proj")(h).astype(jnp.float32)


def _encode(config: modeling.ModelConfig, input_ids, segment_ids, deterministic: bool):
  """The discriminator's final hidden states, from submodule "electra" of the calling compact module."""
  return modeling.Electra(config, name="electra").encode(input_ids, segment_ids, deterministic=deterministic)


class Classifier(nn.Module):
  """[B, num_labels] logits (1: regression) of the classification head ("classifier") on the [CLS] state, as HF's
  ElectraForSequenceClassification."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    return ClassificationHead(self.config, self.num_labels, name="classifier")(h[:, 0], deterministic=deterministic)


class TokenClassifier(nn.Module):
  """[B, L, num_labels]: dropout → dense(num_labels) ("classifier") at every position, as HF's
  ElectraForTokenClassification (its classifier_dropout is unset: the hidden dropout rate)."""
  config: modeling.ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    h = modeling.Dropout(self.config.dropout_rate)(h, deterministic=deterministic)
    return modeling.dense(self.config, self.num_labels, ("hidden", None), "classifier")(h).astype(jnp.float32)


class QuestionAnswering(nn.Module):
  """[B, L, 2]: dense(2) ("qa_outputs") at every position, no dropout, as HF's ElectraForQuestionAnswering: [..., 0]
  the start logits, [..., 1] the end logits."""
  config: modeling.ModelConfig
  num_labels: int = 2

  @nn.compact
  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True):
    h = _encode(self.config, input_ids, segment_ids, deterministic)
    return modeling.dense(self.config, self.num_labels, ("hidden", None), "qa_outputs")(h).astype(jnp.float32)


MODELS = {"classification": Classifier, "regression": Classifier, "token_classification": TokenClassifier,
          "qa": QuestionAnswering}

