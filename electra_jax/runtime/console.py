"""What a command shows its user (console.start): no TPU start-up where there is no TPU, log lines apart from the
progress bars, and unless --verbosity is given only the project's lines and the libraries' warnings but CHATTER."""
import glob
import importlib.util
import logging as std_logging
import os
import sys

from absl import flags, logging

from electra_jax.runtime import storage

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # electra_jax/, above runtime/
# The project's code beside the package, run from a checkout (`make demo` runs studies/).
OWN_DIRS = (PACKAGE, *(os.path.join(os.path.dirname(PACKAGE), d)
                       for d in ("configs", "studies", "benchmarks", "launch", "tests")))
# Prefixes of library warnings every run logs that ask nothing of the user (Orbax's, TFDS's).
CHATTER = ("Type handler registry", "Using custom data configuration")
# What a GPU's driver creates (NVIDIA's, as JAX checks them, WSL's and AMD's).
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
GOOGLE_PCI_VENDOR = "0x1ae0"


def accelerator_attached() -> bool:
  """Whether this host has a TPU (/dev/accel*, VFIO groups, a Google PCI device but a NIC or disk) or a GPU."""
  vfio_groups = [p for p in glob.glob("/dev/vfio/*") if os.path.basename(p) != "vfio"]
  google_pci_classes = [storage.read_local(os.path.join(os.path.dirname(vendor), "class"))
                        for vendor in glob.glob("/sys/bus/pci/devices/*/vendor")
                        if storage.read_local(vendor) == GOOGLE_PCI_VENDOR]
  return bool(glob.glob("/dev/accel*") or vfio_groups or any(os.path.exists(p) for p in GPU_DEVICE_FILES) or
              any(not c.startswith(("0x01", "0x02")) for c in google_pci_classes))


def choose_platforms():
  """JAX_PLATFORMS=cpu where libtpu or the CUDA plugin is installed (for electra-compile) but no TPU or GPU is
  attached, lest JAX print their failed start; the user's JAX_PLATFORMS wins. Call before anything starts JAX."""
  if ("JAX_PLATFORMS" in os.environ or accelerator_attached() or
      not any(importlib.util.find_spec(m) for m in ("libtpu", "jax_cuda12_plugin"))):
    return
  os.environ["JAX_PLATFORMS"] = "cpu"  # read when jax is imported; the programs this one starts inherit it
  jax = sys.modules.get("jax")
  if jax is not None and not jax.config.jax_platforms:  # imported already: it read the environment then
    jax.config.update("jax_platforms", "cpu")


def own(path: str) -> bool:
  return os.path.abspath(path).startswith(tuple(d + os.sep for d in OWN_DIRS))


def _project_voice(record: std_logging.LogRecord) -> bool:
  """A log filter: the project's lines, and the libraries' warnings and errors but CHATTER."""
  return own(record.pathname) or (record.levelno >= std_logging.WARNING and not str(record.msg).startswith(CHATTER))


def _downloads_only(announce):
  """TFDS's "Downloading and preparing dataset ..." lines, for a real download only (not electra-prepare's)."""
  def announce_downloads(builder):
    if builder.info.download_size:
      announce(builder)
  return announce_downloads


def _between_bars(emit):
  """absl's emit, with the progress bars cleared first and drawn again after: a log line gets a line of its own."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  def emit_between_bars(record):
    with tqdm.external_write_mode(file=sys.stderr):
      emit(record)
  return emit_between_bars


def _wrap_once(owner, name: str, wrap):
  """owner.<name> = wrap(owner.<name>), where it exists and no earlier start() wrapped it."""
  old = getattr(owner, name, None)
  if old is not None and not getattr(old, "electra_jax_wrapped", False):
    setattr(owner, name, wrap(old))
    getattr(owner, name).electra_jax_wrapped = True


def start():
  """What a command calls once its flags are parsed, before its work."""
  choose_platforms()
  handler = logging.get_absl_handler()
  # python_handler: what ABSLHandler.handle hands a record to, once it passed the filters.
  _wrap_once(handler.python_handler, "emit", _between_bars)
  if flags.FLAGS["verbosity"].present:
    handler.removeFilter(_project_voice)
  else:
    handler.addFilter(_project_voice)
    if importlib.util.find_spec("tensorflow_datasets") is not None:
      from tensorflow_datasets.core import dataset_builder  # pylint: disable=g-import-not-at-top
      for name in ("_log_download_bytes", "_log_download_done"):
        _wrap_once(dataset_builder.DatasetBuilder, name, _downloads_only)
