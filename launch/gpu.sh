#!/usr/bin/env bash
# Pre-train electra_jax on GPUs: one process per node drives all of that node's GPUs through the same mesh code as on
# TPU; several nodes join through jax.distributed. Run with --help; docs/launch.md has the commands.
set -euo pipefail

PROG=gpu.sh
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/common.sh
source "$LAUNCH_DIR/common.sh"

usage() {
  cat <<EOF
Usage: launch/gpu.sh --workdir DIR [flags] [-- electra-pretrain args]

Starts electra-pretrain on this node. On several nodes, run it once per node with the same --num-nodes and
--coordinator and that node's --node-rank (0 on the coordinator's node).

Flags (environment variable in brackets):
  --config FILE          config file [ELECTRA_CONFIG; default configs/small.py]
  --workdir DIR          training directory; on several nodes a shared one (gs:// or a shared file system)
                         [ELECTRA_WORKDIR]
  --gpus 0,1,...         use only these GPUs of the node [default: all]
  --num-nodes N          number of nodes [ELECTRA_NUM_NODES; default 1]
  --node-rank R          this node's rank, 0..N-1 [ELECTRA_NODE_RANK]
  --coordinator HOST:PORT
                         address of node 0, reachable from every node [ELECTRA_COORDINATOR]
  -n, --dry-run          print the command instead of running it
  -h, --help             show this help

XLA flags are kept only if the installed jaxlib accepts them (XLA aborts on flags it does not know): ELECTRA_PYTHON
is the Python asked [default: the python beside electra-pretrain, else python3].
EOF
}

NUM_NODES=${ELECTRA_NUM_NODES:-1}
NODE_RANK=${ELECTRA_NODE_RANK:-}
COORDINATOR=${ELECTRA_COORDINATOR:-}
GPUS=""

normalize_args "$@"
set -- "${ARGS[@]}"
while (($#)); do
  case $1 in
    --gpus) need_value "$@"; GPUS=$2; shift 2 ;;
    --num-nodes) need_value "$@"; NUM_NODES=$2; shift 2 ;;
    --node-rank) need_value "$@"; NODE_RANK=$2; shift 2 ;;
    --coordinator) need_value "$@"; COORDINATOR=$2; shift 2 ;;
    *) parse_common_flag "$@"; shift "$CONSUMED" ;;
  esac
done

[[ -n $WORKDIR ]] || die "no workdir: pass --workdir=DIR (or set ELECTRA_WORKDIR)"
[[ -z $GPUS || $GPUS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus takes GPU indices like 0,1,2,3, not $GPUS"
[[ $NUM_NODES =~ ^[1-9][0-9]*$ ]] || die "--num-nodes must be a positive whole number, not $NUM_NODES"

if ((NUM_NODES > 1)); then
  if ! [[ $NODE_RANK =~ ^[0-9]+$ ]] || ((NODE_RANK >= NUM_NODES)); then
    die "--node-rank must be this node's rank, 0..$((NUM_NODES - 1)), not '$NODE_RANK'"
  fi
  [[ $COORDINATOR =~ ^[^:]+:[0-9]+$ ]] || die "--coordinator must be HOST:PORT of node 0, not '$COORDINATOR'"
elif [[ -n $NODE_RANK || -n $COORDINATOR ]]; then
  die "--node-rank and --coordinator need --num-nodes greater than 1"
fi
((DRY_RUN)) || require_command electra-pretrain "install the package first: pip install -e ."

# The Python whose jaxlib runs the trainer: pip puts console scripts beside their interpreter.
python_for_jax() {
  local trainer
  trainer=$(command -v electra-pretrain || true)
  if [[ -n ${ELECTRA_PYTHON:-} ]]; then
    echo "$ELECTRA_PYTHON"
  elif [[ -n $trainer && -x ${trainer%/*}/python ]]; then
    echo "${trainer%/*}/python"
  else
    echo python3
  fi
}

# XLA aborts at start-up on a flag it does not know, and flags come and go between releases: a flag is kept only if
# that jaxlib starts with it (on its CPU backend; about a second).
xla_accepts() {
  XLA_FLAGS=$1 JAX_PLATFORMS=cpu "$PYTHON_FOR_JAX" -c 'import jax; jax.devices()' >/dev/null 2>&1
}

# JAX preallocates 75% of each GPU; the trainer is alone on them, so 90% leaves room for larger batches while keeping
# headroom for cuDNN/NCCL workspaces, which live outside JAX's pool. A value already in the environment wins.
envs=("XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}")
# GPUs this process drives: --gpus, else CUDA_VISIBLE_DEVICES, else what nvidia-smi lists (0: unknown).
if [[ -n $GPUS || -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  IFS=, read -ra visible <<<"${GPUS:-$CUDA_VISIBLE_DEVICES}"
  NUM_GPUS=${#visible[@]}
elif command -v nvidia-smi >/dev/null; then
  NUM_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
else
  NUM_GPUS=0
fi
# The latency-hiding scheduler overlaps the data/fsdp collectives (gradient reduce, parameter gather) with compute;
# XLA leaves it off by default. One GPU has no collectives: there the flag would only compile another program than
# the one electra-bench times (and miss the compilation cache it filled). Flags already in XLA_FLAGS come after
# ours, so they win.
wanted_xla_flags=()
((NUM_NODES == 1 && NUM_GPUS < 2)) || wanted_xla_flags+=(--xla_gpu_enable_latency_hiding_scheduler=true)
PYTHON_FOR_JAX=$(python_for_jax)
xla_flags=()
for flag in ${wanted_xla_flags[@]+"${wanted_xla_flags[@]}"}; do
  if xla_accepts "$flag"; then
    xla_flags+=("$flag")
  else
    warn "leaving out XLA flag $flag: the jaxlib of $PYTHON_FOR_JAX does not accept it (or jax does not import there)"
  fi
done
[[ -z ${XLA_FLAGS:-} ]] || xla_flags+=("$XLA_FLAGS")
((${#xla_flags[@]} == 0)) || envs+=("XLA_FLAGS=${xla_flags[*]}")
[[ -z $GPUS ]] || envs+=("CUDA_VISIBLE_DEVICES=$GPUS")
if ((NUM_NODES > 1)); then
  # Read by electra-pretrain, which passes them to jax.distributed.initialize().
  envs+=("JAX_COORDINATOR_ADDRESS=$COORDINATOR" "JAX_NUM_PROCESSES=$NUM_NODES" "JAX_PROCESS_ID=$NODE_RANK")
fi

cmd=(env "${envs[@]}" electra-pretrain --config="$CONFIG" --workdir="$WORKDIR" "${EXTRA[@]}")
if ((DRY_RUN)); then
  shell_join "${cmd[@]}"
else
  exec "${cmd[@]}"  # exec, so a scheduler's SIGTERM reaches the trainer itself
fi
