"""The fine-tuned model as an HF transformers directory, written whole or not at all, of the class its head makes it:
ElectraFor{SequenceClassification,TokenClassification,QuestionAnswering}, each loadable by its AutoModelFor* class."""
import jax
import numpy as np
from flax import traverse_util

from electra_jax.hf import convert as hf_convert
from electra_jax.hf import directory as hf_directory
from electra_jax.model import modeling
from electra_jax.runtime import storage


def architecture(params) -> str:
  """The HF class of a fine-tuned model's params, told by its head (finetune/model.py)."""
  if "qa_outputs" in params:
    return "ElectraForQuestionAnswering"
  return "ElectraForTokenClassification" if "kernel" in params["classifier"] else "ElectraForSequenceClassification"


def state_dict(model_config: modeling.ModelConfig, params) -> dict:
  """HF names → float32 arrays of a fine-tuned model's params: the encoder as hf/convert.py maps the discriminator
  (electra.*), each dense layer of the head under its own path, which our heads name as HF does."""
  encoder = params["electra"]
  out = hf_convert.to_hf_state_dict(
      model_config, dict(embeddings=encoder["embeddings"], discriminator=encoder["discriminator"]), "discriminator")
  head = traverse_util.flatten_dict(jax.device_get({k: v for k, v in params.items() if k != "electra"}))
  for path, value in head.items():
    value = np.asarray(value, np.float32)
    kernel = path[-1] == "kernel"  # Flax's [in, out] is torch's weight [out, in]
    out[".".join(path[:-1]) + (".weight" if kernel else ".bias")] = np.ascontiguousarray(value.T if kernel else value)
  return out


def save(model_config: modeling.ModelConfig, params, names: list[str] | None, tokenizer_path: str, pad_id: int,
         out: str):
  """Writes `out` (local or gs://) from process 0; `names` are the label (tag) names: None for regression and QA."""
  if jax.process_index() != 0:
    return
  kind = architecture(params)
  if kind == "ElectraForQuestionAnswering":
    labels = {}  # ElectraConfig's default num_labels=2: start and end
  elif names is None:
    labels = dict(num_labels=1, problem_type="regression")
  else:
    labels = dict(id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    if kind == "ElectraForSequenceClassification":
      labels["problem_type"] = "single_label_classification"
  with storage.staged_dir(out, last="config.json") as tmp:
    hf_directory.write_model(tmp, state_dict(model_config, params),
                             hf_convert.hf_config(model_config, "discriminator", pad_id, kind, **labels),
                             tokenizer_path, model_config.max_position_embeddings)
