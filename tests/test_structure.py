"""The package's shape: no import cycle (function-level imports counted), no private name used across modules, and
activation sharding constraints that reach the compiled step."""
import ast
import pathlib
import re

import jax
import jax.numpy as jnp

from electra_jax import config as config_lib
from electra_jax.pretrain import experiment
from electra_jax.special_ids import SpecialIds

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


def test_no_import_cycle():
  graph = {_module(p): _imports(p) - {_module(p)} for p in PACKAGE.rglob("*.py")}
  graph = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
  state = {}  # module -> "visiting" | "done"

  def visit(m, trail):
    if state.get(m) == "visiting":
      raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(m):] + [m]))
    if state.get(m) != "done":
      state[m] = "visiting"
      for d in sorted(graph[m]):
        visit(d, trail + [m])
      state[m] = "done"

  assert "electra_jax.weights" in graph["electra_jax.pretrain.loop"]  # the walker sees real edges
  for m in sorted(graph):
    visit(m, [])


def test_no_private_names_across_modules():
  """`module._name` where module is one of ours (imported under any alias), anywhere in the project's code."""
  ours = {p.stem for p in PACKAGE.rglob("*.py")} | {"finetune", "hf"}
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
