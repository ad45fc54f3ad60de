"""Soak test of resuming: N random SIGKILLs and SIGTERMs during one tiny run, resumed each time by the same command,
compared step by step with an uninterrupted run. Not in the test suite (about 10-15 minutes on 2 CPU cores for N=20).

  python tests/soak.py --kills=20                       # configs/tiny.py, 120 steps, a checkpoint every 10
  python tests/soak.py --kills=5 --steps=60 --workdir=/tmp/soak

Each interruption waits until the run has logged a random step up to --checkpoint_every steps past the last one
logged, then a random 0-0.3 s more (so some land in an asynchronous save), and sends SIGKILL or SIGTERM at random. Passes when every
metrics.jsonl row (timing fields aside) and the final parameters, bitwise, equal the uninterrupted run's. Prints one
JSON line at the end; exits 1 on any difference.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests import pretrain_cli as cli  # pylint: disable=wrong-import-position

os.environ.setdefault("XLA_FLAGS", cli.xla_flags(8))

TIME_FIELDS = {"tokens_per_sec", "tflops_per_device", "mfu", "elapsed_s"}


def _rows(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in r.items() if k not in TIME_FIELDS} for r in map(json.loads, f) if "goodput" not in r]


def _wait_for_step(proc, workdir, step: int, timeout: float = 600) -> bool:
  """True once the run (training: its log shows the bar) has logged `step`; False if it exited first."""
  deadline = time.time() + timeout
  while proc.poll() is None:
    if "pre-training" in cli.log(proc) and step in cli.logged_steps(workdir):
      return True
    if time.time() > deadline:
      raise TimeoutError(f"step {step} not reached in {timeout} s: {cli.log(proc)[-2000:]}")
    time.sleep(0.02)
  return False


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--kills", type=int, default=20, help="interruptions (SIGKILL or SIGTERM, at random)")
  parser.add_argument("--steps", type=int, default=120)
  parser.add_argument("--checkpoint_every", type=int, default=10)
  parser.add_argument("--workdir", default="/tmp/electra_soak", help="data, both runs and their logs go here")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  from configs import tiny  # pylint: disable=g-import-not-at-top
  from electra_jax.run import weights
  from electra_jax.runtime import startup
  startup.initialize()
  config = tiny.get_config()
  config.data.data_dir = os.path.join(args.workdir, "data")
  os.makedirs(args.workdir, exist_ok=True)
  env = cli.env(**cli.compile_cache(os.path.join(args.workdir, "jax_cache")))
  subprocess.run([sys.executable, "-m", "electra_jax.prepare", "--config=configs/tiny.py",
                  f"--config.data.data_dir={config.data.data_dir}"], cwd=ROOT, env=env, check=True,
                 capture_output=True)
  flags = (f"--config.train.num_steps={args.steps}", f"--config.train.checkpoint_every={args.checkpoint_every}",
           "--config.train.log_every=1", "--config.train.eval_every=40", "--config.train.keep_checkpoints=2")

  t0 = time.time()
  reference, soaked = (os.path.join(args.workdir, name) for name in ("straight", "soaked"))
  for path in (reference, soaked):
    if os.path.exists(path):
      raise SystemExit(f"soak.py: error: {path} exists: use a new --workdir")
  out = cli.run(env, config, reference, *flags)
  if out.returncode:
    raise SystemExit(f"soak.py: error: the uninterrupted run failed: {out.stderr[-2000:]}")

  rng = np.random.default_rng(args.seed)
  events, unexpected = [], []
  while len(events) < args.kills:
    resumed = max(cli.logged_steps(soaked) or [0])
    target = int(min(resumed + rng.integers(1, args.checkpoint_every + 1), args.steps - 5))  # not past the end
    sig = signal.SIGKILL if rng.random() < 0.5 else signal.SIGTERM
    proc = cli.start(env, config, soaked, *flags)
    if not _wait_for_step(proc, soaked, target):
      unexpected.append(f"exited (rc={proc.returncode}) before step {target}: {cli.log(proc)[-500:]}")
      break
    time.sleep(rng.uniform(0, 0.3))
    at = max(cli.logged_steps(soaked))
    proc.send_signal(sig)
    rc = proc.wait(timeout=300)
    if rc != (0 if sig == signal.SIGTERM else -signal.SIGKILL):
      unexpected.append(f"{sig.name} at step {at} exited with {rc}: {cli.log(proc)[-500:]}")
    events.append(dict(signal=sig.name, step=at, rc=rc))
    print(f"{len(events):3d}. {sig.name} at step {at} (resumed at {resumed}), exit {rc}", flush=True)
  out = cli.run(env, config, soaked, *flags)
  if out.returncode:
    unexpected.append(f"the final resume failed: {out.stderr[-2000:]}")

  rows, ref_rows = _rows(soaked), _rows(reference)
  differing_rows = [r["step"] for r, q in zip(rows, ref_rows) if r != q]
  same_steps = [r["step"] for r in rows] == [r["step"] for r in ref_rows] == list(range(1, args.steps + 1))
  params = [_leaves(weights.load(w).params) for w in (soaked, reference)]
  differing_params = sum(not np.array_equal(a, b) for a, b in zip(*params))
  result = dict(kills=len(events), sigkill=sum(e["signal"] == "SIGKILL" for e in events),
                sigterm=sum(e["signal"] == "SIGTERM" for e in events), steps=args.steps, rows_compared=len(rows),
                every_step_once=same_steps, differing_rows=differing_rows, param_arrays=len(params[1]),
                differing_param_arrays=differing_params, unexpected=unexpected, events=events,
                minutes=round((time.time() - t0) / 60, 1))
  print(json.dumps(result))
  ok = same_steps and not differing_rows and not differing_params and not unexpected and len(events) == args.kills
  sys.exit(0 if ok else 1)


def _leaves(tree) -> list:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(jax.device_get(tree))


if __name__ == "__main__":
  main()
