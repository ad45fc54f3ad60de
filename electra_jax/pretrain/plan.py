"""What a pre-training run is, decided once at its entrance before anything is built or written: the prepared data
and its tokenizer (init_from's when data.tokenizer names none), whether the workdir resumes (from which step) or
starts fresh (from which weights), and what differs from the config the workdir saved. The experiment and the loop
take its parts and decide none of them again; it is printed at start and written to WORKDIR/plan.json."""
import copy
import dataclasses

import ml_collections

from electra_jax import checkpoints, sources, storage
from electra_jax import loop as loop_lib
from electra_jax import workdir as workdir_lib
from electra_jax.data import prepared as prepared_lib


@dataclasses.dataclass(frozen=True)
class Start:
  """Where the run's state comes from."""
  resume_step: int | None  # the workdir's newest checkpoint, which the run resumes from; None: a fresh start
  init_from: str  # a fresh start's weights (a workdir, params export or HF directory); "": random init
  generator: str  # an HF discriminator's generator directory, kept apart from it (train.init_from_generator)
  with_state: bool  # init_from's optimiser state and step too (train.init_from_state: a second phase)

  def describe(self, seed: int) -> str:
    if self.resume_step is not None:
      return f"resume from the workdir's newest checkpoint, step {self.resume_step}"
    if self.with_state:
      return f"init_from {self.init_from}: its parameters, optimiser state and step"
    if self.init_from:
      generator = f" (generator: {self.generator})" if self.generator else ""
      return f"init_from {self.init_from}: its weights{generator}, a fresh optimiser from train.seed={seed}"
    return f"fresh, random init from train.seed={seed}"


@dataclasses.dataclass(frozen=True)
class Plan:
  config: ml_collections.ConfigDict  # resolved: data.* as the data was prepared, the tokenizer it was prepared with
  workdir: str
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
        start=dataclasses.asdict(self.start), num_steps=self.config.train.num_steps, changes=self.changes))


def resolve(config: ml_collections.ConfigDict, workdir: str, allow_config_change: bool = False) -> Plan:
  """The plan of pre-training `config` in `workdir`; a one-line ValueError/OSError on bad input (config, data,
  workdir, init_from), before anything is built or written."""
  config = copy.deepcopy(sources.with_init_tokenizer(config))
  # config.json names the prepared data by its absolute path: export and init_from read the tokenizer through it,
  # from whatever directory they run in.
  config.data.data_dir = storage.absolute(config.data.data_dir)
  # The data found from data_dir and seq_len: config.json records the settings it was prepared with.
  config = prepared_lib.resolve(config)
  loop_lib.check_config(config.train, "num_steps", "eval_every")
  changes = workdir_lib.check_workdir(workdir, config, allow_config_change)
  data = prepared_lib.load(config)
  train = config.train
  start = Start(checkpoints.latest_step(workdir), train.init_from, train.init_from_generator, train.init_from_state)
  if start.resume_step is None:
    _check_init(start, data.tokenizer_path)
  elif start.resume_step > train.num_steps:
    raise ValueError(f"workdir {workdir} is at step {start.resume_step}, past train.num_steps={train.num_steps}: "
                     "raise --config.train.num_steps to continue it")
  return Plan(config, workdir, data, start, None if changes is None else tuple(changes))


def _check_init(start: Start, tokenizer_path: str):
  """A fresh start's weights source: there is one where its state is asked for, and it holds the data's tokenizer."""
  if start.with_state and not start.init_from:
    raise ValueError("train.init_from_state needs train.init_from: the pre-training workdir whose optimiser state and "
                     "step to continue")
  if not start.init_from:
    return
  what = sources.kind(start.init_from)
  if start.with_state and what != "workdir":
    raise ValueError(f"train.init_from_state: {start.init_from} is "
                     f"{'an HF directory' if what == 'hf' else 'a params export'}, which holds no optimiser state: "
                     "name a pre-training workdir, or drop init_from_state to start from its weights with a fresh "
                     "optimiser")
  theirs = sources.tokenizer(start.init_from)
  if prepared_lib.fingerprint(theirs) != prepared_lib.fingerprint(tokenizer_path):
    raise ValueError(f"train.init_from={start.init_from}: its tokenizer is not the one the data was prepared with; "
                     f"prepare with --config.data.tokenizer={theirs}")
