#!/usr/bin/env bash
# autoresume.sh: run a training command under ft_launcher until it has finished.
# Run with --help for the options; docs/autoresume.md explains the design.
set -euo pipefail

readonly PROG=autoresume.sh
readonly HISTORY_HEADER=$'attempt\tjob_id\tstart\tend\texit_code\tflag\tfailures\tdecision'

# ft_launcher's exit codes (launcher/exit_codes.py).
readonly EXIT_SUCCESS=0
readonly EXIT_FAILURE=1
readonly EXIT_USAGE=2
readonly EXIT_SHUTDOWN_REQUESTED=64
readonly EXIT_NODE_EXCLUDED=65

usage() {
  cat <<'EOF'
Usage: autoresume.sh [OPTIONS] [--] TRAINING_SCRIPT [SCRIPT_ARGS...]

Runs TRAINING_SCRIPT under ft_launcher again and again until the finished flag file
($FAULT_TOL_FINISHED_FLAG_FILE, created by rank 0 when training is complete) exists.

Modes (--mode, default auto: "slurm" inside an sbatch job, "local" elsewhere):
  slurm  Inside an sbatch script. Starts one ft_launcher per node with srun, with
         --nnodes=$SLURM_NNODES and a c10d rendezvous on the first host of the allocation.
         After the launchers exit it decides (see below); to continue it requeues this job
         (scontrol requeue, same job id, same options) and exits. Submit with --requeue and
         --open-mode=append so that the job may be requeued and its log keeps every attempt;
         a job that cannot be requeued is refused at the start (exit 2).
  local  The same loop in place, on this machine: the next attempt starts right away.

Options (a flag beats its environment variable):
  -d, --run-dir DIR        where this script keeps its state: attempt count, consecutive
                           failures, history.tsv (one line per attempt) and, by default,
                           the flag file. Must be shared by all nodes.
                           [$AUTORESUME_RUN_DIR, else ./autoresume]
  -f, --flag-file PATH     finished flag file passed to the ranks
                           [$FAULT_TOL_FINISHED_FLAG_FILE, else RUN_DIR/finished.flag]
  -m, --max-failures N     stop after N consecutive failed attempts (N >= 1)
                           [$AUTORESUME_MAX_FAILURES, else 3]
      --max-attempts N     stop after N attempts in all, whatever their ending; 0 = no limit
                           [$AUTORESUME_MAX_ATTEMPTS, else 0]
  -a, --launcher-arg ARG   one argument for ft_launcher; repeat for more (kept exactly)
      --launcher-args STR  ft_launcher arguments split on white space, added before the -a ones
                           [$AUTORESUME_LAUNCHER_ARGS, else "--standalone" in local mode]
      --launcher PATH      the ft_launcher executable [$FT_LAUNCHER, else ft_launcher on PATH]
      --mode MODE          auto, slurm or local [$AUTORESUME_MODE, else auto]
      --rdzv-port PORT     slurm mode: c10d rendezvous port on the first host
                           [$AUTORESUME_RDZV_PORT, else a free port from 29500 + job id % 1000]
      --srun-args STR      slurm mode: extra srun arguments, split on white space
                           [$AUTORESUME_SRUN_ARGS]
  -h, --help               this text

In slurm mode the launcher gets, before your own arguments (so yours win):
  --nnodes=$SLURM_NNODES --rdzv-backend=c10d --rdzv-endpoint=ADDR:PORT (ADDR: the NodeAddr
  of the first node of the allocation, usually its host name)
  --rdzv-id=autoresume-$SLURM_JOB_ID-ATTEMPT
The ranks see FAULT_TOL_FINISHED_FLAG_FILE, AUTORESUME_ATTEMPT (1, 2, ...) and
AUTORESUME_RUN_DIR, plus the rest of the environment.

After each attempt (first match wins):
  flag file present          finished: exit 0 (whatever ft_launcher returned)
  launcher exit 64           ShutdownWorkload was requested by a rank: stop, exit 64
  launcher exit 2            usage error, nothing changes on retry: stop, exit 2
  SIGTERM/SIGINT/SIGHUP here stop, exit 128+N (a cancelled job stays cancelled); in slurm
                             mode after a warning signal (the time limit came before the
                             ranks stopped): as the warning below
  SIGUSR1/SIGUSR2 here       warning (walltime, preemption): forwarded to ft_launcher, which
                             forwards it to the ranks so they can checkpoint and exit;
                             continue, NOT counted as a failure
  launcher exit 0            stopped cleanly without the flag: continue, not a failure
  launcher exit 1            failure: continue while consecutive failures < --max-failures,
                             else stop, exit 1
  launcher exit 65           ExcludeThisNode: continue, counted as a failure
  launcher exit 128+N        the launcher died of signal N: continue, counted as a failure
  any other code             failure, as for 1
A continuation that is not a failure resets the consecutive failure count; so does a stop.
With several nodes the codes of all launchers are combined: 64 if any is 64, else 2 if any
is 2, else the highest. In slurm mode ask for the warning with sbatch
--signal=B:USR1@SECONDS (B: signals this script, which must be the batch shell or exec'd
by it); a signal sent to the job steps instead reaches the launchers and counts the same.

Exit codes of this script: 0 finished, or continuation requeued (slurm mode); 1 stopped after
failures, --max-attempts, or a failed requeue; 2 usage error (this script's or ft_launcher's);
64 ShutdownWorkload requested; 128+N stopped by signal N.

Examples:
  autoresume.sh --run-dir runs/a --launcher-args "--standalone --nproc-per-node 2" train.py --lr 0.1
  sbatch --requeue --open-mode=append --signal=B:USR1@120 -N 2 \
         autoresume.sh --launcher-args "--nproc-per-node 8 --max-restarts 2" train.py
EOF
}

# Builtins only (no `date`): after a requeue SLURM sends SIGTERM to every process of the job, and
# this script must still be able to write its history line then.
log() { printf '%(%Y-%m-%dT%H:%M:%S)T %s: %s\n' -1 "$PROG" "$*" >&2; }
usage_error() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  printf "Try '%s --help'.\n" "$PROG" >&2
  exit "$EXIT_USAGE"
}
die() { log "error: $*"; exit "$EXIT_FAILURE"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

# ------------------------------------------------------------------------------------ per node
# The task srun starts on every node, shipped with `declare -f` so that it works even where this
# file is not readable (an sbatch'ed copy of this script lives only on the batch host). It runs
# ft_launcher, forwards the warning and stop signals to it (srun hands them to us), and leaves
# "<node> <exit code> <warning signal or ->" in RESULTS/node.<SLURM_NODEID>.
autoresume_node_task() {
  local results=$1
  shift
  local node=${SLURMD_NODENAME:-$(hostname -s)} index=${SLURM_NODEID:-0}
  local child="" warned=- interrupted=0 rc=0
  trap 'warned=USR1; interrupted=1; [ -z "$child" ] || kill -USR1 "$child" 2>/dev/null || true' USR1
  trap 'warned=USR2; interrupted=1; [ -z "$child" ] || kill -USR2 "$child" 2>/dev/null || true' USR2
  trap 'interrupted=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true' TERM INT HUP
  "$@" &
  child=$!
  while :; do
    interrupted=0
    if wait "$child"; then rc=0; else rc=$?; fi
    [ "$interrupted" = 1 ] || break
  done
  printf '%s %s %s\n' "$node" "$rc" "$warned" > "$results/.node.$index.tmp"
  mv -f "$results/.node.$index.tmp" "$results/node.$index"
  return "$rc"
}

# ------------------------------------------------------------------------------------ options
RUN_DIR=${AUTORESUME_RUN_DIR:-}
FLAG_FILE=${FAULT_TOL_FINISHED_FLAG_FILE:-}
MAX_FAILURES=${AUTORESUME_MAX_FAILURES:-3}
MAX_ATTEMPTS=${AUTORESUME_MAX_ATTEMPTS:-0}
LAUNCHER_ARGS_STR=${AUTORESUME_LAUNCHER_ARGS-}
LAUNCHER_ARGS_SET=${AUTORESUME_LAUNCHER_ARGS+set}
LAUNCHER=${FT_LAUNCHER:-ft_launcher}
MODE=${AUTORESUME_MODE:-auto}
RDZV_PORT=${AUTORESUME_RDZV_PORT:-}
SRUN_ARGS_STR=${AUTORESUME_SRUN_ARGS:-}
EXTRA_LAUNCHER_ARGS=()
COMMAND=()

need_value() { [ "$2" -ge 2 ] || usage_error "option $1 needs a value"; }
parse_args() {
  while [ "$#" -gt 0 ]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      -d|--run-dir) need_value "$1" "$#"; RUN_DIR=$2; shift 2 ;;
      --run-dir=*) RUN_DIR=${1#*=}; shift ;;
      -f|--flag-file) need_value "$1" "$#"; FLAG_FILE=$2; shift 2 ;;
      --flag-file=*) FLAG_FILE=${1#*=}; shift ;;
      -m|--max-failures) need_value "$1" "$#"; MAX_FAILURES=$2; shift 2 ;;
      --max-failures=*) MAX_FAILURES=${1#*=}; shift ;;
      --max-attempts) need_value "$1" "$#"; MAX_ATTEMPTS=$2; shift 2 ;;
      --max-attempts=*) MAX_ATTEMPTS=${1#*=}; shift ;;
      -a|--launcher-arg) need_value "$1" "$#"; EXTRA_LAUNCHER_ARGS+=("$2"); shift 2 ;;
      --launcher-arg=*) EXTRA_LAUNCHER_ARGS+=("${1#*=}"); shift ;;
      --launcher-args) need_value "$1" "$#"; LAUNCHER_ARGS_STR=$2; LAUNCHER_ARGS_SET="set"; shift 2 ;;
      --launcher-args=*) LAUNCHER_ARGS_STR=${1#*=}; LAUNCHER_ARGS_SET="set"; shift ;;
      --launcher) need_value "$1" "$#"; LAUNCHER=$2; shift 2 ;;
      --launcher=*) LAUNCHER=${1#*=}; shift ;;
      --mode) need_value "$1" "$#"; MODE=$2; shift 2 ;;
      --mode=*) MODE=${1#*=}; shift ;;
      --rdzv-port) need_value "$1" "$#"; RDZV_PORT=$2; shift 2 ;;
      --rdzv-port=*) RDZV_PORT=${1#*=}; shift ;;
      --srun-args) need_value "$1" "$#"; SRUN_ARGS_STR=$2; shift 2 ;;
      --srun-args=*) SRUN_ARGS_STR=${1#*=}; shift ;;
      --) shift; COMMAND=("$@"); return 0 ;;
      -*) usage_error "unknown option '$1'" ;;
      *) COMMAND=("$@"); return 0 ;;
    esac
  done
}

validate() {
  [ "${#COMMAND[@]}" -gt 0 ] || usage_error "no training command given (TRAINING_SCRIPT [ARGS...])"
  { is_uint "$MAX_FAILURES" && [ "$MAX_FAILURES" -ge 1 ]; } \
    || usage_error "--max-failures (AUTORESUME_MAX_FAILURES) must be a whole number >= 1, got '$MAX_FAILURES'"
  is_uint "$MAX_ATTEMPTS" \
    || usage_error "--max-attempts (AUTORESUME_MAX_ATTEMPTS) must be a whole number (0 = no limit), got '$MAX_ATTEMPTS'"
  case "$MODE" in
    auto) if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${SLURM_STEP_ID:-}" ]; then MODE=slurm; else MODE=local; fi ;;
    slurm) [ -n "${SLURM_JOB_ID:-}" ] || usage_error "--mode slurm needs to run inside an sbatch job (SLURM_JOB_ID is not set)" ;;
    local) ;;
    *) usage_error "--mode (AUTORESUME_MODE) must be auto, slurm or local, got '$MODE'" ;;
  esac
  if [ -n "$RDZV_PORT" ]; then
    { is_uint "$RDZV_PORT" && [ "$RDZV_PORT" -ge 1 ] && [ "$RDZV_PORT" -le 65535 ]; } \
      || usage_error "--rdzv-port (AUTORESUME_RDZV_PORT) must be a TCP port 1-65535, got '$RDZV_PORT'"
  fi
  local resolved
  resolved=$(command -v -- "$LAUNCHER" 2>/dev/null) \
    || usage_error "ft_launcher not found: --launcher (FT_LAUNCHER) is '$LAUNCHER'"
  if [ ! -f "$resolved" ] || [ ! -x "$resolved" ]; then
    usage_error "--launcher (FT_LAUNCHER) '$LAUNCHER' is not an executable file"
  fi
  LAUNCHER=$(readlink -f -- "$resolved")

  RUN_DIR=${RUN_DIR:-autoresume}
  mkdir -p -- "$RUN_DIR" 2>/dev/null || usage_error "cannot create --run-dir (AUTORESUME_RUN_DIR) '$RUN_DIR'"
  RUN_DIR=$(cd -- "$RUN_DIR" && pwd -P)
  FLAG_FILE=${FLAG_FILE:-$RUN_DIR/finished.flag}
  [ "${FLAG_FILE:0:1}" = / ] || FLAG_FILE=$PWD/$FLAG_FILE
  [ -d "$(dirname -- "$FLAG_FILE")" ] \
    || usage_error "the directory of --flag-file (FAULT_TOL_FINISHED_FLAG_FILE) '$FLAG_FILE' does not exist"

  LAUNCHER_ARGS=()
  if [ -n "$LAUNCHER_ARGS_STR" ]; then read -r -a LAUNCHER_ARGS <<< "$LAUNCHER_ARGS_STR"; fi
  if [ "$MODE" = local ] && [ -z "$LAUNCHER_ARGS_SET" ] && [ "${#EXTRA_LAUNCHER_ARGS[@]}" = 0 ]; then
    LAUNCHER_ARGS=(--standalone)
  fi
  LAUNCHER_ARGS+=("${EXTRA_LAUNCHER_ARGS[@]}")
  SRUN_ARGS=()
  if [ -n "$SRUN_ARGS_STR" ]; then read -r -a SRUN_ARGS <<< "$SRUN_ARGS_STR"; fi
}

# ------------------------------------------------------------------------------------ state
# RUN_DIR/state holds key=value lines, replaced atomically (write a temporary file, rename).
ATTEMPT=0
FAILURES=0
RUNNING=0
RUNNING_START=-
RUNNING_JOB=-

read_state() {
  local file=$RUN_DIR/state key value
  [ -f "$file" ] || return 0
  while IFS='=' read -r key value; do
    case "$key" in
      attempt) if is_uint "$value"; then ATTEMPT=$value; fi ;;
      failures) if is_uint "$value"; then FAILURES=$value; fi ;;
      running) if [ "$value" = 1 ]; then RUNNING=1; fi ;;
      start) RUNNING_START=$value ;;
      job_id) RUNNING_JOB=$value ;;
    esac
  done < "$file"
  return 0
}

write_state() {   # running start job_id
  local tmp=$RUN_DIR/.state.$$.tmp
  printf 'attempt=%s\nfailures=%s\nrunning=%s\nstart=%s\njob_id=%s\n' \
    "$ATTEMPT" "$FAILURES" "$1" "$2" "$3" > "$tmp"
  mv -f -- "$tmp" "$RUN_DIR/state"
}

append_history() {   # attempt job_id start end exit_code flag failures decision
  local file=$RUN_DIR/history.tsv line
  [ -s "$file" ] || printf '%s\n' "$HISTORY_HEADER" >> "$file"
  printf -v line '%s\t' "$@"                    # builtins only, see log()
  printf '%s\n' "${line%$'\t'}" >> "$file"   # one write: lines never interleave
}

now() { printf '%(%Y-%m-%dT%H:%M:%S%z)T' -1; }
flag_present() { [ -e "$FLAG_FILE" ]; }

# ------------------------------------------------------------------------------------ signals
CHILD=""
WARNED=""        # SIGUSR1/SIGUSR2 when a warning arrived during this attempt
TERMINATED=""    # SIGTERM/SIGINT/SIGHUP when told to stop
INTERRUPTED=0
REQUEUEING=0

on_warning() {
  INTERRUPTED=1
  WARNED=SIG$1
  log "received SIG$1 (walltime or preemption warning); forwarding it to ft_launcher"
  if [ -n "$CHILD" ]; then kill -s "$1" "$CHILD" 2>/dev/null || true; fi
}
on_terminate() {
  INTERRUPTED=1
  if [ "$REQUEUEING" = 1 ]; then return 0; fi   # SLURM stopping the job we just requeued
  TERMINATED=SIG$1
  log "received SIG$1; stopping ft_launcher (SIGTERM)"
  # SIGTERM, not the original signal: a background child of a script ignores SIGINT.
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null || true; fi
}
trap 'on_warning USR1' USR1
trap 'on_warning USR2' USR2
trap 'on_terminate TERM' TERM
trap 'on_terminate INT' INT
trap 'on_terminate HUP' HUP

signal_number() { kill -l "$1"; }

wait_child() {   # -> CHILD_RC; keeps waiting when a trapped signal interrupts `wait`
  local rc
  while :; do
    INTERRUPTED=0
    if wait "$CHILD"; then rc=0; else rc=$?; fi
    [ "$INTERRUPTED" = 1 ] || break
  done
  CHILD=""
  CHILD_RC=$rc
}

# ------------------------------------------------------------------------------------ attempts
NODE_CODES=""   # "node:code ..." of the last slurm attempt, for the log

run_local_attempt() {
  log "attempt $ATTEMPT: $LAUNCHER ${LAUNCHER_ARGS[*]} ${COMMAND[*]}"
  "$LAUNCHER" "${LAUNCHER_ARGS[@]}" "${COMMAND[@]}" {LOCK_FD}>&- &
  CHILD=$!
  wait_child
  ATTEMPT_RC=$CHILD_RC
}

pick_rdzv_port() {
  local port
  if [ -n "$RDZV_PORT" ]; then printf '%s\n' "$RDZV_PORT"; return 0; fi
  port=$((29500 + SLURM_JOB_ID % 1000))
  # The batch shell runs on the first node, where the rendezvous store will listen: skip ports
  # that are taken there (another job, or a store that has not let go yet).
  if [ "$FIRST_HOST" = "${SLURMD_NODENAME:-}" ] && command -v ss >/dev/null 2>&1; then
    for _ in $(seq 100); do
      [ -z "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && break
      port=$((port + 1))
    done
  fi
  printf '%s\n' "$port"
}

run_slurm_attempt() {
  local nnodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}} port results srun_rc index
  local node code warned combined="" codes=()
  port=$(pick_rdzv_port)
  results=$RUN_DIR/nodes
  rm -rf -- "$results"
  mkdir -p -- "$results"
  local srun_cmd=(srun --nodes="$nnodes" --ntasks="$nnodes" --ntasks-per-node=1 --kill-on-bad-exit=0)
  if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then srun_cmd+=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi
  srun_cmd+=("${SRUN_ARGS[@]}")
  local launcher_cmd=("$LAUNCHER" --nnodes="$nnodes" --rdzv-backend=c10d
    --rdzv-endpoint="$RDZV_HOST:$port" --rdzv-id="autoresume-$SLURM_JOB_ID-$ATTEMPT"
    "${LAUNCHER_ARGS[@]}" "${COMMAND[@]}")
  log "attempt $ATTEMPT: $nnodes node(s), rendezvous on $FIRST_HOST ($RDZV_HOST:$port): ${launcher_cmd[*]}"
  "${srun_cmd[@]}" bash -c "$(declare -f autoresume_node_task)"$'\nautoresume_node_task "$@"' \
    autoresume-node "$results" "${launcher_cmd[@]}" {LOCK_FD}>&- &
  CHILD=$!
  wait_child
  srun_rc=$CHILD_RC
  NODE_CODES=""
  for index in $(seq 0 $((nnodes - 1))); do
    if [ -f "$results/node.$index" ] && read -r node code warned < "$results/node.$index" && is_uint "$code"; then
      if [ "$warned" != - ] && [ -z "$WARNED" ]; then WARNED=SIG$warned; fi
    else
      # No report: the task never started or was killed. srun's code is all we know.
      node="node$index"; code=$srun_rc
      [ "$code" != 0 ] || code=$EXIT_FAILURE
    fi
    codes+=("$code")
    NODE_CODES+="$node:$code "
  done
  rm -rf -- "$results"
  for code in "${codes[@]}"; do
    if [ "$code" = "$EXIT_SHUTDOWN_REQUESTED" ]; then combined=$code; break; fi
  done
  if [ -z "$combined" ]; then
    for code in "${codes[@]}"; do
      if [ "$code" = "$EXIT_USAGE" ]; then combined=$code; break; fi
    done
  fi
  if [ -z "$combined" ]; then
    combined=0
    for code in "${codes[@]}"; do [ "$code" -le "$combined" ] || combined=$code; done
  fi
  log "attempt $ATTEMPT: launchers exited ${NODE_CODES% } (srun $srun_rc)"
  ATTEMPT_RC=$combined
}

# Sets DECISION, VERDICT (finished|continue|stop), SCRIPT_RC and SHOWN_FAILURES from the
# launcher's code, the flag and the signals seen. FAILURES becomes the count to carry on with:
# 0 after a stop (a new submission starts afresh) or after an ending that was not a failure.
decide() {
  local rc=$1 failed=0
  if flag_present; then
    VERDICT=finished; SCRIPT_RC=0; DECISION="finished: flag file present"
    [ "$rc" = 0 ] || DECISION+=" (ft_launcher exited $rc)"
    FAILURES=0; SHOWN_FAILURES=0
    return 0
  fi
  if [ "$rc" = "$EXIT_SHUTDOWN_REQUESTED" ]; then
    VERDICT=stop; SCRIPT_RC=$EXIT_SHUTDOWN_REQUESTED
    DECISION="stop: a rank requested ShutdownWorkload (ft_launcher exit $rc)"
  elif [ "$rc" = "$EXIT_USAGE" ]; then
    VERDICT=stop; SCRIPT_RC=$EXIT_USAGE
    DECISION="stop: ft_launcher usage error (exit $rc); fix the command line"
  elif [ -n "$TERMINATED" ] && { [ -z "$WARNED" ] || [ "$MODE" = local ]; }; then
    VERDICT=stop; SCRIPT_RC=$((128 + $(signal_number "${TERMINATED#SIG}")))
    DECISION="stop: terminated by $TERMINATED (ft_launcher exit $rc)"
  elif [ -n "$WARNED" ]; then
    VERDICT="continue"; DECISION="continue: warning signal $WARNED, not a failure (ft_launcher exit $rc)"
  elif [ "$rc" = "$EXIT_SUCCESS" ]; then
    VERDICT="continue"; DECISION="continue: ft_launcher exited 0 without the flag, not a failure"
  else
    failed=1
    FAILURES=$((FAILURES + 1))
    local why="ft_launcher exit $rc"
    if [ "$rc" = "$EXIT_NODE_EXCLUDED" ]; then why+=", ExcludeThisNode"; fi
    if [ "$rc" -gt 128 ]; then why+=", killed by SIG$(kill -l "$((rc - 128))" 2>/dev/null || echo "$((rc - 128))")"; fi
    if [ "$FAILURES" -ge "$MAX_FAILURES" ]; then
      VERDICT=stop; SCRIPT_RC=$EXIT_FAILURE
      DECISION="stop: $FAILURES consecutive failures, the maximum ($why)"
    else
      VERDICT="continue"; DECISION="continue: failure $FAILURES of at most $MAX_FAILURES ($why)"
    fi
  fi
  if [ "$VERDICT" = continue ] && [ "$MAX_ATTEMPTS" -gt 0 ] && [ "$ATTEMPT" -ge "$MAX_ATTEMPTS" ]; then
    VERDICT=stop; SCRIPT_RC=$EXIT_FAILURE
    DECISION="stop: --max-attempts $MAX_ATTEMPTS reached (${DECISION#"continue: "})"
  fi
  SHOWN_FAILURES=$FAILURES   # the history shows the streak this attempt ended with
  if [ "$VERDICT" = stop ] || [ "$failed" = 0 ]; then FAILURES=0; fi
}

requeue_job() {   # -> 0 when SLURM accepted the requeue
  local out rc=0
  REQUEUEING=1
  out=$(timeout 60 scontrol requeue "$SLURM_JOB_ID" 2>&1) || rc=$?
  if [ "$rc" != 0 ]; then
    REQUEUEING=0
    log "error: 'scontrol requeue $SLURM_JOB_ID' failed (exit $rc): $out"
    return 1
  fi
  return 0
}

inspect_slurm_job() {
  local info
  info=$(timeout 60 scontrol show job "$SLURM_JOB_ID" 2>&1) \
    || die "cannot read job $SLURM_JOB_ID with scontrol: $info"
  if [[ "$info" == *"BatchFlag=0"* ]]; then
    usage_error "slurm mode runs in an sbatch job, but job $SLURM_JOB_ID is interactive (salloc/srun); use --mode local"
  fi
  if [[ "$info" == *"Requeue=0"* ]]; then
    usage_error "job $SLURM_JOB_ID cannot be requeued, so it cannot be continued: submit it with sbatch --requeue"
  fi
  local hosts
  hosts=$(timeout 60 scontrol show hostnames "${SLURM_JOB_NODELIST:-}") \
    || die "cannot expand the node list SLURM_JOB_NODELIST='${SLURM_JOB_NODELIST:-}'"
  FIRST_HOST=${hosts%%$'\n'*}
  [ -n "$FIRST_HOST" ] || die "empty node list in SLURM_JOB_NODELIST='${SLURM_JOB_NODELIST:-}'"
  # Rendezvous at the node's address as SLURM knows it: on clusters where node names do not
  # resolve, NodeAddr is what does. It equals the name where they do.
  local node_info
  node_info=$(timeout 60 scontrol show node -o "$FIRST_HOST" 2>/dev/null || true)
  RDZV_HOST=$FIRST_HOST
  if [[ "$node_info" =~ (^|[[:space:]])NodeAddr=([^[:space:]]+) ]]; then RDZV_HOST=${BASH_REMATCH[2]}; fi
}

# ------------------------------------------------------------------------------------ main
main() {
  parse_args "$@"
  validate

  exec {LOCK_FD}>>"$RUN_DIR/.lock"
  local lock_rc=0
  flock -n -E 75 "$LOCK_FD" || lock_rc=$?
  if [ "$lock_rc" = 75 ]; then
    die "run dir $RUN_DIR is in use by another autoresume.sh"
  elif [ "$lock_rc" != 0 ]; then
    log "warning: cannot lock $RUN_DIR/.lock (flock exit $lock_rc); make sure only one loop uses this run dir"
  fi

  local job_id=local
  if [ "$MODE" = slurm ]; then
    job_id=$SLURM_JOB_ID
    inspect_slurm_job
  fi
  read_state
  if [ "$RUNNING" = 1 ]; then
    # The previous run of this script died without recording its attempt (SIGKILL, node loss).
    FAILURES=$((FAILURES + 1))
    if [ "$FAILURES" -ge "$MAX_FAILURES" ]; then
      append_history "$ATTEMPT" "$RUNNING_JOB" "$RUNNING_START" - - "$(flag_present && echo yes || echo no)" \
        "$FAILURES" "stop: no record of how it ended (the script was killed); $FAILURES consecutive failures, the maximum"
      FAILURES=0
      write_state 0 - -
      die "attempt $ATTEMPT ended without a record and the maximum of $MAX_FAILURES consecutive failures is reached"
    fi
    append_history "$ATTEMPT" "$RUNNING_JOB" "$RUNNING_START" - - "$(flag_present && echo yes || echo no)" \
      "$FAILURES" "continue: no record of how it ended (the script was killed); failure $FAILURES of at most $MAX_FAILURES"
    write_state 0 - -
  fi
  if flag_present; then
    log "finished: $FLAG_FILE exists; nothing to run"
    exit 0
  fi

  export FAULT_TOL_FINISHED_FLAG_FILE=$FLAG_FILE
  export AUTORESUME_RUN_DIR=$RUN_DIR
  log "mode $MODE, run dir $RUN_DIR, flag file $FLAG_FILE, at most $MAX_FAILURES consecutive failures"
  local start end flag
  while :; do
    if [ -n "$TERMINATED" ]; then
      log "stopping before attempt $((ATTEMPT + 1)): received $TERMINATED"
      exit $((128 + $(signal_number "${TERMINATED#SIG}")))
    fi
    ATTEMPT=$((ATTEMPT + 1))
    export AUTORESUME_ATTEMPT=$ATTEMPT
    # Local mode: a warning applies to the attempt it arrived in. (Slurm mode runs one attempt
    # per job; a warning that came before it started still means "requeue after it".)
    if [ "$MODE" = local ]; then WARNED=""; fi
    start=$(now)
    write_state 1 "$start" "$job_id"
    log "attempt $ATTEMPT starts"
    if [ "$MODE" = slurm ]; then run_slurm_attempt; else run_local_attempt; fi
    end=$(now)
    decide "$ATTEMPT_RC"
    if flag_present; then flag=yes; else flag=no; fi
    write_state 0 - -
    if [ "$VERDICT" = continue ] && [ "$MODE" = slurm ]; then
      # From the requeue on, SLURM is stopping this job: only builtins below (see log()).
      if requeue_job; then
        DECISION+="; job $SLURM_JOB_ID requeued"
      else
        VERDICT=stop; SCRIPT_RC=$EXIT_FAILURE; FAILURES=0
        DECISION="stop: scontrol requeue failed (${DECISION#"continue: "})"
        write_state 0 - -
      fi
    fi
    append_history "$ATTEMPT" "$job_id" "$start" "$end" "$ATTEMPT_RC" "$flag" "$SHOWN_FAILURES" "$DECISION"
    log "attempt $ATTEMPT: $DECISION"
    case "$VERDICT" in
      finished) exit 0 ;;
      stop) exit "$SCRIPT_RC" ;;
    esac
    [ "$MODE" = slurm ] && exit 0   # the requeued job carries on
  done
}

main "$@"
