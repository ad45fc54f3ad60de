"""Every electra-* command line in README.md, docs/*.md and the configs' docstrings parses with that command's real
flags: its --config file loads and each --config.* override names a key of it, with a value of the key's type. So the
docs cannot drift from the code. `...` and a shell variable ($DEMO) stand for more flags and are dropped; so is a
`#` comment."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# A line (or an inline code span) that starts with a command, possibly by its path in a virtualenv.
COMMAND = re.compile(r"^(?:\S*/)?(electra-[a-z]+)\s+(--.*)$")


def _modules() -> dict:
  """Each command's module, from setup.py's entry points."""
  return dict(re.findall(r'"(electra-[a-z]+)=([\w.]+):run"', (ROOT / "setup.py").read_text()))


def _commands(path: pathlib.Path) -> list[tuple[str, list[str]]]:
  """(where, argv) of each command line in a page: code lines (backslash continuations joined) and inline spans."""
  text = path.read_text()
  if path.suffix == ".py":  # a config's docstring
    text = text.split('"""')[1] if '"""' in text else ""
  found, lines = [], text.splitlines()
  for i, line in enumerate(lines):
    candidates = [line.strip()] + re.findall(r"`([^`]+)`", line)
    for candidate in candidates:
      j = i
      while candidate.endswith("\\") and j + 1 < len(lines):
        j += 1
        candidate = candidate[:-1] + " " + lines[j].strip()
      m = COMMAND.match(candidate)
      if m:
        args = [a.strip("[]") for a in shlex.split(m.group(2), comments=True)]
        found.append((f"{path.relative_to(ROOT)}:{i + 1}", [m.group(1)] + [a for a in args if "..." not in a and a[0] != "$"]))
  return found


def documented() -> list[tuple[str, list[str]]]:
  pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").rglob("*.py"))]
  return [c for page in pages for c in _commands(page)]


def test_every_documented_command_parses():
  commands = documented()
  assert len(commands) > 40 and {argv[0] for _, argv in commands} <= set(_modules()), "a command setup.py lacks"
  out = subprocess.run([sys.executable, __file__], input=json.dumps([argv for _, argv in commands]), cwd=ROOT,
                       capture_output=True, text=True, check=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  errors = [f"{where}: {' '.join(argv)}\n  -> {error}" for (where, argv), error in zip(commands, json.loads(out.stdout))
            if error]
  assert not errors, "\n".join(errors)


def _parse_each():
  """Reads argvs (JSON) on stdin, writes each one's parse error or null: each in a forked child, as flags are defined
  once per process (config_flags reads the overrides from sys.argv when --config is defined)."""
  import importlib  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from electra_jax import cli  # pylint: disable=g-import-not-at-top
  modules = {name: importlib.import_module(module) for name, module in _modules().items()}  # defines no flag
  results = []
  for argv in json.loads(sys.stdin.read()):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(read)
      error = None
      try:
        sys.argv = argv
        own = modules[argv[0]].define_flags()
        rest = flags.FLAGS(argv)
        for holder in own:
          holder.value  # pylint: disable=pointless-statement  (loads the config file)
        if len(rest) > 1:
          error = f"unexpected arguments: {rest[1:]}"
      except Exception as e:  # pylint: disable=broad-except
        error = cli.describe_flag_error(e)
      os.write(write, json.dumps(error).encode())
      os._exit(0)  # pylint: disable=protected-access
    os.close(write)
    with os.fdopen(read) as f:
      results.append(json.loads(f.read()))
    os.waitpid(pid, 0)
  print(json.dumps(results))


if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  _parse_each()
