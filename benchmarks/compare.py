"""Ours (electra-bench) beside the HF-torch peer (eager and torch.compile) on one config, batch and sequence length.

  python benchmarks/compare.py --config=configs/small.py --config.train.batch_size=32 --config.data.seq_len=128 \
      --config.model.dtype=float32 [--rounds=3 --max_load=1.5 --steps=10 --skip_compiled]

Every other flag goes to both. The three run as subprocesses one after another, round after round (shared
machines drift: alternating spreads the noise over all three), and the table holds each one's median over the rounds,
then the ratios. With --max_load, each run first waits (up to 10 minutes) for the 1-minute load average to drop
below it; every run records the load it started at. --skip_compiled leaves out the torch.compile peer (the CPU
target is against eager, and compiling Small takes ~10 minutes on 2 cores). Ours runs with XLA_FLAGS unset (one CPU device, full optimisation), whatever the caller has.
"""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNNERS = {
    "ours": [sys.executable, "-m", "electra_jax.bench"],
    "peer eager": [sys.executable, str(ROOT / "benchmarks" / "peer_torch.py")],
    "peer torch.compile": [sys.executable, str(ROOT / "benchmarks" / "peer_torch.py"), "--compile"],
}


def wait_for_quiet(max_load: float, patience_s: float = 600):
  deadline = time.time() + patience_s
  while os.getloadavg()[0] >= max_load and time.time() < deadline:
    time.sleep(10)


def run_one(command: list[str]) -> dict:
  load = os.getloadavg()[0]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
  return dict(json.loads(out.stdout.strip().splitlines()[-1]), load_before=load)


def main(argv: list[str]):
  own_flags = ("--rounds=", "--max_load=", "--skip_compiled")
  own = dict((a[2:] + "=").split("=")[:2] for a in argv if a.startswith(own_flags))
  rounds, max_load = int(own.get("rounds", 3)), float(own.get("max_load", "inf"))
  args = [a for a in argv if not a.startswith(own_flags)]
  runners = {k: v for k, v in RUNNERS.items() if not ("skip_compiled" in own and "compile" in k)}
  runs = {name: [] for name in runners}
  for r in range(rounds):
    for name, command in runners.items():
      wait_for_quiet(max_load)
      runs[name].append(run_one(command + args))
      print(f"round {r + 1}/{rounds} {name}: {runs[name][-1]['tokens_per_sec']:.0f} tok/s "
            f"(load {runs[name][-1]['load_before']:.2f} before)", flush=True)
  median = {name: statistics.median(x["tokens_per_sec"] for x in rs) for name, rs in runs.items()}
  ours = runs["ours"][-1]
  print(f"\n{ours['config']}: batch {ours['batch']} x {ours['seq_len']} {ours['dtype']} on {ours['device']}, "
        f"median of {rounds} alternating rounds; 1-minute load average before each run "
        f"{min(x['load_before'] for rs in runs.values() for x in rs):.2f}–"
        f"{max(x['load_before'] for rs in runs.values() for x in rs):.2f}")
  print(f"{'':20s} {'tokens/s':>10s} {'step ms':>9s} {'ours ÷ it':>10s}  all rounds (tok/s)")
  for name, rs in runs.items():
    tps = median[name]
    each = ", ".join(f"{x['tokens_per_sec']:.0f}" for x in rs)
    print(f"{name:20s} {tps:10.0f} {ours['batch'] * ours['seq_len'] / tps * 1e3:9.1f} {median['ours'] / tps:10.2f}  {each}")
  print(json.dumps(dict(config=ours["config"], batch=ours["batch"], seq_len=ours["seq_len"], dtype=ours["dtype"],
                        rounds=rounds, tokens_per_sec=median,
                        ratio={name: median["ours"] / median[name] for name in runners if name != "ours"},
                        runs=runs)))


if __name__ == "__main__":
  main(sys.argv[1:])
