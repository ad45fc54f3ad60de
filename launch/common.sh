# Helpers shared by launch/tpu_vm.sh and launch/gpu.sh; sourced, never run.
# The sourcing script sets PROG (its name, for messages) and defines usage().
# shellcheck shell=bash
# The settings below are read by the sourcing script, which shellcheck does not see from here.
# shellcheck disable=SC2034

DRY_RUN=0
CONFIG=${ELECTRA_CONFIG:-configs/small.py}
WORKDIR=${ELECTRA_WORKDIR:-}
EXTRA=()  # words after `--`

die() {
  echo "$PROG: error: $*" >&2
  exit 2
}

warn() {
  echo "$PROG: $*" >&2
}

# Quotes words so the printed line can be pasted into a shell (and read by shlex.split) unchanged.
shell_join() {
  local out=() word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=("$word")
    else
      out+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

# Runs a command, or under --dry-run prints it instead.
run_cmd() {
  if ((DRY_RUN)); then
    shell_join "$@"
  else
    "$@"
  fi
}

require_command() {
  command -v "$1" >/dev/null || die "$1 not found on PATH; $2"
}

# Splits --flag=value into --flag value (up to `--`), so each parser handles one form. Result in ARGS.
normalize_args() {
  ARGS=()
  while (($#)); do
    case $1 in
      --) ARGS+=("$@"); return ;;
      --*=*) ARGS+=("${1%%=*}" "${1#*=}") ;;
      *) ARGS+=("$1") ;;
    esac
    shift
  done
}

need_value() {
  (($# >= 2)) || die "$1 needs a value"
}

# Parses the flags both launchers share; sets CONSUMED to the number of words used.
parse_common_flag() {
  CONSUMED=1
  case $1 in
    -n | --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    --config) need_value "$@"; CONFIG=$2; CONSUMED=2 ;;
    --workdir) need_value "$@"; WORKDIR=$2; CONSUMED=2 ;;
    --) EXTRA=("${@:2}"); CONSUMED=$# ;;
    -*) die "unknown flag: $1 (see --help)" ;;
    *) die "unexpected argument: $1 (see --help)" ;;
  esac
}
