"""The fine-tuned model as an HF transformers directory that AutoModelForSequenceClassification loads: an
ElectraForSequenceClassification's model.safetensors and config.json (num_labels, id2label/label2id from our label
names, problem_type) and the tokenizer (hf/tokenizer.py). Written whole or not at all (storage.staged_dir)."""
import os

import jax

from electra_jax import modeling, storage
from electra_jax.hf import convert as hf_convert
from electra_jax.hf import directory as hf_directory
from electra_jax.hf import tokenizer as hf_tokenizer

# The head's two dense layers have the places of the discriminator head's in hf/convert.py's mapping.
_HEAD_NAMES = {"discriminator_predictions.dense.": "classifier.dense.",
               "discriminator_predictions.dense_prediction.": "classifier.out_proj."}


def state_dict(model_config: modeling.ModelConfig, params) -> dict:
  """HF names → float32 arrays of a Classifier's params (model_config: its shared-embedding config): the encoder as
  hf/convert.py maps the discriminator (electra.*), the head as classifier.dense / classifier.out_proj."""
  head = params["classifier"]
  as_pretraining = dict(embeddings=params["electra"]["embeddings"], discriminator=params["electra"]["discriminator"],
                        discriminator_head=dict(dense=head["dense"], dense_prediction=head["out_proj"]))
  out = {}
  for name, value in hf_convert.to_hf_state_dict(model_config, as_pretraining, "discriminator").items():
    prefix = next((p for p in _HEAD_NAMES if name.startswith(p)), None)
    out[_HEAD_NAMES[prefix] + name[len(prefix):] if prefix else name] = value
  return out


def save(model_config: modeling.ModelConfig, params, names: list[str] | None, tokenizer_path: str, pad_id: int,
         out: str):
  """Writes `out` (local or gs://) from process 0; `names` are the label names, None for regression."""
  if jax.process_index() != 0:
    return
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  labels = (dict(num_labels=1, problem_type="regression") if names is None else
            dict(id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
                 problem_type="single_label_classification"))
  with storage.staged_dir(out, last="config.json") as tmp:
    save_file(state_dict(model_config, params), os.path.join(tmp, hf_directory.WEIGHTS_FILE),
              metadata={"format": "pt"})
    config = hf_convert.hf_config(model_config, "discriminator", pad_id, **labels)
    config.architectures = ["ElectraForSequenceClassification"]
    config.save_pretrained(tmp)
    hf_tokenizer.save_tokenizer(tokenizer_path, tmp, model_config.max_position_embeddings)
