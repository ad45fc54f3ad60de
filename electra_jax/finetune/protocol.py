"""electra-finetune's runs: one, or the paper's protocol: a run (workdir WORKDIR/lr<rate>/seed<seed>) for every
(learning rate, seed), the rate chosen on the dev fold and the eval split reported at it as the median (min-max) over
seeds (docs/finetuning.md, "The paper's protocol: seeds × learning rates")."""
import io
import json
import statistics

import jax
import ml_collections
from absl import logging
from etils import epath

from electra_jax.finetune import loop
from electra_jax.finetune import plan as plan_lib
from electra_jax.runtime import packages, storage

SUMMARY_FILE = "protocol.json"
TABLE_FILE = "protocol.md"
CURVES_FILE = "dev_curves.png"


def check(ft: ml_collections.ConfigDict, seeds: list[int], rates: list[float]):
  if not seeds or not rates:
    raise ValueError("the protocol needs at least one seed and one learning rate")
  if len(rates) > 1 and not ft.task.dev_fraction:
    raise ValueError("choosing among learning rates needs a dev fold: set task.dev_fraction > 0")
  if min(rates) < 0:
    raise ValueError(f"learning rates must be positive (0: the encoder size's), not {min(rates):g}")
  packages.require("matplotlib", "the protocol's dev-curve plot")


def summarize(runs: dict[float, list[dict]], metric: str) -> dict:
  """The rate chosen on dev (the best median over seeds of the selected models' dev `metric`; without a dev fold the
  only rate) and, per rate, the dev median and every eval metric's median, min and max over seeds."""
  spread = lambda values: dict(median=statistics.median(values), min=min(values), max=max(values))
  by_rate = {}
  for rate, results in runs.items():
    names = [k for k, v in results[0].items() if k in results[0].get("eval_metrics", ())]
    by_rate[rate] = dict(dev=statistics.median(r["dev"][metric] for r in results) if "dev" in results[0] else None,
                         eval={k: spread([r[k] for r in results]) for k in names})
  chosen = max(by_rate, key=lambda rate: -1.0 if by_rate[rate]["dev"] is None else by_rate[rate]["dev"])
  return dict(metric=metric, chosen_rate=chosen, eval=by_rate[chosen]["eval"], by_rate=by_rate)


def table(summary: dict) -> str:
  names, seeds = list(summary["eval"]), summary["seeds"]
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


def run(ft: ml_collections.ConfigDict, workdir: str, seeds: list[int], rates: list[float]) -> dict | None:
  """Fine-tunes `ft` once in `workdir` and returns its results; or, with `seeds` or `rates`, at every rate and seed
  (every plan resolved before the first run) and returns the protocol's summary. None when a signal stopped a run."""
  protocol = bool(seeds or rates)
  seeds, rates = seeds or [ft.train.seed], rates or [ft.train.learning_rate]
  if protocol:
    check(ft, seeds, rates)
  plans = [plan_lib.resolve(ft, f"{workdir}/lr{rate:g}/seed{seed}" if protocol else workdir, rate, seed)
           for rate in rates for seed in seeds]
  by_rate = {}
  for plan in plans:
    rate = plan.ft.train.learning_rate
    logging.info("%s%s", f"Protocol: learning rate {f'{rate:g}' if rate else 'by the width'}, seed "
                 f"{plan.ft.train.seed}\n" if protocol else "", plan.describe())
    results = loop.train(plan)
    if results is None or not protocol:
      return results
    by_rate.setdefault(results["learning_rate"], []).append(results)  # as resolved: 0 is the width's rate
  metric = next(iter(by_rate.values()))[0]["metric"]
  summary = dict(summarize(by_rate, metric), seeds=seeds, runs={f"{rate:g}": r for rate, r in by_rate.items()})
  if jax.process_index() == 0:
    out = epath.Path(workdir)
    storage.write(out / SUMMARY_FILE, json.dumps(summary, indent=2))
    storage.write(out / TABLE_FILE, table(summary))
    plot_curves({f"lr {rate:g}": r for rate, r in by_rate.items()}, metric, out / CURVES_FILE)
  logging.info("Protocol: learning rate %g chosen on dev; eval %s", summary["chosen_rate"],
               {k: round(v["median"], 4) for k, v in summary["eval"].items()})
  return summary
