"""The study's runs, each skipped when already done: the floors, then every objective's pre-training and the fine-tuning
of its checkpoints, with a progress line and an ETA per run."""
import json
import os
import time

from studies import finetune_demo
from studies.replicate import plan
from electra_jax import finetune as finetune_lib
from electra_jax.data import prepared
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.pretrain import plan as plan_lib
from electra_jax.runtime import storage

TFIDF, RANDOM = "TF-IDF 1-2-gram + LR", "random init"  # the floors, as results["floors"] names them


def duration(seconds: float) -> str:
  if seconds < 90:
    return f"{seconds:.0f} s"
  if seconds < 5400:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


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
  if os.path.isdir(os.path.join(workdir, "checkpoints", str(config.train.num_steps))):
    plan_lib.resolve(config, workdir)  # this study's run, not another one's that reached the same step
    return False
  pretrain_loop.train_and_evaluate(config, workdir)
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
  c = finetune_demo.task_config(task, study.finetune_epochs, min_steps=study.finetune_min_steps)
  c.train.seed = seed
  c.init_from, c.init_step = init_from, init_step
  if not init_from:  # the same architecture and tokenizer, random weights
    c.model.update(study.pretrain.model.to_dict())
    c.tokenizer = prepared.tokenizer_path(study.pretrain)
  return c


def tfidf(task: str, workdir: str) -> dict:
  c = finetune_demo.task_config(task)

  def run():
    results = finetune_demo.tfidf_floor(c.task)
    # The two files a fine-tuning run leaves, put in place together, so that reuse_or_run finds this one too.
    with storage.staged_dir(workdir, last="eval_results.json") as tmp:
      storage.write(os.path.join(tmp, "config.json"), c.to_json_best_effort(indent=2))
      storage.write(os.path.join(tmp, "eval_results.json"), json.dumps(results, indent=2))
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
  results, reused = reuse_or_run(config, workdir, lambda: finetune_lib.finetune(config, workdir))
  progress.finetuned(what, results, reused)
  return results


def run_study(study, workdir: str, budget: float, configs: dict, flops: dict) -> dict:
  """Runs what `plan.plan` planned (what is done already is reused); returns what results.json holds."""
  tasks, seeds = plan.names(study.tasks), range(study.seeds)
  ckpts = {name: plan.checkpoint_steps(c) for name, c in configs.items()}
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
    flops_at = plan.flops_counter(c)
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
                                    for r in records if "goodput" not in r])  # not each session's time split
  return dict(scale=study.scale, budget_steps=study.budget_steps, budget_flops=budget, reference=plan.REFERENCE,
              objectives=objectives, floors=floors)
