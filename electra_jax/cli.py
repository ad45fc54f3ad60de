"""What every electra-* command shares: flag parsing, --help, and the one-line error: bad input (flags, config keys
and values, a missing optional package, USER_ERRORS the library raises) ends a command with "<command>: error: ..."
on stderr and exit status 1 (`-v=1` also logs the traceback); anything else is a bug, and keeps its traceback."""
import sys
import textwrap
from typing import Callable, Sequence

from absl import app, flags, logging
import ml_collections

from electra_jax.runtime import console, outage, packages, storage

USER_ERRORS = (ValueError, OSError, FloatingPointError, packages.MissingPackage)
HELP = ("-h", "-help", "--help", "-helpshort", "--helpshort", "-?")
HELPFULL = ("-helpfull", "--helpfull")

CONFIG_HELP = """\
The config file (--config=configs/NAME.py) is Python whose get_config() returns every setting of the run. Override
any key, at any depth, after it: --config.SECTION.KEY=VALUE (e.g. --config.train.batch_size=32). A key that does not
exist, or a value of the wrong type, is refused in one line."""


def fail(command: str, message) -> None:
  """Exits 1 after the one line "<command>: error: <message>" (whitespace folded, so it is one line)."""
  sys.stderr.write(f"{command}: error: {' '.join(str(message).split())}\n")
  sys.stderr.flush()
  sys.exit(1)


def describe_flag_error(e: Exception) -> str:
  """A flag-parsing error in words (config_flags gives a misspelt key as a KeyError or an AttributeError around one)."""
  if not isinstance(e, (KeyError, AttributeError)):
    return str(e)
  cause = e.args[0] if e.args else e
  return f"unknown config key {cause.args[0] if isinstance(cause, KeyError) and cause.args else cause}"


def _flag_help(flag: flags.Flag, required: bool) -> str:
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  default = "required" if required else None if flag.default is None else f"default: {flag.default_as_str}"
  text = f"{name}: {flag.help}" + (f" ({default})" if default else "")
  return textwrap.fill(text, 116, initial_indent="  ", subsequent_indent="    ")


def usage(doc: str, own: Sequence[flags.FlagHolder], required: Sequence[str]) -> str:
  lines = [doc.strip(), "", "Flags:"]
  lines += [_flag_help(flags.FLAGS[h.name], h.name in required) for h in own]
  if any(h.name == "config" for h in own):
    lines += ["", CONFIG_HELP]
  lines += ["", "-v=1 also logs every library's lines and the traceback of an error; --helpfull lists the library "
            "flags too."]
  return "\n".join(lines)


def _values(value):
  """Every leaf value of a flag (a config is walked to its leaves)."""
  if isinstance(value, (ml_collections.ConfigDict, dict)):
    for v in value.values():
      yield from _values(v)
  else:
    yield value


def _require(command: str, own: Sequence[flags.FlagHolder], needs: Sequence[str]):
  for module in needs:
    packages.require(module, command)
  if any(isinstance(v, str) and v.startswith("gs://") for h in own for v in _values(h.value)):
    packages.require("gcsfs", f"{command} with gs:// paths")
    storage.check_reachable()
    outage.watch(command)  # from now on, a store that stops answering ends the command in one line


def run(command: str, doc: str, main: Callable[..., object], own: Sequence[flags.FlagHolder],
        required: Sequence[str] = (), needs: Sequence[str] = ()):
  """Runs `main(**{name: value of each flag in own})` as `command`; `needs`: the optional packages it needs. Commands
  define `own` in run(), never at import, so that one process can import several."""
  storage.initialize()  # before any file is touched
  flags.mark_flags_as_required(required)

  def parse(argv):
    if any(a in HELP or a in HELPFULL for a in argv[1:]):
      print(usage(doc, own, required))
      if any(a in HELPFULL for a in argv[1:]):
        print("\nEvery flag:\n" + flags.FLAGS.get_help())
      sys.exit(0)
    try:
      argv = flags.FLAGS(argv)
      for holder in own:
        holder.value  # pylint: disable=pointless-statement  (a config file that does not load raises here)
    except Exception as e:  # pylint: disable=broad-except  (any error here comes from the command line)
      logging.debug("%s: bad flags", command, exc_info=True)
      fail(command, describe_flag_error(e))
    if len(argv) > 1:
      fail(command, f"unexpected arguments: {' '.join(argv[1:])} (flags are written --name=value)")
    return argv

  def run_main(_):
    console.start()
    try:
      _require(command, own, needs)
      main(**{holder.name: holder.value for holder in own})
    except USER_ERRORS as e:
      logging.debug("%s failed", command, exc_info=True)
      fail(command, e)

  app.run(run_main, flags_parser=parse)
