"""Bad input to electra-pretrain: each case exits 1 with one line "electra-pretrain: error: ..." (the last line of
stderr, no traceback) and leaves the workdir as it was (absent, or byte for byte unchanged). docs/reliability.md lists
the same cases with their messages.

The cases run as real subprocesses, several at once (they are mostly start-up time), from one module fixture.
"""
import concurrent.futures
import copy
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from electra_jax import prepare, train
from tests import pretrain_cli as cli

RUN = ("--config.train.num_steps=2", "--config.train.checkpoint_every=2", "--config.train.eval_every=1000")
# "Disk full": files may not grow past 256 KiB (RLIMIT_FSIZE), less than the tiny checkpoint's data. Python ignores
# SIGXFSZ, so writes fail with EFBIG as they would with ENOSPC; no root or tmpfs needed.
DISK_FULL = "ulimit -f 256"


def _tree(path) -> dict:
  """Every file under `path` with its content's hash: what must not change."""
  if not os.path.exists(path):
    return {}
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      with open(os.path.join(root, f), "rb") as fh:
        out[os.path.relpath(os.path.join(root, f), path)] = hashlib.sha256(fh.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def setting(tiny_data, tmp_path_factory):
  """A finished 2-step run to spoil, a prepared dataset with one example, and one with a 1000-piece vocabulary."""
  config, _ = tiny_data
  base = tmp_path_factory.mktemp("bad_inputs")
  trained = base / "trained"
  c = copy.deepcopy(config)
  c.train.update(num_steps=2, checkpoint_every=2, eval_every=1000)
  train.train_and_evaluate(c, str(trained))

  few = copy.deepcopy(config)
  (base / "few.txt").write_text("One short line of text here.\nAnother short line.\n\nA second document.\n")
  few.data.update(text_files=str(base / "few.txt"), tokenizer=prepare.tokenizer_path(config),
                  data_dir=str(base / "few"), max_documents=0)
  prepare.prepare(few)

  small_vocab = copy.deepcopy(config)
  small_vocab.data.update(vocab_size=1000, data_dir=str(base / "vocab1000"))
  prepare.prepare(small_vocab)
  setting = dict(base=base, trained=trained, few=few.data, vocab1000=small_vocab.data.data_dir, mounts=[])
  yield setting
  for path in setting["mounts"]:
    subprocess.run(["umount", str(path)], check=False)


def _copy(setting, name):
  workdir = setting["base"] / name
  shutil.copytree(setting["trained"], workdir)
  return workdir


def _spoil(workdir, what):
  state = workdir / "checkpoints" / "2" / "state"
  if what == "corrupt":
    for root, _, files in os.walk(state):
      for f in files:
        with open(os.path.join(root, f), "r+b") as fh:
          fh.write(b"\xff" * 64)
  else:  # partial: the arrays never made it
    shutil.rmtree(state)
  return workdir


def _a_file(setting, name):
  path = setting["base"] / name
  path.write_text("")
  return path


def _read_only(setting, name):
  """A workdir inside a directory nobody may write to: chmod for a normal user, a read-only tmpfs for root, or (where
  root cannot mount) a workdir whose parent is a regular file, which no one can create."""
  path = setting["base"] / name
  os.makedirs(path)
  if os.geteuid():
    os.chmod(path, 0o500)
  elif subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], check=False,
                      capture_output=True).returncode:
    os.rmdir(path)
    path.write_text("not a directory")
  else:
    setting["mounts"].append(path)
  return path / "run"


# name -> (workdir maker, flags, message regex[, shell setup]). The workdir maker gets (setting, name).
CASES = {
    "unknown_config_key": (None, ["--config.train.num_stepz=3"],
                           r"unknown config key 'num_stepz' Did you mean \"num_steps\" instead of \"num_stepz\"\?"),
    "wrong_value_type": (None, ["--config.train.num_steps=abc"],
                         r"flag --config.train.num_steps=abc: invalid literal for int\(\) with base 10: 'abc'"),
    "missing_config_file": (None, ["--config=configs/nope.py"],
                            r"Failed loading config file .*nope.py.* No such file or directory"),
    "empty_workdir_flag": (None, ["--workdir="], r"flag --workdir=: --workdir must name a directory"),
    "batch_not_divisible": (None, ["--config.train.batch_size=12"],
                            r"train.batch_size=12 is not divisible by the 8 data-parallel devices and 1 processes"),
    "mesh_not_matching_devices": (None, ["--config.mesh.data=3"],
                                  r"mesh data=3 x fsdp=1 does not match the 8 devices"),
    "seq_len_above_position_table": (None, ["--config.model.max_position_embeddings=32"],
                                     r"data.seq_len=64 exceeds the position table"),
    "objective_typo": (None, ["--config.objective.name=electraa"], r"objective.name='electraa': expected one of"),
    "sharing_mode_typo": (None, ["--config.objective.embedding_sharing=tied"],
                          r"objective.embedding_sharing='tied'"),
    "checkpoint_every_zero": (None, ["--config.train.checkpoint_every=0"],
                              r"train.checkpoint_every=0 must be at least 1"),
    "missing_prepared_dataset": (None, ["--config.data.data_dir={base}/nothing"],
                                 r"no prepared data at .*/nothing/.*: run `electra-prepare"),
    "dataset_smaller_than_a_batch": (None, ["--config.data.data_dir={few.data_dir}",
                                            "--config.data.text_files={few.text_files}",
                                            "--config.data.tokenizer={few.tokenizer}", "--config.data.max_documents=0"],
                                     r"has 1 examples, fewer than one batch \(16\); prepare more data"),
    "workdir_is_a_file": (_a_file, [],
                          r"workdir .* cannot be created: .* is a file"),
    "unwritable_workdir": (_read_only, [], r"workdir .* (is not writable|cannot be created: .* is a file)"),
    "another_runs_config": (_copy, ["--config.train.learning_rate=0.001"],
                            r"workdir .* holds another run \(its config.json differs: train.learning_rate: 0.002 -> "
                            r"0.001\): use a new --workdir, or pass --allow_config_change"),
    "num_steps_below_the_checkpoint": (_copy, ["--config.train.num_steps=1"],
                                       r"workdir .* is at step 2, past train.num_steps=1: raise "
                                       r"--config.train.num_steps"),
    "corrupt_checkpoint": (lambda s, n: _spoil(_copy(s, n), "corrupt"), [],
                           r"checkpoint .*/checkpoints/2 is unreadable \(.*\): delete it to resume from the one "
                           r"before, or use a new --workdir"),
    "partial_checkpoint": (lambda s, n: _spoil(_copy(s, n), "partial"), [],
                           r"checkpoint .*/checkpoints/2 is unreadable \(.*\): delete it"),
    "checkpoint_of_other_shapes": (_copy, ["--config.model.intermediate_size=96", "--allow_config_change"],
                                   r"checkpoint .*/checkpoints/2 holds a model of other shapes than this config builds "
                                   r"\(e.g. .*intermediate.* saved, .* here\)"),
    "tokenizer_vocab_mismatch": (_copy, ["--config.data.vocab_size=1000", "--config.data.data_dir={vocab1000}",
                                         "--allow_config_change"],
                                 r"checkpoint .*/checkpoints/2 has a 2000-token vocabulary but this run's tokenizer "
                                 r"and model have 1000"),
    "disk_full_while_saving": (None, [], r"saving a checkpoint under .*/checkpoints failed \(.*File too large.*\); "
                               r"the earlier checkpoints are intact", DISK_FULL),
}


@pytest.fixture(scope="module")
def results(tiny_data, setting, tmp_path_factory, request):
  """name -> (completed process, workdir, its files before), for the cases this session runs."""
  config, _ = tiny_data
  names = [item.callspec.params["name"] for item in request.session.items
           if item.module.__name__ == __name__ and hasattr(item, "callspec")]
  env = cli.env(tmp_path_factory.getbasetemp() / "jax_cache")

  def launch(name):
    make, flags, _, *shell_setup = CASES[name]
    workdir = make(setting, name) if make else setting["base"] / name
    before = _tree(workdir)
    flags = [f.format(**setting) for f in flags]
    return cli.run(env, config, workdir, *RUN, *flags, shell_setup="".join(shell_setup)), workdir, before

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    return dict(zip(names, pool.map(launch, names)))


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_clear_line(results, name):
  out, workdir, before = results[name]
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1, out.stderr[-3000:]
  if name == "disk_full_while_saving":  # Orbax's threads log the failed write (with tracebacks) around our line
    lines = [l for l in lines if l.startswith("electra-pretrain: ")]
  else:
    assert "Traceback" not in out.stderr
  assert lines[-1].startswith("electra-pretrain: error: "), lines[-1]
  assert re.search(CASES[name][2], lines[-1]), lines[-1]
  if name == "disk_full_while_saving":  # the run itself wrote config.json and metrics; no checkpoint, whole or part
    assert cli.checkpoint_dirs(workdir) == []
  else:
    assert _tree(workdir) == before
