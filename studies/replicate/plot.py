"""The report's figures, from results.json's content."""
import os
import statistics

from matplotlib.figure import Figure  # no pyplot: nothing is shown, and no global backend is set

from studies.replicate.report import LABELS, median
from studies.replicate.run import RANDOM, TFIDF


def plot(results: dict, directory: str) -> dict:
  """downstream.png (accuracy against pre-training FLOPs, a panel per task) and pretraining.png (the losses in
  metrics.jsonl against FLOPs); returns their paths."""
  os.makedirs(directory, exist_ok=True)
  objs, floors = results["objectives"], results["floors"]
  color = {n: f"C{i}" for i, n in enumerate(LABELS)}
  paths = {k: os.path.join(directory, f"{k}.png") for k in ("downstream", "pretraining")}

  tasks = list(floors[TFIDF])
  fig = Figure(figsize=(6 * len(tasks), 4.5))
  axes = fig.subplots(1, len(tasks), squeeze=False)
  for ax, task in zip(axes[0], tasks):
    for name, o in objs.items():
      acc = [[r["accuracy"] for r in c["runs"][task]] for c in o["checkpoints"]]
      mid = [statistics.median(a) for a in acc]
      ax.errorbar([c["flops"] for c in o["checkpoints"]], mid, fmt="o-", capsize=3, color=color.get(name),
                  label=LABELS.get(name, name),
                  yerr=[[m - min(a) for m, a in zip(mid, acc)], [max(a) - m for m, a in zip(mid, acc)]])
    for (label, runs), style in zip(((RANDOM, floors[RANDOM][task]), (TFIDF, floors[TFIDF][task])), ("--", ":")):
      ax.axhline(median(runs), color="gray", linestyle=style, label=label)
    ax.set(title=task, xlabel="pre-training FLOPs", ylabel="eval accuracy (median, min-max over seeds)")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(paths["downstream"], dpi=110)

  keys = [k for k in ("loss", "mlm_loss", "disc_loss")
          if any(p[k] is not None for o in objs.values() for p in o["curves"])]
  titles = dict(loss="total loss", mlm_loss="MLM loss (the generator's; BERT: its own)",
                disc_loss="discriminator loss (binary; MLM for Replace/All-Tokens)")
  fig = Figure(figsize=(5.5 * len(keys), 4.5))
  axes = fig.subplots(1, len(keys), squeeze=False)
  for ax, key in zip(axes[0], keys):
    for name, o in objs.items():
      # Two-stage logs disc_loss 0 while D is not trained yet (stage 1).
      points = [(p["flops"], p[key]) for p in o["curves"] if p[key]]
      if points:
        ax.plot(*zip(*points), color=color.get(name), label=LABELS.get(name, name))
    ax.set(title=titles[key], xlabel="pre-training FLOPs")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(paths["pretraining"], dpi=110)
  return paths
