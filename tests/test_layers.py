"""The package's shape: the import contracts of .importlinter (layers, pretrain/ apart from finetune/, electra-prepare
without the model), and what they cannot see: the modules Python really loads, private names used across modules,
activation sharding constraints that reach the compiled step, and where a run is decided."""
import ast
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp

from electra_jax import config as config_lib
from electra_jax.data.special_ids import SpecialIds
from electra_jax.pretrain import experiment

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "electra_jax"


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tree(module: str) -> ast.Module:
  base = ROOT.joinpath(*module.split("."))
  path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
  return ast.parse(path.read_text())


def test_import_contracts():
  """A broken contract prints the import chain that breaks it (shown on failure) and fails. In a process of its own:
  lint-imports configures logging with dictConfig, which would disable the absl logger of every later test."""
  out = subprocess.run([pathlib.Path(sys.executable).parent / "lint-imports", "--config", ROOT / ".importlinter",
                        "--no-cache"], capture_output=True, text=True, cwd=ROOT, check=False)
  assert out.returncode == 0, out.stdout + out.stderr


def test_prepare_loads_no_model():
  """electra-prepare's modules as Python loads them (sources.py included, which build() imports when it runs): no
  Flax, no model module."""
  code = ("import sys, electra_jax.prepare, electra_jax.run.sources\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flax' or m.startswith('electra_jax.model') "
          "or m in ('electra_jax.run.weights', 'electra_jax.hf.directory')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout


def test_no_private_names_across_modules():
  """`module._name` where module is one of ours (imported under any alias), anywhere in the project's code."""
  ours = {p.stem for p in PACKAGE.rglob("*.py")} | {p.parent.name for p in PACKAGE.rglob("__init__.py")}
  offenders = []
  for path in [*PACKAGE.rglob("*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("studies/**/*.py"),
               *(ROOT / "tests").glob("*.py")]:
    aliases = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("electra_jax"):
        aliases.update(a.asname or a.name for a in node.names if a.name in ours)
      elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
        if re.fullmatch(r"_[a-z]\w*", node.attr):
          offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
  assert not offenders, offenders


def test_activation_constraints_reach_the_step():
  """modeling.py's nn.with_logical_constraint calls become sharding constraints on the batch axes of the mesh."""
  c = config_lib.base("tiny")
  c.data.update(vocab_size=64, seq_len=16)
  c.train.batch_size = 8
  c.mesh.update(data=4, fsdp=2)
  exp = experiment.create(c, SpecialIds())
  state = jax.eval_shape(exp.sharded.init, jax.random.key(0))
  ids = jax.ShapeDtypeStruct((8, 16), jnp.int32, sharding=exp.sharded.batch)
  batch = {"input_ids": ids, "segment_ids": ids}
  text = exp.step.lower(state, batch, jax.random.key(1)).as_text()
  constraints = re.findall(r"sharding_constraint.*", text)
  # Embeddings and every layer's output: [batch, length, features] split over both mesh axes on the batch.
  assert len(constraints) >= 1 + c.model.num_layers, constraints[:3]
  assert all('{"data", "fsdp"}' in line for line in constraints), constraints[:3]


# A run's plan (its data and tokenizer, the workdir's verdict, where its state comes from) is decided at each
# command's entrance, in its plan.py: these calls stand nowhere else in the package (electra-prepare resolves
# init_from's tokenizer as pre-training's plan does, so that the two agree; electra-bench looks its data up as the
# plan does; weights.py's own entrances, which electra-export and the tests call with a directory, resolve that
# directory's Source).
DECISIONS = {"init_source": {"electra_jax.pretrain.plan", "electra_jax.prepare"},
             "sources.resolve": {"electra_jax.finetune.plan", "electra_jax.run.weights"},
             "prepared_lib.find": {"electra_jax.pretrain.plan", "electra_jax.bench"},
             "saved_config": {"electra_jax.pretrain.plan", "electra_jax.finetune.plan"},
             "checkpoints.latest_step": {"electra_jax.pretrain.plan", "electra_jax.finetune.plan"}}
# Building (experiment.py) and running (loop.py) take the plan's parts and look nothing up again: no prepared data,
# weights source, saved config or checkpoint (train_and_evaluate and finetune, the library's one call each, resolve
# the plan as main() does).
BUILD_AND_RUN = ("pretrain.experiment", "pretrain.loop", "finetune.experiment", "finetune.loop")
LOOKUPS = {"resolve", "find", "load", "tokenizer_path", "init_source", "load_config", "saved_config", "latest_step",
           "kind"}


def _calls(tree: ast.Module) -> list[set[str]]:
  """The names each call in `tree` goes by: its function's (or attribute's), and module.attribute."""
  calls = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
      calls.append({node.func.id})
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      value = node.func.value
      calls.append({node.func.attr} | ({f"{value.id}.{node.func.attr}"} if isinstance(value, ast.Name) else set()))
  return calls


def test_a_runs_plan_is_decided_at_its_entrance():
  found = {}
  for path in PACKAGE.rglob("*.py"):
    for name in set().union(*_calls(ast.parse(path.read_text()))) & set(DECISIONS):
      found.setdefault(name, set()).add(_module(path))
  assert found == DECISIONS
  for module in BUILD_AND_RUN:
    lookups = {n for names in _calls(_tree(f"electra_jax.{module}")) if "plan_lib.resolve" not in names
               for n in names} & LOOKUPS
    assert not lookups, (module, lookups)


# The rooms below the commands take the typed parts of a run they need (modeling.ModelConfig, a PreparedData, a
# SpecialIds, a sources.Source, counts), not the run's ConfigDict. Those that still take one, and why; the list is
# exact, and may shrink, never grow.
BELOW_COMMANDS = ("model.modeling", "parallel.sharding", "parallel.state", "model.objectives", "parallel.optim",
                  "parallel.update", "model.masking", "model.losses", "model.sampling", "model.two_stage",
                  "run.weights", "run.sources", "data.corpus", "data.input_pipeline", "data.packing", "data.prepared",
                  "data.pretraining", "data.task_rows")
TAKE_A_CONFIGDICT = {
    "model.modeling.from_config": "where a config becomes the typed ModelConfig",
    "model.objectives.from_config": "where the objective section becomes the typed ObjectiveConfig",
    "run.sources.init_source": "train.init_from: its source, and data.tokenizer set in the config electra-prepare "
                               "and the plan resolve",
    "data.input_pipeline.train_iterator": "train.batch_size and seed",
    "data.input_pipeline.validation_batches": "train.batch_size and eval_batches",
    "data.prepared.tokenizer_path": "the data section's hash",
    "data.prepared.dataset_dir": "the data section's hash",
    "data.prepared.resolve": "data.* as prepared",
    "data.prepared.find": "data.* as prepared",
    "data.prepared.load": "data.* as prepared"}


def test_rooms_below_the_commands_take_typed_parts():
  """A parameter annotated as a ConfigDict, or an unannotated `config`, marks a function that takes one."""
  takers = set()
  for module in BELOW_COMMANDS:
    for node in ast.walk(_tree(f"electra_jax.{module}")):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
          annotation = ast.unparse(a.annotation) if a.annotation else ""
          if "ConfigDict" in annotation or (a.arg == "config" and not annotation):
            takers.add(f"{module}.{node.name}")
  assert takers == set(TAKE_A_CONFIGDICT), (sorted(takers - set(TAKE_A_CONFIGDICT)),
                                            sorted(set(TAKE_A_CONFIGDICT) - takers))
