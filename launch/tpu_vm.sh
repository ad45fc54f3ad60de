#!/usr/bin/env bash
# Pre-train electra_jax on a Cloud TPU VM or pod slice through gcloud.
# Run with --help; docs/launch.md has a walk-through.
# Remote commands are single-quoted on purpose: $HOME and $(...) in them expand on the TPU workers, not here.
# shellcheck disable=SC2016
set -euo pipefail

PROG=tpu_vm.sh
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$LAUNCH_DIR")
# shellcheck source=launch/common.sh
source "$LAUNCH_DIR/common.sh"

usage() {
  cat <<EOF
Usage: launch/tpu_vm.sh <create|setup|train|logs|ssh|stop|delete> [flags] [-- args]

  create   create the TPU VM (or pod slice)
  setup    copy this checkout's HEAD commit to every worker and install it with jax[tpu]
  train    start electra-pretrain on every worker in the background (args after -- go to electra-pretrain);
           with --watch, stay in the foreground and re-create the VM, set it up and restart training
           whenever it is preempted (training resumes from the gs:// workdir)
  logs     follow the training log of one worker (default 0)
  ssh      open a shell on one worker, or run the command given after --
  stop     stop training on every worker
  delete   delete the TPU VM

Flags (environment variable in brackets):
  --project ID       Google Cloud project [ELECTRA_PROJECT; else gcloud's configured project]
  --zone ZONE        [ELECTRA_ZONE; default us-central1-a]
  --name NAME        TPU VM name [ELECTRA_TPU_NAME; default electra]
  --type TYPE        accelerator type, e.g. v3-8, v3-32, v4-8, v5litepod-8 (alias v5e-8), v5p-8, v6e-8
                     [ELECTRA_TPU_TYPE; default v3-8]
  --version VERSION  TPU software version [ELECTRA_TPU_VERSION; default chosen by the type's generation]
  --spot, --preemptible
                     create a spot or preemptible VM [ELECTRA_TPU_PROVISIONING=spot|preemptible|standard]
  --config FILE      config file, relative to the repository [ELECTRA_CONFIG; default configs/small.py]
  --workdir gs://..  training directory, required by train [ELECTRA_WORKDIR]
  --worker N         worker for logs and ssh (ssh also takes all) [default 0]
  --skip-compile-check
                     create and train first compile the config's steps for --type on this machine
                     (electra-compile, the tpu extra): a batch that does not fit fails here, before
                     a slice is booked; this skips that [ELECTRA_COMPILE_CHECK=0]
  --watch            train: keep the run alive across preemptions
  --interval SECS    train --watch: seconds between checks [ELECTRA_WATCH_INTERVAL; default 300]
  -n, --dry-run      print each command instead of running it
  -h, --help         show this help
EOF
}

PROJECT=${ELECTRA_PROJECT:-}
ZONE=${ELECTRA_ZONE:-us-central1-a}  # offers v3-8 and v5e; v3 pods are in europe-west4-a, v4 in us-central2-b
NAME=${ELECTRA_TPU_NAME:-electra}
TYPE=${ELECTRA_TPU_TYPE:-v3-8}
VERSION=${ELECTRA_TPU_VERSION:-}
PROVISIONING=${ELECTRA_TPU_PROVISIONING:-standard}
INTERVAL=${ELECTRA_WATCH_INTERVAL:-300}
COMPILE_CHECK=${ELECTRA_COMPILE_CHECK:-1}
WORKER=""
WATCH=0
COMMAND=""

# Paths on the workers. TPU images ship Python 3.10 and the package needs >= 3.11, so setup builds a uv venv.
readonly REMOTE_PYTHON=3.12
readonly LOG='"$HOME/electra_logs/train.log"'
readonly PIDFILE='"$HOME/electra_logs/train.pid"'
# Replacing the code or starting a second trainer under a running one would break it.
readonly REFUSE_IF_RUNNING='if [ -f '"$PIDFILE"' ] && kill -0 "$(cat '"$PIDFILE"')" 2>/dev/null; then
  echo "electra-pretrain is running on $(hostname); run stop first" >&2
  exit 1
fi'

normalize_args "$@"
set -- "${ARGS[@]}"
while (($#)); do
  case $1 in
    create | setup | train | logs | ssh | stop | delete)
      [[ -z $COMMAND ]] || die "two subcommands given: $COMMAND and $1"
      COMMAND=$1; shift ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --type | --accelerator-type) need_value "$@"; TYPE=$2; shift 2 ;;
    --version | --runtime-version) need_value "$@"; VERSION=$2; shift 2 ;;
    --spot) PROVISIONING=spot; shift ;;
    --preemptible) PROVISIONING=preemptible; shift ;;
    --worker) need_value "$@"; WORKER=$2; shift 2 ;;
    --watch) WATCH=1; shift ;;
    --skip-compile-check) COMPILE_CHECK=0; shift ;;
    --interval) need_value "$@"; INTERVAL=$2; shift 2 ;;
    -*) parse_common_flag "$@"; shift "$CONSUMED" ;;
    *) die "unknown subcommand: $1 (expected create, setup, train, logs, ssh, stop or delete)" ;;
  esac
done

[[ -n $COMMAND ]] || die "no subcommand given (expected create, setup, train, logs, ssh, stop or delete; see --help)"
((DRY_RUN)) || require_command gcloud "install the Google Cloud SDK: https://cloud.google.com/sdk/docs/install"
if [[ -z $PROJECT ]] && ! ((DRY_RUN)); then
  PROJECT=$(gcloud config get-value project 2>/dev/null || true)
  [[ $PROJECT != "(unset)" ]] || PROJECT=""
fi
[[ -n $PROJECT ]] || die "no project: pass --project or set ELECTRA_PROJECT (or run: gcloud config set project ID)"

# gcloud names v5e slices v5litepod-N.
[[ $TYPE != v5e-* ]] || TYPE=v5litepod-${TYPE#v5e-}
[[ $TYPE =~ ^v[0-9a-z]+-[0-9]+$ ]] || die "bad accelerator type: $TYPE (expected e.g. v3-8, v4-32, v5litepod-16)"
if [[ -z $VERSION ]]; then
  # The software versions Google recommends for JAX per TPU generation (cloud.google.com/tpu/docs/runtimes).
  case $TYPE in
    v2-* | v3-* | v4-*) VERSION=tpu-ubuntu2204-base ;;
    v5litepod-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) die "no default software version for $TYPE; pass --version" ;;
  esac
fi
# Every type above 8 cores/chips spans several hosts, which share nothing but gs://.
MULTI_HOST=0
((${TYPE##*-} <= 8)) || MULTI_HOST=1
case $PROVISIONING in
  standard | spot | preemptible) ;;
  *) die "ELECTRA_TPU_PROVISIONING must be spot, preemptible or standard, not $PROVISIONING" ;;
esac
[[ $INTERVAL =~ ^[0-9]+$ ]] || die "--interval needs whole seconds, not $INTERVAL"
[[ -z $WORKER || $COMMAND == logs || $COMMAND == ssh ]] || die "--worker applies to logs and ssh only"
[[ $WORKER != all || $COMMAND == ssh ]] || die "logs follows one worker; pass --worker=N"
WORKER=${WORKER:-0}
((!WATCH)) || [[ $COMMAND == train ]] || die "--watch applies to train only"
((${#EXTRA[@]} == 0)) || [[ $COMMAND == train || $COMMAND == ssh ]] ||
  die "arguments after -- apply to train and ssh only"

if [[ $COMMAND == train ]]; then
  [[ -n $WORKDIR ]] || die "train needs --workdir=gs://BUCKET/PATH (or ELECTRA_WORKDIR)"
  if [[ $WORKDIR != gs://* ]]; then
    ((!MULTI_HOST)) || die "$TYPE has several hosts: --workdir must be on gs://, not $WORKDIR"
    ((!WATCH)) || die "--watch re-creates the VM and loses its disk: --workdir must be on gs://, not $WORKDIR"
  fi
  for arg in "${EXTRA[@]}"; do
    if ((MULTI_HOST)) && [[ $arg == --config.data.data_dir=* && $arg != --config.data.data_dir=gs://* ]]; then
      die "$TYPE has several hosts: data.data_dir must be on gs://, not ${arg#*=}"
    fi
  done
fi

# Compiles the config's steps for $TYPE here, from shapes alone (electra-compile): a config that does not fit the
# slice ends in one line naming the batch that does, before a VM is created or training starts. gs:// overrides are
# left out: the compiler reads no data.
compile_check() {
  ((COMPILE_CHECK)) || return 0
  local overrides=() arg
  for arg in "${EXTRA[@]}"; do
    [[ $arg != --config.* || $arg == *=gs://* ]] || overrides+=("$arg")
  done
  ((DRY_RUN)) || require_command electra-compile \
    "install electra_jax with the tpu extra here (pip install -e '.[tpu]'), or pass --skip-compile-check"
  run_cmd electra-compile --config="$REPO/$CONFIG" --tpu="$TYPE" "${overrides[@]}" ||
    die "the compile check failed (above); fix the config or pass --skip-compile-check"
}

# gcloud compute tpus tpu-vm VERB ARGS..., always with the zone and project.
tpu() {
  local verb=$1
  shift
  run_cmd gcloud compute tpus tpu-vm "$verb" "$@" --zone="$ZONE" --project="$PROJECT"
}

create() {
  local provisioning=()
  [[ $PROVISIONING == standard ]] || provisioning=("--$PROVISIONING")
  tpu create "$NAME" --accelerator-type="$TYPE" --version="$VERSION" "${provisioning[@]}"
}

# Ships the HEAD commit (not the working tree, so every worker runs a commit you can name) and installs it.
setup() {
  require_command git "setup ships the current git commit"
  local sha tarball
  sha=$(git -C "$REPO" rev-parse HEAD 2>/dev/null) ||
    die "setup ships the current git commit; $REPO is not a git checkout"
  [[ -z $(git -C "$REPO" status --porcelain --untracked-files=no) ]] ||
    warn "uncommitted changes are not shipped; installing commit ${sha:0:12}"
  tarball=${TMPDIR:-/tmp}/electra_jax-$sha.tar.gz
  run_cmd git -C "$REPO" archive --format=tar.gz --output="$tarball" "$sha" &&
    tpu scp "$tarball" "$NAME:electra_jax.tar.gz" --worker=all &&
    tpu ssh "$NAME" --worker=all --command='set -eu
'"$REFUSE_IF_RUNNING"'
rm -rf "$HOME/electra_jax" "$HOME/electra_venv"
mkdir -p "$HOME/electra_jax"
tar -xzf "$HOME/electra_jax.tar.gz" -C "$HOME/electra_jax"
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user --quiet --upgrade uv
"$HOME/.local/bin/uv" venv --python '"$REMOTE_PYTHON"' "$HOME/electra_venv"
"$HOME/.local/bin/uv" pip install --python "$HOME/electra_venv/bin/python" "$HOME/electra_jax[prepare,gcs]" "jax[tpu]"
echo "electra_jax '"${sha:0:12}"' installed on $(hostname)"'
}

# setsid + nohup detach the trainer from the ssh session; its pid is kept to stop it, the log is appended across runs.
# A gs:// workdir also holds the compilation cache, so every worker and every restart after a preemption loads the
# compiled steps instead of compiling them again.
train() {
  local args cache=""
  args=$(shell_join --config="$CONFIG" --workdir="$WORKDIR" "${EXTRA[@]}")
  [[ $WORKDIR != gs://* ]] || cache="JAX_COMPILATION_CACHE_DIR=$(shell_join "${WORKDIR%/}/xla_cache") "
  tpu ssh "$NAME" --worker=all --command='set -eu
mkdir -p "$HOME/electra_logs"
cd "$HOME/electra_jax"
'"$REFUSE_IF_RUNNING"'
echo "== $(date -u +%FT%TZ) electra-pretrain" '"$args"' >> '"$LOG"'
'"$cache"'nohup setsid "$HOME/electra_venv/bin/electra-pretrain" '"$args"' >> '"$LOG"' 2>&1 < /dev/null &
echo $! > '"$PIDFILE"'
echo "electra-pretrain started on $(hostname), log: ~/electra_logs/train.log"'
}

# TERM first: a trainer in the middle of a checkpoint gets two minutes to finish it.
stop() {
  tpu ssh "$NAME" --worker=all --command='[ -f '"$PIDFILE"' ] || exit 0
pid=$(cat '"$PIDFILE"')
kill -TERM -- "-$pid" 2>/dev/null || true
for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
kill -KILL -- "-$pid" 2>/dev/null || true
rm -f '"$PIDFILE"'
echo "electra-pretrain stopped on $(hostname)"'
}

# Brings a fresh VM to training; returns non-zero (the watcher retries later) when any step fails, e.g. no capacity.
provision() {
  create && setup && train
}

# Polls the VM; after a preemption deletes it, creates it again, sets it up and restarts training, which resumes from
# the gs:// workdir. Ends when the trainer on worker 0 has exited on a healthy VM (finished, or failed: see logs).
watch_preemptions() {
  if ((DRY_RUN)); then
    echo "# --watch: every $INTERVAL s describe $NAME;" \
      "when PREEMPTED or TERMINATED: delete --quiet, create, setup, train"
    return
  fi
  local state pending=0 rc
  while true; do
    sleep "$INTERVAL"
    state=$(tpu describe "$NAME" --format='value(state)') || state=UNKNOWN
    case $state in
      PREEMPTED | TERMINATED | STOPPED)
        warn "$(date -u +%FT%TZ) $NAME is $state: re-creating it"
        tpu delete "$NAME" --quiet || warn "delete failed; trying create anyway"
        pending=1 ;;
      READY) ;;
      UNKNOWN)
        warn "$(date -u +%FT%TZ) cannot describe $NAME; will create it if it is gone"
        pending=1 ;;
      *) continue ;;  # CREATING, STARTING, REPAIRING...: wait for it to settle
    esac
    if ((pending)); then
      if provision; then pending=0; else warn "re-creating $NAME failed; retrying in $INTERVAL s"; fi
      continue
    fi
    rc=0
    tpu ssh "$NAME" --worker=0 --command='kill -0 "$(cat '"$PIDFILE"')"' || rc=$?
    case $rc in
      0) ;;
      1)
        echo "$PROG: electra-pretrain is no longer running on worker 0 (finished or failed); see: $PROG logs"
        return ;;
      *) warn "$(date -u +%FT%TZ) ssh to worker 0 failed (exit $rc); checking again in $INTERVAL s" ;;
    esac
  done
}

case $COMMAND in
  create) compile_check && create ;;
  setup) setup ;;
  train)
    compile_check
    train
    ((!WATCH)) || watch_preemptions ;;
  logs) tpu ssh "$NAME" --worker="$WORKER" --command='tail -n 100 -F '"$LOG" ;;
  ssh)
    remote=()
    ((${#EXTRA[@]} == 0)) || remote=(--command="${EXTRA[*]}")
    tpu ssh "$NAME" --worker="$WORKER" "${remote[@]}" ;;
  stop) stop ;;
  delete) tpu delete "$NAME" ;;
esac
