"""What a pre-training run is, decided once at its entrance before anything is built or written: the prepared data
and tokenizer, whether the workdir resumes (from which step) or starts fresh (from which weights), and what differs
from the workdir's config. Nothing later decides them again; printed at start and written to WORKDIR/plan.json."""
import dataclasses

import ml_collections
from absl import logging

from electra_jax import config as config_lib
from electra_jax.data import prepared as prepared_lib
from electra_jax.run import checkpoints, sources
from electra_jax.run import workdir as workdir_lib
from electra_jax.runtime import storage


@dataclasses.dataclass(frozen=True)
class Start:
  """Where the run's state comes from (the defaults: fresh, from random init)."""
  resume_step: int | None = None  # the workdir's newest checkpoint, which the run resumes from; None: a fresh start
  init: sources.Source | None = None  # a fresh start's weights (train.init_from, init_from_generator); None: random
  with_state: bool = False  # init's optimiser state and step too (train.init_from_state: a second phase)

  def describe(self, seed: int) -> str:
    if self.resume_step is not None:
      return f"resume from the workdir's newest checkpoint, step {self.resume_step}"
    if self.with_state:
      return f"init_from {self.init.path}: its parameters, optimiser state and step"
    if self.init:
      generator = f" (generator: {self.init.generator})" if self.init.generator else ""
      return f"init_from {self.init.path}: its weights{generator}, a fresh optimiser from train.seed={seed}"
    return f"fresh, random init from train.seed={seed}"

  def record(self) -> dict:
    """What plan.json says of it."""
    return dict(resume_step=self.resume_step, init_from=self.init.path if self.init else "",
                generator=self.init.generator if self.init else "", with_state=self.with_state)


@dataclasses.dataclass(frozen=True)
class Plan:
  config: ml_collections.ConfigDict  # resolved: data.* as the data was prepared, the tokenizer it was prepared with
  workdir: str  # absolute
  data: prepared_lib.PreparedData
  start: Start
  changes: tuple[str, ...] | None  # what differs from the workdir's config.json (--allow_config_change); None: none

  def describe(self) -> str:
    config = ("a new workdir" if self.changes is None else
              f"changed since config.json: {'; '.join(self.changes)}" if self.changes else "as config.json saved it")
    return "\n".join(["The run's plan (plan.json):",
                      f"  data: {self.data.dataset_dir}",
                      f"  tokenizer: {self.data.tokenizer_path} ({self.data.vocab_size} ids)",
                      f"  start: {self.start.describe(self.config.train.seed)}",
                      f"  train to step {self.config.train.num_steps}; config: {config}"])

  def write(self):
    """<workdir>/config.json and plan.json (process 0): once every check has passed."""
    workdir_lib.write_plan(self.workdir, self.config, dict(
        data=self.data.dataset_dir, tokenizer=self.data.tokenizer_path, vocab_size=self.data.vocab_size,
        start=self.start.record(), num_steps=self.config.train.num_steps, changes=self.changes))


def resolve(config: ml_collections.ConfigDict, workdir: str, allow_config_change: bool = False) -> Plan:
  """The plan of pre-training `config` in `workdir`, or a one-line ValueError/OSError on bad input before anything is
  written (another run's workdir, unless `allow_config_change`)."""
  train = config.train
  resume_step = checkpoints.latest_step(workdir)
  config, init = sources.init_source(config, resuming=resume_step is not None)
  config, data = prepared_lib.find(config)
  workdir_lib.check_writable(workdir)
  saved = workdir_lib.saved_config(workdir)
  changes = None if saved is None else config_lib.changes(saved, config)
  if changes and not allow_config_change:
    raise ValueError(f"workdir {workdir} holds another run (its config.json differs: {'; '.join(changes)}): use a "
                     "new --workdir, or pass --allow_config_change to continue it with this config")
  if changes:
    logging.warning("Continuing %s with a changed config (--allow_config_change): %s", workdir, "; ".join(changes))
  config_lib.check_counts(train, "num_steps", "eval_every")
  if resume_step is not None and resume_step > train.num_steps:
    raise ValueError(f"workdir {workdir} is at step {resume_step}, past train.num_steps={train.num_steps}: "
                     "raise --config.train.num_steps to continue it")
  return Plan(config, storage.absolute(workdir), data, Start(resume_step, init, train.init_from_state),
              None if changes is None else tuple(changes))
