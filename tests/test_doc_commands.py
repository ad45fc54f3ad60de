"""Every command in README.md, MAINTAINING.md, docs/*.md (and the electra-* lines of the configs' docstrings) runs as
written as far as it can without the data, the accelerator or the cloud it needs: an electra-* command line, a
`python` script (bundle/run.sh is benchmarks/gpu_run.py) and the command lines launch/*.sh prints under --dry-run
parse with their real flags (the --config file loads, each --config.* override names a key of it with a value of its
type); a pre-training command names the data_dir its data was prepared into; a `make` target and a `pip install`
extra exist. And every file or folder of this repository a page or the Makefile names exists. So the docs cannot drift
from the code. `...` and a shell variable ($DEMO) stand for more flags and are dropped; so is a `#` comment."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "MAINTAINING.md", *sorted((ROOT / "docs").glob("*.md"))]
# A line (or an inline code span) that starts with a command, possibly by its path in a virtualenv.
COMMAND = re.compile(r"^(?:\S*/)?(electra-[a-z]+)\s+(--.*)$")
# Another command of ours: a Python script or module, a launcher, the offline bundle's scripts, make, pip install.
SHELL = re.compile(r"^(?:[A-Z_]+=\S*\s+)*(?:\S*/)?(python3?\s+(?:-m\s+[\w.]+|[\w/.-]+\.py)|launch/\w+\.sh|bundle/\w+\.sh|"
                   r"make|pip install)(?=\s|$)(.*)$")
# A file or folder of this repository named in a page: its top-level folders, then a path (a :arg after a config).
REPO_PATH = re.compile(r"(?<![\w./:~-])((?:electra_jax|configs|docs|benchmarks|launch|studies|tests)/[\w./-]*[\w/])")
# Named on purpose and absent: what a command writes, and a bad input's example.
NOT_FILES = {"docs/replication": "make replicate writes its figures there", "configs/nope.py": "a missing config file"}
LAUNCHED = re.compile(r"(?:^|[\s/\"])(electra-(?:pretrain|compile))\"?\s+(--[^>&\n']*)")


def _modules() -> dict:
  """Each command's module, from setup.py's entry points."""
  return dict(re.findall(r'"(electra-[a-z]+)=([\w.]+):run"', (ROOT / "setup.py").read_text()))


def _candidates(path: pathlib.Path):
  """(where, text, inline) of each line of a page and each inline code span, backslash continuations joined."""
  text = path.read_text()
  if path.suffix == ".py":  # a config's docstring
    text = text.split('"""')[1] if '"""' in text else ""
  lines = text.splitlines()
  for i, line in enumerate(lines):
    for k, candidate in enumerate([line.strip()] + re.findall(r"`([^`]+)`", line)):
      j = i
      while candidate.endswith("\\") and j + 1 < len(lines):
        j += 1
        candidate = candidate[:-1] + " " + lines[j].strip()
      yield f"{path.relative_to(ROOT)}:{i + 1}", candidate, k > 0


def _args(text: str) -> list[str]:
  return [a.strip("[]") for a in shlex.split(text, comments=True) if "..." not in a and a.strip("[]")[:1] != "$"]


def _commands(path: pathlib.Path) -> list[tuple[str, list[str]]]:
  """(where, argv) of each electra-* command line in a page."""
  found = []
  for where, candidate, _ in _candidates(path):
    m = COMMAND.match(candidate)
    if m:
      found.append((where, [m.group(1)] + _args(m.group(2))))
  return found


def documented() -> list[tuple[str, list[str]]]:
  pages = [*PAGES, *sorted((ROOT / "configs").rglob("*.py"))]
  return [c for page in pages for c in _commands(page)]


def shell_commands() -> list[tuple[str, str, list[str]]]:
  """(where, program, args) of each other command of ours in the pages: `python X.py`, `python -m M`, launch/*.sh,
  bundle/*.sh, make, pip install; `A && B` is two. A launcher named in prose (`launch/gpu.sh`, `launch/tpu_vm.sh train`,
  `... --watch ...`: an inline span without a flag, or with `...`) is a mention, not a command."""
  found = []
  for page in PAGES:
    for where, candidate, inline in _candidates(page):
      for part in candidate.split(" && "):
        m = SHELL.match(part.strip())
        if m and inline and m.group(1).startswith("launch/") and ("..." in part or " --" not in part):
          continue
        if m:
          try:
            found.append((where, " ".join(m.group(1).split()), _args(m.group(2))))
          except ValueError:  # a quote that closes on a later line: prose, not a command
            pass
  return found


def _script(program: str, args: list[str]) -> list[list[str]] | None:
  """What the subprocess parses for a `python` line: [script path or -m module, args...] lists; None: not ours."""
  if program.startswith("bundle/run.sh"):
    return [["benchmarks/gpu_run.py", "--data_dir=bundle/data", "--output=bundle/runs/gpu", *args]]
  target = program.split(None, 1)[1]
  if target.startswith("-m "):
    module = target[3:].strip()
    command = {m.removesuffix(".__main__"): name for name, m in _modules().items()}.get(module)  # python -m electra_jax.X
    if command:
      return [[command, *args]]
    return None if module.split(".")[0] not in ("studies", "benchmarks") else [["-m", module, *args]]
  if target == "benchmarks/compare.py":  # its own flags; the rest go to electra-bench and the peer alike
    rest = [a for a in args if not a.startswith(("--rounds=", "--max_load=", "--skip_compiled", "--steps="))]
    return [["electra-bench", *rest], ["benchmarks/peer_torch.py", *rest]]
  path = ROOT / target
  # Only absl scripts stop at parsing their flags; another (tests/soak.py, render_docs.py) would run: its file is checked.
  return [[target, *args]] if path.is_file() and "app.run(" in path.read_text() else None


def _parse(argvs: list[list[str]]) -> list[str | None]:
  out = subprocess.run([sys.executable, __file__], input=json.dumps(argvs), cwd=ROOT, capture_output=True, text=True,
                       check=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  return json.loads(out.stdout.splitlines()[-1])


def _dry_run(program: str, args: list[str]) -> tuple[int, str]:
  """A launcher under --dry-run (gcloud and electra-compile need not be installed): its exit status and output."""
  r = subprocess.run(["bash", program, "--dry-run", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                     env=dict(os.environ, ELECTRA_PROJECT="p", ELECTRA_PYTHON=sys.executable))
  return r.returncode, r.stdout + r.stderr


def test_every_documented_command_parses():
  commands, errors = documented(), []
  assert len(commands) > 40 and {argv[0] for _, argv in commands} <= set(_modules()), "a command setup.py lacks"
  shell = shell_commands()
  assert {p.split()[0] for _, p, _ in shell} >= {"python", "launch/gpu.sh", "launch/tpu_vm.sh", "bundle/run.sh",
                                                 "make", "pip"}, "a kind of command went unread"
  targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
  extras = set(re.findall(r'^\s*"([\w-]+)": \[', (ROOT / "setup.py").read_text(), re.M))
  parsed = list(commands)
  for where, program, args in shell:
    if program == "make":
      errors += [f"{where}: make {t}\n  -> no such target" for t in args if t not in targets]
    elif program == "pip install":
      for arg in args:
        m = re.fullmatch(r"\.\[([\w,]+)\]", arg)
        errors += [f"{where}: pip install {arg}\n  -> no extra {e!r} in setup.py" for e in (m[1].split(",") if m else [])
                   if e not in extras]
    elif program.startswith("launch/"):
      code, output = _dry_run(program, args)
      if code:
        errors.append(f"{where}: {program} {shlex.join(args)} --dry-run\n  -> {output.strip()[-500:]}")
      parsed += [(f"{where} (launched)", [m[1], *shlex.split(m[2])]) for m in LAUNCHED.finditer(output)]
    elif program == "bundle/install.sh":
      continue  # the bundle's installer: tests/test_gpu_run.py runs it
    else:
      parsed += [(where, argv) for argv in _script(program, args) or []]
  results = _parse([argv for _, argv in parsed])
  errors += [f"{where}: {' '.join(argv)}\n  -> {error}" for (where, argv), error in zip(parsed, results) if error]
  assert not errors, "\n".join(errors)


def _named_paths(page: pathlib.Path) -> set[str]:
  """This repository's files and folders a page names: its relative links, and paths under the top-level folders."""
  text = page.read_text()
  named = set()
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    target = target.split("#")[0]
    if target and not re.match(r"\w+:", target):
      named.add(os.path.normpath((page.parent / target).relative_to(ROOT)))
  for path in REPO_PATH.findall(text):
    path = path.split(":")[0]
    if not re.search(r"[*]|[A-Z]{3,}", path):  # a glob or a placeholder (NAME, TASK_SEED)
      named.add(os.path.normpath(path))
  return named


@pytest.mark.parametrize("page", [*PAGES, ROOT / "Makefile"], ids=lambda p: p.name)
def test_every_file_a_page_names_exists(page):
  missing = sorted(p for p in _named_paths(page) if not (ROOT / p).exists() and p not in NOT_FILES)
  assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def _parse_each():
  """Reads argvs (JSON) on stdin, writes each one's parse error or null: each in a forked child, as flags are defined
  once per process (config_flags reads the overrides from sys.argv when --config is defined). An electra-* argv is
  parsed with that command's flags; a script (a path, or -m and a module) is run as __main__ up to absl's app.run,
  which parses its flags and stops. A pre-training command must name --config.data.data_dir unless its config has its
  own: the schema's default, `data`, is where no documented electra-prepare line writes."""
  import importlib  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from electra_jax import cli  # pylint: disable=g-import-not-at-top
  modules = {name: importlib.import_module(module) for name, module in _modules().items()}  # defines no flag

  class Parsed(Exception):
    pass

  def parse_only(main, argv=None, **kwargs):  # absl's app.run, less running main
    del main, argv, kwargs
    rest = flags.FLAGS(sys.argv)
    for name in flags.FLAGS:
      flags.FLAGS[name].value  # pylint: disable=pointless-statement  (loads a config file)
    raise Parsed(rest)

  def parse(argv: list[str]) -> str | None:
    sys.argv = argv
    if argv[0] in modules:
      own = modules[argv[0]].define_flags()
      rest = flags.FLAGS(argv)
      for holder in own:
        holder.value  # pylint: disable=pointless-statement  (loads the config file)
      config = getattr(flags.FLAGS, "config", None)
      if (argv[0] == "electra-pretrain" and config.data.data_dir == "data" and
          not any(a.startswith("--config.data.data_dir=") for a in argv)):
        return "no --config.data.data_dir: it reads the schema's default `data`, where no documented line prepares"
      return f"unexpected arguments: {rest[1:]}" if len(rest) > 1 else None
    app.run = parse_only
    try:
      if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
      else:
        sys.path.insert(0, str(ROOT / pathlib.Path(argv[0]).parent))
        runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
    except Parsed:
      return None
    return "ran without parsing flags through absl's app.run"

  results = []
  for argv in json.loads(sys.stdin.read()):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(read)
      os.dup2(2, 1)  # what a script prints on import stays out of the answer on stdout
      try:
        error = parse(argv)
      except BaseException as e:  # pylint: disable=broad-except  (SystemExit included: absl's usage errors)
        error = cli.describe_flag_error(e) or type(e).__name__
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
