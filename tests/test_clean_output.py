"""What a newcomer reads: electra-prepare and a few pre-training steps, in this install (libtpu present, as `make`
installs it) on a host without a TPU, print the project's lines (the dataset summary, the plan, the progress bar) and
none of libtpu's failed start or the libraries' chatter; --verbosity=1 brings the libraries' lines back; no log line
lands on a running progress bar's line."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from electra_jax.runtime import console
from tests import pretrain_cli

ROOT = pathlib.Path(pretrain_cli.ROOT)
# libtpu's failed start where there is no TPU, and the libraries' lines a run prints at every start.
LIBTPU = ("Failed to find host bounds", "TPU_WORKER_HOSTNAMES", "No jellyfish device found",
          "Unable to initialize backend 'tpu'")
CHATTER = ("Downloading and preparing dataset", "downloaded and prepared to", "Using custom data configuration",
           "Type handler registry")
LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ (\S+):\d+\]", re.MULTILINE)
OWN_FILES = {p.name for d in ("electra_jax", "studies") for p in (ROOT / d).rglob("*.py")}
FLAGS = ["--config=configs/tiny.py", "--config.data.max_documents=10"]


def run(module: str, *flags) -> str:
  """stdout and stderr of `python -m module` as a newcomer's shell runs it: no JAX_PLATFORMS, TF_CPP_* or TPU_*."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PLATFORMS", "TF_CPP_", "TPU_"))}
  result = subprocess.run([sys.executable, "-m", module, *FLAGS, *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout + result.stderr


def prepare_and_pretrain(tmp_path: pathlib.Path, *flags) -> tuple[str, str]:
  data = f"--config.data.data_dir={tmp_path / 'data'}"
  prepared = run("electra_jax.prepare", data, *flags)
  trained = run("electra_jax.pretrain", data, f"--workdir={tmp_path / 'run'}", "--config.train.num_steps=4",
                "--config.train.log_every=2", "--config.train.eval_every=2", "--config.train.eval_batches=1", *flags)
  return prepared, trained


@pytest.fixture(scope="module", autouse=True)
def no_tpu_here():
  assert importlib.util.find_spec("libtpu"), "libtpu is not installed: `make test` installs it (the tpu extra)"
  if console.accelerator_attached():
    pytest.skip("this host has a TPU or a GPU: the test needs one without")


@pytest.mark.slow
def test_a_first_run_prints_the_projects_lines_only(tmp_path):
  prepared, trained = prepare_and_pretrain(tmp_path)
  for text in (prepared, trained):
    assert not [line for line in LIBTPU + CHATTER if line in text], text[-3000:]
    assert {name for name in LOG_LINE.findall(text)} <= OWN_FILES, text[-3000:]  # no library's INFO line
  assert "train: " in prepared and "examples of 64" in prepared  # the dataset summary
  assert "The run's plan" in trained and "pre-training: 100%" in trained and "Time of this pre-training run" in trained


@pytest.mark.slow
def test_verbosity_1_brings_the_libraries_lines_back_off_the_progress_bar(tmp_path):
  prepared, trained = prepare_and_pretrain(tmp_path, "--verbosity=1")
  assert "Downloading and preparing dataset" in prepared and "Using custom data configuration" in prepared
  assert "Type handler registry" in trained and "dataset_info.py" in trained  # TFDS's INFO at every evaluation
  assert not [line for line in LIBTPU if line in trained]  # still no TPU start-up: that is not chatter
  # A log line starts a line of its own while the bar runs: the bar is cleared (\r) before it and drawn again after.
  # (Not checked at the bar's last draw: tqdm forgets a closing bar before drawing it a last time, so a line that
  # another thread logs just then, Orbax's at --verbosity=1, can follow it.)
  running = trained[:trained.index("100%|")]
  assert "pre-training: " in running and not re.search(r"[^\r\n][IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]", running)


@pytest.mark.parametrize("given, imported, expected", [(None, "", "cpu"), (None, "import jax; ", "cpu"),
                                                       ("", "", ""), ("tpu", "", "tpu")])
def test_without_a_tpu_jax_starts_on_the_cpu_unless_the_user_says_otherwise(given, imported, expected):
  """JAX_PLATFORMS=cpu before JAX starts (in its config too when it is imported already), and a JAX_PLATFORMS of the
  user's, empty included (JAX chooses), kept."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  env.update({} if given is None else {"JAX_PLATFORMS": given})
  show = "jax.config.jax_platforms" if imported else "os.environ['JAX_PLATFORMS']"
  out = subprocess.run([sys.executable, "-c", f"import os; {imported}from electra_jax.runtime import console; "
                        f"console.choose_platforms(); print(repr({show}))"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120, check=True).stdout
  assert out.strip() == repr(expected)

