"""The package's shape: no import cycle (function-level imports counted), data/ below the model (electra-prepare builds
none), no private name used across modules, and activation sharding constraints that reach the compiled step."""
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


def _imports(path: pathlib.Path) -> set[str]:
  """electra_jax modules `path` imports anywhere in it (module level or inside functions)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name.startswith("electra_jax"))
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("electra_jax"):
      for a in node.names:  # `from electra_jax import weights` names a module; `from x.y import Name` a member
        candidate = f"{node.module}.{a.name}"
        out.add(candidate if _path(candidate) else node.module)
  return out


def _path(module: str):
  base = ROOT.joinpath(*module.split("."))
  for p in (base.with_suffix(".py"), base / "__init__.py"):
    if p.exists():
      return p
  return None


def _graph() -> dict[str, set[str]]:
  """Every electra_jax module -> the electra_jax modules it imports (function-level imports counted)."""
  graph = {_module(p): _imports(p) - {_module(p)} for p in PACKAGE.rglob("*.py")}
  return {m: {d for d in deps if d in graph} for m, deps in graph.items()}


def _closure(graph: dict[str, set[str]], roots) -> set[str]:
  seen, todo = set(), list(roots)
  while todo:
    m = todo.pop()
    if m not in seen:
      seen.add(m)
      todo += graph[m]
  return seen


def test_no_import_cycle():
  graph = _graph()
  state = {}  # module -> "visiting" | "done"

  def visit(m, trail):
    if state.get(m) == "visiting":
      raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(m):] + [m]))
    if state.get(m) != "done":
      state[m] = "visiting"
      for d in sorted(graph[m]):
        visit(d, trail + [m])
      state[m] = "done"

  assert "electra_jax.run.weights" in graph["electra_jax.pretrain.loop"]  # the walker sees real edges
  for m in sorted(graph):
    visit(m, [])


# What data/ may import besides itself: the leaves below it (files, tokenizers, optional packages, a workdir's
# config.json) and sources.py, which tells from a directory's files alone which tokenizer init_from's weights use.
BELOW_DATA = {"electra_jax", "electra_jax.runtime.storage", "electra_jax.runtime.packages",
              "electra_jax.data.tokenizer", "electra_jax.data.special_ids", "electra_jax.run.workdir",
              "electra_jax.run.sources", "electra_jax.hf.tokenizer"}


def _third_party(module: str) -> set[str]:
  """The top-level packages other than ours that `module` imports anywhere in it."""
  names = set()
  for node in ast.walk(ast.parse(_path(module).read_text())):
    if isinstance(node, ast.Import):
      names.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module.split(".")[0])
  return names - {"electra_jax"}


def test_data_imports_nothing_above_it():
  """data/ (electra-prepare's library) reaches only the modules below it, even through function-level imports:
  no model, weights, step or loop, and nothing that imports Flax."""
  graph = _graph()
  data = {m for m in graph if m.startswith("electra_jax.data")}
  reached = _closure(graph, data)
  assert "electra_jax.run.sources" in reached  # the walker sees build.py's function-level import
  assert reached - data <= BELOW_DATA, sorted(reached - data - BELOW_DATA)
  assert not [m for m in reached if "flax" in _third_party(m)]


def test_prepare_imports_no_model():
  """electra-prepare's import closure, as Python loads it (sources.py included, which build() imports when it runs),
  holds no Flax model module."""
  code = ("import sys, electra_jax.prepare, electra_jax.prepare, electra_jax.run.sources\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flax' or m in "
          "('electra_jax.model.modeling', 'electra_jax.run.weights', 'electra_jax.hf.directory', "
          "'electra_jax.model.objectives')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout


def test_no_private_names_across_modules():
  """`module._name` where module is one of ours (imported under any alias), anywhere in the project's code."""
  ours = {p.stem for p in PACKAGE.rglob("*.py")} | {"finetune", "hf", "pretrain"}
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
# command's entrance, in its plan.py: these calls stand nowhere else in the package (electra-prepare's data/build.py
# resolves init_from's tokenizer as pre-training's plan does, so that the two agree; electra-bench looks its data up
# as the plan does; weights.py's own entrances, which electra-export and the tests call with a directory, resolve that
# directory's Source).
DECISIONS = {"init_source": {"electra_jax.pretrain.plan", "electra_jax.prepare"},
             "sources.resolve": {"electra_jax.finetune.plan", "electra_jax.run.weights"},
             "prepared_lib.find": {"electra_jax.pretrain.plan", "electra_jax.bench"},
             "check_workdir": {"electra_jax.pretrain.plan"},
             "check_finetune_workdir": {"electra_jax.finetune.plan"},
             "checkpoints.latest_step": {"electra_jax.pretrain.plan", "electra_jax.finetune.plan"}}


def _called(node: ast.Call) -> list[str]:
  """The names a call goes by: its function's (or attribute's), and module.attribute."""
  if not isinstance(node.func, ast.Attribute):
    return [node.func.id] if isinstance(node.func, ast.Name) else []
  names = [node.func.attr]
  if isinstance(node.func.value, ast.Name):
    names.append(f"{node.func.value.id}.{node.func.attr}")
  return names


def test_a_runs_plan_is_decided_at_its_entrance():
  found = {}
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call):
        for name in _called(node):
          if name in DECISIONS:
            found.setdefault(name, set()).add(_module(path))
  assert found == DECISIONS


# Building (experiment.py) and running (loop.py) take the plan's parts: they import sources.py (what a weights source
# is) for its type alone, and look nothing up again: no prepared data, weights source, saved config or checkpoint
# (train_and_evaluate and finetune, the library's one call each, resolve the plan as main() does).
BUILD_AND_RUN = ("pretrain.experiment", "pretrain.loop", "finetune.experiment", "finetune.loop")
LOOKUPS = {"resolve", "find", "load", "tokenizer_path", "init_source", "load_config",
           "changes_since", "latest_step", "kind"}


def test_building_and_running_take_the_plans_parts():
  for module in BUILD_AND_RUN:
    calls = {n for node in ast.walk(ast.parse(_path(f"electra_jax.{module}").read_text()))
             if isinstance(node, ast.Call) and "plan_lib.resolve" not in _called(node) for n in _called(node)}
    assert not calls & LOOKUPS, (module, calls & LOOKUPS)


# The rooms below the commands take the typed parts of a run they need (modeling.ModelConfig, a PreparedData, a
# SpecialIds, a sources.Source, counts), not the run's ConfigDict. Those that still take one, and why; the list is
# exact, and may shrink, never grow.
BELOW_COMMANDS = ("modeling", "sharding", "state", "objectives", "optim", "accumulate", "masking", "losses", "sampling",
                  "two_stage", "weights", "sources", "data.build", "data.corpus", "data.input_pipeline",
                  "data.packing", "data.prepared", "data.pretraining", "data.task_rows")
TAKE_A_CONFIGDICT = {
    "modeling.from_config": "where a config becomes the typed ModelConfig",
    "optim.build": "the train section: the optimiser recipe's keys",
    "optim.pretraining": "the train section",
    "objectives.compute_loss": "the objective section, read inside the step (losses.Batch carries it)",
    "objectives._unwrapped": "the registry's wrap_update hook, whose one user is two_stage's",
    "two_stage.wrap_update": "its switch step",
    "two_stage.switch_step": "checks sizes, sharing and fraction",
    "sources.init_source": "train.init_from: its source, and data.tokenizer set in the config electra-prepare and "
                           "the plan resolve",
    "data.build.build": "electra-prepare's library: the data section, through the whole config",
    "data.input_pipeline.train_iterator": "train.batch_size and seed",
    "data.input_pipeline.validation_batches": "train.batch_size and eval_batches",
    "data.prepared.tokenizer_path": "the data section's hash",
    "data.prepared.dataset_dir": "the data section's hash",
    "data.prepared.resolve": "data.* as prepared",
    "data.prepared.find": "data.* as prepared",
    "data.prepared.load": "data.* as prepared"}


def test_rooms_below_the_commands_take_typed_parts():
  """A parameter annotated as a ConfigDict, or an unannotated `config`, marks a function that takes one."""
  assert {m for m in BELOW_COMMANDS if _path(f"electra_jax.{m}") is None} == set()
  takers = set()
  for module in BELOW_COMMANDS:
    for node in ast.walk(ast.parse(_path(f"electra_jax.{module}").read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
          annotation = ast.unparse(a.annotation) if a.annotation else ""
          if "ConfigDict" in annotation or (a.arg == "config" and not annotation):
            takers.add(f"{module}.{node.name}")
  assert takers == set(TAKE_A_CONFIGDICT), (sorted(takers - set(TAKE_A_CONFIGDICT)),
                                            sorted(set(TAKE_A_CONFIGDICT) - takers))
