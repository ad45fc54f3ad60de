"""Fine-tuning the discriminator on a classification, regression, sentence-pair, token classification (NER-style) or
extractive QA task (`electra-finetune`). May import cli, run/ and the layers below; never pretrain/.

  config.py                     the config schema (base_config)
  tasks.py, token_tasks.py, qa.py  each task kind's data, encoding and metrics
  heads.py, model.py, hf_heads.py  each task type's Head: its model, loss, metrics, predictions and best/'s HF class
  plan.py                       what a run is, decided once at its entrance (workdir, weights, tokenizer)
  protocol.py                   one run, or the paper's protocol (seeds × learning rates, the rate chosen on dev)
  experiment.py                 what a config compiles: weights, splits, model, optimiser, the jitted steps
  loop.py                       restore or init, evaluation, model selection, the results
"""
import importlib

# name -> its module, imported on first use (PEP 562): a config file's import loads no model stack.
_EXPORTS = {"base_config": "config", "finetune": "loop", "carve": "tasks", "compute_metrics": "tasks",
            "label_sort_key": "tasks", "load_rows": "tasks"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
