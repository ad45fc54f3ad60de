"""Fine-tuning the discriminator on a classification, regression, sentence-pair, token classification (NER-style) or
extractive QA task (`electra-finetune`); the twin of pretrain/. May import cli, run/ and the layers below; never
pretrain/.

  plan.py, experiment.py, loop.py   as pretrain/'s; protocol.py: one run, or the paper's seeds × learning rates
  tasks.py, token_tasks.py, qa.py   each task kind's data, encoding and metrics
  heads.py, model.py, hf_heads.py   each task type's Head: its model, loss, metrics, predictions and best/'s HF class
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
