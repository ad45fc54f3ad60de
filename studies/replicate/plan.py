"""The plan: every objective of the study gets the FLOPs of budget_steps steps of REFERENCE, so round(budget / its step
FLOPs) steps, a fixed fraction of them as warm-up, and num_checkpoints checkpoints to fine-tune."""
import copy
import json
import math

from electra_jax.model import objectives
from electra_jax.model import flops as flops_lib

REFERENCE = "electra"  # budget_steps counts steps of this objective


def names(csv: str) -> list[str]:
  return [n.strip() for n in csv.split(",") if n.strip()]


def objective_config(study, name: str):
  """study.pretrain with objective `name` and the settings it needs (study.objective_overrides)."""
  objectives.get(name)  # an unknown name fails here, in one line
  c = copy.deepcopy(study.pretrain)
  c.objective.name = name
  if name in study.objective_overrides:
    c.update(study.objective_overrides[name].to_dict())
  return c


def flops_counter(config):
  """step -> FLOPs of a run's first `step` steps. Two-stage's step_flops is the mean over its stages (G alone, then G's
  forward and D), so its checkpoints along the way are placed with each stage's own cost."""
  if config.objective.name != "two_stage":
    per_step = flops_lib.step_flops(config)
    return lambda step: step * per_step
  switch = objectives.ObjectiveConfig.from_config(config).switch_step
  stage1, stage2 = flops_lib.step_flops(config, 1.0), flops_lib.step_flops(config, 0.0)
  return lambda step: min(step, switch) * stage1 + max(0, step - switch) * stage2


def plan(study) -> tuple[float, dict, dict]:
  """(the FLOP budget, {objective: its pre-training config at that budget}, {objective: FLOPs of one step})."""
  budget = study.budget_steps * flops_lib.step_flops(objective_config(study, REFERENCE))
  configs, flops = {}, {}
  for name in names(study.objectives):
    c = objective_config(study, name)
    flops[name] = flops_lib.step_flops(c)
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


def print_plan(study, budget: float, configs: dict, flops: dict):
  print(f"Budget: {budget:.4g} FLOPs = {study.budget_steps} steps of {REFERENCE}", flush=True)
  for name, c in configs.items():
    print(json.dumps(dict(objective=name, num_steps=c.train.num_steps, warmup_steps=c.train.warmup_steps,
                          step_flops=flops[name], flops=flops_counter(c)(c.train.num_steps),
                          checkpoints=checkpoint_steps(c))), flush=True)
