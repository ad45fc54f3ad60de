"""The paper's fine-tuning protocol: one config run for every (learning rate, seed), the rate chosen on the dev fold,
the eval split reported at that rate as the median (min-max) over seeds, as ELECTRA reports GLUE (median of several
seeds). `electra-finetune --seeds=0,1,2 --learning_rates=1e-4,3e-4` runs it.

The rate chosen is the one whose runs' selected models score best on the dev fold (median over seeds of task.metric);
the eval split never chooses anything. Each run is an ordinary fine-tuning workdir, WORKDIR/lr<rate>/seed<seed>, so an
interrupted protocol resumes run by run. WORKDIR receives protocol.json (every run's results, the rate chosen, the
summary), protocol.md (the table) and dev_curves.png (the dev metric of every run over its steps).
"""
import io
import json
import statistics

import jax

import ml_collections
from absl import logging
from etils import epath

from electra_jax import packages, storage
from electra_jax.finetune import loop, plan as plan_lib

SUMMARY_FILE = "protocol.json"
TABLE_FILE = "protocol.md"
CURVES_FILE = "dev_curves.png"


def run_dir(workdir: str, rate: float, seed: int) -> str:
  return f"{workdir}/lr{rate:g}/seed{seed}"


def check(ft: ml_collections.ConfigDict, seeds: list[int], rates: list[float]):
  if not seeds or not rates:
    raise ValueError("the protocol needs at least one seed and one learning rate")
  if len(rates) > 1 and not ft.task.dev_fraction:
    raise ValueError("choosing among learning rates needs a dev fold: set task.dev_fraction > 0")
  if min(rates) < 0:
    raise ValueError(f"learning rates must be positive (0: the encoder size's), not {min(rates):g}")
  packages.require("matplotlib", "the protocol's dev-curve plot")


def spread(values: list[float]) -> dict:
  return dict(median=statistics.median(values), min=min(values), max=max(values))


def summarize(runs: dict[float, list[dict]], metric: str) -> dict:
  """The rate chosen on dev (the best median over seeds of the selected models' dev `metric`; without a dev fold the
  only rate) and, per rate, the dev median and every eval metric's median, min and max over seeds."""
  by_rate = {}
  for rate, results in runs.items():
    names = [k for k, v in results[0].items() if k in results[0].get("eval_metrics", ())]
    by_rate[rate] = dict(dev=statistics.median(r["dev"][metric] for r in results) if "dev" in results[0] else None,
                         eval={k: spread([r[k] for r in results]) for k in names})
  chosen = max(by_rate, key=lambda rate: -1.0 if by_rate[rate]["dev"] is None else by_rate[rate]["dev"])
  return dict(metric=metric, chosen_rate=chosen, eval=by_rate[chosen]["eval"], by_rate=by_rate)


def table(summary: dict, seeds: list[int]) -> str:
  names = list(summary["eval"])
  show = lambda s: f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})" if len(seeds) > 1 else f"{s['median']:.3f}"
  lines = [f"| learning rate | dev {summary['metric']} (median) | " + " | ".join(f"eval {n}" for n in names) + " |",
           "|---" * (2 + len(names)) + "|"]
  for rate, row in summary["by_rate"].items():
    mark = " (chosen)" if rate == summary["chosen_rate"] else ""
    dev = "—" if row["dev"] is None else f"{row['dev']:.3f}"
    lines.append(f"| {rate:g}{mark} | {dev} | " + " | ".join(show(row["eval"][n]) for n in names) + " |")
  return "\n".join(lines) + f"\n\nSeeds: {', '.join(map(str, seeds))}; cells: median (min-max) over seeds.\n"


def plot_curves(runs: dict[str, list[dict]], metric: str, path: epath.Path):
  """Each run's dev `metric` over its steps, one colour per key of `runs` (its label), one line per run."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (label, results) in enumerate(runs.items()):
    for j, r in enumerate(results):
      history = [h for h in r.get("history", []) if "dev" in h]
      ax.plot([h["step"] for h in history], [h["dev"][metric] for h in history], color=f"C{i}", alpha=0.7,
              label=label if j == 0 else None)
  ax.set(xlabel="fine-tuning step", ylabel=f"dev {metric}", title="dev fold over training, one line per seed")
  ax.grid(alpha=0.3)
  ax.legend()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=90, bbox_inches="tight")
  plt.close(fig)
  storage.write(path, png.getvalue())


def _run_config(ft: ml_collections.ConfigDict, rate: float, seed: int) -> ml_collections.ConfigDict:
  c = ft.copy_and_resolve_references()
  c.train.update(learning_rate=rate, seed=seed)
  return c


def run(ft: ml_collections.ConfigDict, workdir: str, seeds: list[int], rates: list[float]) -> dict | None:
  """Fine-tunes `ft` at every rate and seed (resuming runs already there); returns the summary (also written to
  WORKDIR), or None when a signal stopped a run (run the same command again to go on)."""
  check(ft, seeds, rates)
  plans = [plan_lib.resolve(_run_config(ft, rate, seed), run_dir(workdir, rate, seed)) for rate in rates
           for seed in seeds]  # every run's, before the first is built
  runs = {}
  for plan in plans:
    logging.info("Protocol: learning rate %s, seed %d\n%s", f"{plan.ft.train.learning_rate:g}" if
                 plan.ft.train.learning_rate else "by the width", plan.ft.train.seed, plan.describe())
    results = loop.train(plan)
    if results is None:
      return None
    runs.setdefault(results["learning_rate"], []).append(results)  # as resolved: 0 is the width's rate
  metric = next(iter(runs.values()))[0]["metric"]
  summary = dict(summarize(runs, metric), seeds=seeds, runs={f"{rate:g}": r for rate, r in runs.items()})
  if jax.process_index() == 0:
    out = epath.Path(workdir)
    storage.write(out / SUMMARY_FILE, json.dumps(summary, indent=2))
    storage.write(out / TABLE_FILE, table(summary, seeds))
    plot_curves({f"lr {rate:g}": r for rate, r in runs.items()}, metric, out / CURVES_FILE)
  logging.info("Protocol: learning rate %g chosen on dev; eval %s", summary["chosen_rate"],
               {k: round(v["median"], 4) for k, v in summary["eval"].items()})
  return summary
