"""What a fine-tuning run is, decided once at its entrance before anything is built or written (and never again):
the weights it starts from, its tokenizer, and whether its workdir is new, resumed or replaced. Printed at the start,
written to WORKDIR/plan.json."""
import dataclasses
import os

import ml_collections

from electra_jax import config as config_lib
from electra_jax.finetune import config as ft_config
from electra_jax.run import checkpoints, sources
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import storage


@dataclasses.dataclass(frozen=True)
class Plan:
  ft: ml_collections.ConfigDict
  workdir: str  # absolute
  init: sources.Source | None  # init_from's weights (or, with random_init, its architecture); None: random init
  tokenizer: str  # config.tokenizer, else init_from's
  replace: bool  # the workdir holds another run, emptied first (--config.overwrite)
  resume_step: int | None  # the workdir's newest checkpoint, which the run resumes from; None: a fresh start

  def start(self) -> str:
    if self.resume_step is not None:
      return f"resume from the workdir's newest checkpoint, step {self.resume_step}"
    ft = self.ft
    if not ft.init_from:
      return f"random init from train.seed={ft.train.seed}"
    what = "its architecture, random weights" if ft.random_init else (
        f"its encoder{f' at step {ft.init_step}' if ft.init_step else ''}")
    return f"init_from {ft.init_from}: {what}; train.seed={ft.train.seed}"

  def describe(self) -> str:
    workdir = "replaced (--config.overwrite)" if self.replace else "resumed" if self.resume_step is not None else "new"
    return "\n".join([f"The run's plan (plan.json; the workdir {workdir}):",
                      f"  task: {self.ft.task.name or self.ft.task.tfds_name or self.ft.task.train_file}",
                      f"  tokenizer: {self.tokenizer or 'none'}",
                      f"  start: {self.start()}"])

  def record(self) -> dict:
    """What plan.json says of it (workdir.write_plan, once every check has passed)."""
    return dict(tokenizer=self.tokenizer, replaced=self.replace, resume_step=self.resume_step, start=self.start())


def resolve(ft: ml_collections.ConfigDict, workdir: str, learning_rate: float | None = None,
            seed: int | None = None) -> Plan:
  """The plan of fine-tuning `ft` in `workdir` (at the protocol's `learning_rate` and `seed` where given); a one-line
  error on a bad config or a workdir it may not write: unwritable, another config's run (unless ft.overwrite), or
  one that is, holds or lies inside what the run reads."""
  ft = ft.copy_and_resolve_references()
  ft.train.update(learning_rate=ft.train.learning_rate if learning_rate is None else learning_rate,
                  seed=ft.train.seed if seed is None else seed)
  if ft.train.eval_every < 0:
    raise ValueError(f"train.eval_every={ft.train.eval_every} must be 0 (per epoch or at the end) or positive")
  if not (ft.init_from or ft.tokenizer):
    raise ValueError("random init (empty init_from) needs --config.tokenizer=<.model or vocab.txt>")
  init = sources.resolve(ft.init_from) if ft.init_from else None
  task = ft.task
  reads = [*(init.inputs if init else ()), *([(ft.tokenizer, "config.tokenizer")] if ft.tokenizer else []),
           *((task[k], f"task.{k}") for k in ("train_file", "eval_file", "test_file") if task[k]),
           *([(task.tfds_data_dir, "task.tfds_data_dir")] if task.tfds_name and task.tfds_data_dir else [])]
  storage.refuse_overlap(workdir, reads, "--workdir")
  workdir_lib.check_writable(workdir)
  saved = workdir_lib.saved_config(workdir, ft_config.base_config)
  changes = config_lib.changes(saved, ft) if saved else None
  other = (f"holds another run (its config.json differs: {'; '.join(changes)})" if changes else None) if saved else (
      f"holds files but no {os.path.join(workdir, 'config.json')}" if workdir_lib.holds_files(workdir) else None)
  config_lib.check_counts(ft.train, "batch_size", "eval_batch_size")
  if other and not ft.overwrite:
    raise FileExistsError(f"workdir {workdir} {other}; pass --config.overwrite=true to replace it")
  return Plan(ft, storage.absolute(workdir), init, ft.tokenizer or (init.tokenizer if init else ""), bool(other),
              None if other else checkpoints.latest_step(workdir))

