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
readonly EXIT_SIGNAL_BASE=128  # stopped by signal N: EXIT_SIGNAL_BASE + N
# This script's own code (launcher/exit_codes.py, AUTORESUME_EXIT_NO_PROGRESS).
readonly EXIT_NO_PROGRESS=3

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
  -m, --max-failures N     stop after N consecutive failed attempts (1 <= N <= 1000000)
                           [$AUTORESUME_MAX_FAILURES, else 3]
      --max-attempts N     stop after N attempts in all, whatever their ending; 0 = no limit
                           (N <= 1000000) [$AUTORESUME_MAX_ATTEMPTS, else 0]
  -a, --launcher-arg ARG   one argument for ft_launcher; repeat for more (kept exactly)
      --launcher-args STR  ft_launcher arguments split on white space, added before the -a ones
                           [$AUTORESUME_LAUNCHER_ARGS, else "--standalone" in local mode]
      --launcher PATH      the ft_launcher executable [$FT_LAUNCHER, else ft_launcher on PATH]
      --mode MODE          auto, slurm or local [$AUTORESUME_MODE, else auto]
      --rdzv-port PORT     slurm mode: c10d rendezvous port on the first host
                           [$AUTORESUME_RDZV_PORT, else a free port from 29500 + job id % 1000]
      --srun-args STR      slurm mode: extra srun arguments, split on white space
                           [$AUTORESUME_SRUN_ARGS]
      --max-excluded N     slurm mode: exclude at most N nodes that caused failures (a node
                           whose launcher never reported, i.e. a lost node, one that exited 65,
                           ExcludeThisNode, or the node of the failure's root rank) from the
                           requeued job; 0 = never
                           [$AUTORESUME_MAX_EXCLUDED, else 4]
      --progress-path P    a checkpoint file or directory: an attempt made progress when a
                           file under P is newer than before it [$AUTORESUME_PROGRESS_PATH]
      --max-stalled N      with --progress-path: stop with exit 3 after N consecutive failed
                           attempts without progress [$AUTORESUME_MAX_STALLED, else 2]
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
  SIGTERM/SIGINT/SIGHUP here stop, exit 128+N (a cancelled job stays cancelled), whatever
                             ft_launcher returned (0 if its ranks stopped in time, else 1);
                             in slurm mode also a stop signal sent to the job steps only, and
                             after a warning signal (the time limit came before the ranks
                             stopped): as the warning below
  SIGUSR1/SIGUSR2 here       warning (walltime, preemption): forwarded to ft_launcher, which
                             forwards it to the ranks so they can checkpoint and exit;
                             continue, NOT counted as a failure
  launcher exit 0            stopped cleanly without the flag: continue, not a failure
  launcher exit 1            failure: continue while consecutive failures < --max-failures,
                             else stop, exit 1
  launcher exit 65           ExcludeThisNode: continue, counted as a failure
  launcher exit 128+N        the launcher's stop by signal N was forced (a third stop signal)
                             or it died of signal N: continue, counted as a failure
  any other code             failure, as for 1
A continuation that is not a failure resets the consecutive failure count; so does a stop.
With several nodes the codes of all launchers are combined: 64 if any is 64, else 2 if any
is 2, else the highest. In slurm mode ask for the warning with sbatch
--signal=B:USR1@SECONDS (B: signals this script, which must be the batch shell or exec'd
by it); a signal sent to the job steps instead reaches the launchers and counts the same.

Exit codes of this script: 0 finished, or continuation requeued (slurm mode); 1 stopped after
failures, --max-attempts, or a failed requeue; 2 usage error (this script's or ft_launcher's);
3 no progress (--max-stalled failed attempts without a newer file under --progress-path);
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
# A whole number of at most 9 digits (bash arithmetic wraps around silently past 2^63).
is_uint() { [[ "$1" =~ ^[0-9]{1,9}$ ]]; }
readonly MAX_COUNT=1000000   # bound of --max-failures and --max-attempts

# ------------------------------------------------------------------------------------ per node
# The task srun starts on every node, shipped with `declare -f` so that it works even where this
# file is not readable (an sbatch'ed copy of this script lives only on the batch host). It runs
# ft_launcher and leaves "<node> <exit code> <warning signal or -> <stop signal or -> <root nodes
# or -> <host name>" in RESULTS/node.<SLURM_NODEID>: the root nodes are the host names the
# launcher's records name as the cause of the failure that ended its run (FT_LAUNCHER_RESULT_FILE).
# It passes no signal on: SLURM signals every process of the step (srun relays what it gets to
# the whole step), ft_launcher included, and a second copy from here would reach the launcher
# (and its workers) twice. FT_LAUNCHER_PARENT_PID: ft_launcher stops if this task dies.
autoresume_node_task() {
  local results=$1
  shift
  local node=${SLURMD_NODENAME:-$(hostname -s)} index=${SLURM_NODEID:-0}
  local warned=- stopped=- interrupted=0 rc=0 child roots=- key value host=""
  local result_file=$results/.launcher.$index
  trap 'warned=USR1; interrupted=1' USR1
  trap 'warned=USR2; interrupted=1' USR2
  trap 'stopped=TERM; interrupted=1' TERM
  trap 'stopped=INT; interrupted=1' INT
  trap 'stopped=HUP; interrupted=1' HUP
  FT_LAUNCHER_PARENT_PID=$$ FT_LAUNCHER_RESULT_FILE=$result_file "$@" &
  child=$!
  while :; do
    interrupted=0
    if wait "$child"; then rc=0; else rc=$?; fi
    [ "$interrupted" = 1 ] || break
  done
  if [ -f "$result_file" ]; then
    while IFS='=' read -r key value; do
      if [ "$key" = root_nodes ] && [[ "$value" =~ ^[A-Za-z0-9._,-]{1,4096}$ ]]; then roots=$value; fi
    done < "$result_file"
    rm -f -- "$result_file"
  fi
  # The kernel's host name, as the launcher's records have it (SLURM may set $HOSTNAME to the
  # node's SLURM name).
  read -r host < /proc/sys/kernel/hostname 2>/dev/null || host=$(hostname)
  printf '%s %s %s %s %s %s\n' "$node" "$rc" "$warned" "$stopped" "$roots" "${host:-$node}" \
    > "$results/.node.$index.tmp"
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
MAX_EXCLUDED=${AUTORESUME_MAX_EXCLUDED:-4}
PROGRESS_PATH=${AUTORESUME_PROGRESS_PATH:-}
MAX_STALLED=${AUTORESUME_MAX_STALLED:-2}
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
      --max-excluded) need_value "$1" "$#"; MAX_EXCLUDED=$2; shift 2 ;;
      --max-excluded=*) MAX_EXCLUDED=${1#*=}; shift ;;
      --progress-path) need_value "$1" "$#"; PROGRESS_PATH=$2; shift 2 ;;
      --progress-path=*) PROGRESS_PATH=${1#*=}; shift ;;
      --max-stalled) need_value "$1" "$#"; MAX_STALLED=$2; shift 2 ;;
      --max-stalled=*) MAX_STALLED=${1#*=}; shift ;;
      --) shift; COMMAND=("$@"); return 0 ;;
      -*) usage_error "unknown option '$1'" ;;
      *) COMMAND=("$@"); return 0 ;;
    esac
  done
}

validate() {
  [ "${#COMMAND[@]}" -gt 0 ] || usage_error "no training command given (TRAINING_SCRIPT [ARGS...])"
  { is_uint "$MAX_FAILURES" && [ "$MAX_FAILURES" -ge 1 ] && [ "$MAX_FAILURES" -le "$MAX_COUNT" ]; } \
    || usage_error "--max-failures (AUTORESUME_MAX_FAILURES) must be a whole number >= 1 and <= $MAX_COUNT, got '$MAX_FAILURES'"
  { is_uint "$MAX_ATTEMPTS" && [ "$MAX_ATTEMPTS" -le "$MAX_COUNT" ]; } \
    || usage_error "--max-attempts (AUTORESUME_MAX_ATTEMPTS) must be a whole number <= $MAX_COUNT (0 = no limit), got '$MAX_ATTEMPTS'"
  MAX_FAILURES=$((10#$MAX_FAILURES)); MAX_ATTEMPTS=$((10#$MAX_ATTEMPTS))   # "010" is 10
  { is_uint "$MAX_EXCLUDED" && [ "$MAX_EXCLUDED" -le 1000 ]; } \
    || usage_error "--max-excluded (AUTORESUME_MAX_EXCLUDED) must be a whole number <= 1000, got '$MAX_EXCLUDED'"
  { is_uint "$MAX_STALLED" && [ "$MAX_STALLED" -ge 1 ] && [ "$MAX_STALLED" -le "$MAX_COUNT" ]; } \
    || usage_error "--max-stalled (AUTORESUME_MAX_STALLED) must be a whole number >= 1 and <= $MAX_COUNT, got '$MAX_STALLED'"
  MAX_EXCLUDED=$((10#$MAX_EXCLUDED)); MAX_STALLED=$((10#$MAX_STALLED))
  case "$MODE" in
    auto) if [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${SLURM_STEP_ID:-}" ]; then MODE=slurm; else MODE=local; fi ;;
    slurm) [ -n "${SLURM_JOB_ID:-}" ] || usage_error "--mode slurm needs to run inside an sbatch job (SLURM_JOB_ID is not set)" ;;
    local) ;;
    *) usage_error "--mode (AUTORESUME_MODE) must be auto, slurm or local, got '$MODE'" ;;
  esac
  if [ -n "$RDZV_PORT" ]; then
    { is_uint "$RDZV_PORT" && [ "$((10#$RDZV_PORT))" -ge 1 ] && [ "$((10#$RDZV_PORT))" -le 65535 ]; } \
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
      attempt) if is_uint "$value"; then ATTEMPT=$((10#$value)); fi ;;
      failures) if is_uint "$value"; then FAILURES=$((10#$value)); fi ;;
      running) if [ "$value" = 1 ]; then RUNNING=1; fi ;;
      start) RUNNING_START=$value ;;
      job_id) RUNNING_JOB=$value ;;
      stalled) if is_uint "$value"; then STALLED=$((10#$value)); fi ;;
    esac
  done < "$file"
  return 0
}

write_state() {   # running start job_id
  local tmp=$RUN_DIR/.state.$$.tmp
  printf 'attempt=%s\nfailures=%s\nrunning=%s\nstart=%s\njob_id=%s\nstalled=%s\n' \
    "$ATTEMPT" "$FAILURES" "$1" "$2" "$3" "$STALLED" > "$tmp"
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

# util-linux's setsid runs a command in a new session (in place: a background job of a script is
# not a process group leader, so $! is the launcher's pid). Without it the launcher shares our
# process group, and a signal to the whole group reaches it twice (directly, and from us).
SETSID=""
if command -v setsid >/dev/null 2>&1; then SETSID=setsid; fi

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
  # ft_launcher runs in a session of its own, so that a terminal's Ctrl-C (or any signal to this
  # script's process group) reaches only this script, which passes it on once. It stops when this
  # script dies, even by SIGKILL (FT_LAUNCHER_PARENT_PID), and it and its sentinel keep the
  # run-dir lock (FT_LAUNCHER_KEEP_FD) until every process of the attempt is gone.
  FT_LAUNCHER_PARENT_PID=$$ FT_LAUNCHER_KEEP_FD=$LOCK_FD $SETSID "$LAUNCHER" "${LAUNCHER_ARGS[@]}" "${COMMAND[@]}" &
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
  local node code warned stopped roots host combined="" codes=() lost="" named="" hosts=" "
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
    if [ -f "$results/node.$index" ] && read -r node code warned stopped roots host < "$results/node.$index" \
        && is_uint "$code"; then
      hosts+="$host=$node "
      if [ -n "$roots" ] && [ "$roots" != - ]; then named+=",$roots"; fi
      if [ "$warned" != - ] && [ -z "$WARNED" ]; then WARNED=SIG$warned; fi
      # A stop signal sent to the job steps only (scancel -s TERM without --batch) counts as if
      # this script had got it.
      if [ -n "$stopped" ] && [ "$stopped" != - ] && [ -z "$TERMINATED" ]; then TERMINATED=SIG$stopped; fi
    else
      # No report: the task never started or was killed (its node lost). srun's code is all we know.
      node=${ALLOC_HOSTS[$index]:-node$index}; code=$srun_rc
      [ "$code" != 0 ] || code=$EXIT_FAILURE
      note_failed_node "$node" "lost (its launcher never reported)"
      lost+=" $node"
    fi
    if [ "$code" = "$EXIT_NODE_EXCLUDED" ]; then note_failed_node "$node" "ExcludeThisNode"; fi
    codes+=("$code")
    NODE_CODES+="$node:$code "
  done
  rm -rf -- "$results"
  note_root_nodes "$named" "$hosts" "$lost"
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
    # A preemption or a cancel: ft_launcher exits 0 when its ranks stopped in time, else 1; the
    # signal seen here decides, not that code.
    VERDICT=stop; SCRIPT_RC=$((EXIT_SIGNAL_BASE + $(signal_number "${TERMINATED#SIG}")))
    DECISION="stop: terminated by $TERMINATED (ft_launcher exit $rc: "
    if [ "$rc" = "$EXIT_SUCCESS" ]; then DECISION+="the ranks stopped in time)"; else DECISION+="not a clean stop)"; fi
  elif [ -n "$WARNED" ]; then
    VERDICT="continue"; DECISION="continue: warning signal $WARNED, not a failure (ft_launcher exit $rc)"
  elif [ "$rc" = "$EXIT_SUCCESS" ]; then
    VERDICT="continue"; DECISION="continue: ft_launcher exited 0 without the flag, not a failure"
  else
    failed=1
    FAILURES=$((FAILURES + 1))
    local why="ft_launcher exit $rc"
    if [ "$rc" = "$EXIT_NODE_EXCLUDED" ]; then why+=", ExcludeThisNode"; fi
    if [ "$rc" -gt "$EXIT_SIGNAL_BASE" ]; then
      local sig=$((rc - EXIT_SIGNAL_BASE))
      why+=", forced stop or killed by SIG$(kill -l "$sig" 2>/dev/null || echo "$sig")"
    fi
    if stalled_too_long; then
      VERDICT=stop; SCRIPT_RC=$EXIT_NO_PROGRESS
      DECISION="stop: no progress, $STALLED consecutive failed attempts without a newer file under $PROGRESS_PATH ($why)"
    elif [ "$FAILURES" -ge "$MAX_FAILURES" ]; then
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
  if [ "$VERDICT" = stop ] || [ "$failed" = 0 ]; then FAILURES=0; STALLED=0; fi
}

# ------------------------------------------------------------------------------------ requeue
# The job to requeue or update: an array task by ARRAYJOBID_TASKID. One task of an array has
# SLURM_JOB_ID equal to SLURM_ARRAY_JOB_ID, which scontrol takes for the whole array.
# Set once, at the start (JOB_REF): after the requeue SLURM sends SIGTERM to every process of the
# job, a $(...) subshell included, and a failed command substitution would end this script
# (set -e) before it records the attempt.
JOB_REF=""
set_slurm_job_ref() {
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    JOB_REF=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
  else
    JOB_REF=$SLURM_JOB_ID
  fi
}

ATTEMPT_BAD_NODES=""   # nodes that caused this attempt's failure
EXCLUDED_NOTE=""
EXCLUDE_JOINED=""      # node,node,... to exclude from the requeued job
EXCLUDE_CLEAR=""       # 1: the requeued job's exclusion list is to be emptied
note_failed_node() {   # node why
  log "attempt $ATTEMPT: node $1 caused a failure: $2"
  ATTEMPT_BAD_NODES+=" $1"
}

# The nodes the launchers named as the root of the failure that ended their runs (a hung or
# crashed rank's node), as SLURM node names: each node task reports its host name next to its
# SLURM name. When a node was lost, the ranks the survivors blamed most likely failed because of
# it (a peer's connection reset, a collective that never completes), so only the lost node counts.
note_root_nodes() {   # ",host,host..." " host=node ..." " lostnode ..."
  local named=$1 hosts=$2 lost=$3 host node seen=" "
  [ -n "$named" ] || return 0
  if [ -n "$lost" ]; then
    log "attempt $ATTEMPT: not blaming ${named#,} (named as root by the launchers): node(s)$lost lost, which explains the failure"
    return 0
  fi
  local list=()
  IFS=, read -r -a list <<< "${named#,}"
  for host in "${list[@]}"; do
    [ -n "$host" ] || continue
    node=${hosts##* "$host"=}
    if [[ "${hosts#* "$host"=}" != "$node" ]]; then
      # Several nodes of the allocation share the host name (virtual nodes on one machine).
      log "attempt $ATTEMPT: the launchers named host $host as the root, which is more than one node of this allocation; not excluded"
      continue
    elif [ "$node" = "$hosts" ]; then
      # Not a host of this allocation by the reports' host names: SLURM's own name, or unknown.
      if [[ " ${ALLOC_HOSTS[*]} " == *" $host "* ]]; then node=$host; else
        log "attempt $ATTEMPT: the launchers named host $host as the root, which is no node of this allocation (host=node:$hosts); not excluded"
        continue
      fi
    else
      node=${node%% *}
    fi
    [[ "$seen" == *" $node "* ]] && continue
    seen+="$node "
    note_failed_node "$node" "root cause of the failure, as the launchers' records name it"
  done
}

# RUN_DIR/excluded_nodes: the nodes kept out of the next allocations, oldest first, at most
# --max-excluded. The list is dropped when the job would no longer fit in its partition
# without them (better the same bad node again than a job that never starts).
exclude_failed_nodes() {
  EXCLUDED_NOTE=""; EXCLUDE_JOINED=""; EXCLUDE_CLEAR=""
  [ "$MAX_EXCLUDED" -gt 0 ] || return 0
  [ -z "$TERMINATED" ] || return 0
  local file=$RUN_DIR/excluded_nodes node list=() kept=() total need
  if [ -f "$file" ]; then mapfile -t list < "$file"; fi
  for node in $ATTEMPT_BAD_NODES; do
    [[ " ${list[*]} " == *" $node "* ]] || list+=("$node")
  done
  [ "${#list[@]}" -gt 0 ] || return 0
  while [ "${#list[@]}" -gt "$MAX_EXCLUDED" ]; do list=("${list[@]:1}"); done
  need=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
  total=$(timeout 60 sinfo -h -N ${SLURM_JOB_PARTITION:+-p "$SLURM_JOB_PARTITION"} -o %N 2>/dev/null | sort -u | wc -l)
  if is_uint "$total" && [ "$total" -gt 0 ] && [ $((total - ${#list[@]})) -lt "$need" ]; then
    log "not excluding ${list[*]}: $need node(s) would no longer fit in the $total of the partition; list dropped"
    rm -f -- "$file"
    EXCLUDE_CLEAR=1   # the job still carries the previous list: clear it
    return 0
  fi
  for node in "${list[@]}"; do kept+=("$node"); done
  printf '%s\n' "${kept[@]}" > "$file.tmp" && mv -f -- "$file.tmp" "$file"
  EXCLUDE_JOINED=$(IFS=,; printf '%s' "${kept[*]}")
}

# ------------------------------------------------------------------------------------ progress
STALLED=0
PROGRESS_BEFORE=""
newest_progress() {   # the newest mtime (epoch s) of a file under --progress-path, or ""
  [ -n "$PROGRESS_PATH" ] && [ -e "$PROGRESS_PATH" ] || return 0
  find "$PROGRESS_PATH" -type f -printf '%T@\n' 2>/dev/null | sort -n | tail -n 1
}
stalled_too_long() {   # after a failed attempt: did it make no progress for --max-stalled attempts?
  [ -n "$PROGRESS_PATH" ] || return 1
  local after
  after=$(newest_progress)
  if [ -n "$after" ] && [ "$after" != "$PROGRESS_BEFORE" ]; then STALLED=0; return 1; fi
  STALLED=$((STALLED + 1))
  [ "$STALLED" -ge "$MAX_STALLED" ]
}

# SLURM changes ExcNodeList only while a job is pending, and a requeued job becomes pending only
# once every process of this attempt has ended, this script included. So right after the
# requeue the update is sent in the background and the script exits at once: slurmctld holds the
# request until the job is pending (it waits up to 5 s for that), then applies it before the
# job starts again (a requeued job waits for its BeginTime). The update ignores the SIGTERM that
# SLURM sends to the job's processes (an ignored signal stays ignored across exec). At worst the
# exclusion is lost (logged in slurmctld's log), never the requeue; no hold that could be left
# in place.
exclude_after_requeue() {
  (trap '' TERM; exec scontrol update JobId="$JOB_REF" ExcNodeList="$EXCLUDE_JOINED") </dev/null &
  if [ -n "$EXCLUDE_JOINED" ]; then
    EXCLUDED_NOTE="excluding $EXCLUDE_JOINED"
    log "asked SLURM to start job $JOB_REF again without $EXCLUDE_JOINED"
  else
    EXCLUDED_NOTE="excluding no node"
    log "asked SLURM to start job $JOB_REF again on any node (exclusion list cleared)"
  fi
}

requeue_job() {   # -> 0 when SLURM accepted the requeue
  local out rc=0
  REQUEUEING=1
  INTERRUPTED=0
  out=$(timeout 60 scontrol requeue "$JOB_REF" 2>&1) || rc=$?
  if [ "$rc" -gt 128 ] && [ "$INTERRUPTED" = 1 ]; then
    # Once slurmctld has requeued the job it signals every process of the step, scontrol too:
    # on a busy node the signal can arrive before scontrol exits 0. This script got it as well.
    log "'scontrol requeue $JOB_REF' was stopped by SLURM's signal to the requeued job (exit $rc): requeued"
    return 0
  fi
  if [ "$rc" != 0 ]; then
    REQUEUEING=0
    log "error: 'scontrol requeue $JOB_REF' failed (exit $rc): $out"
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
  mapfile -t ALLOC_HOSTS <<< "$hosts"   # SLURM_NODEID order: node task i runs on host i
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
    set_slurm_job_ref
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
      exit $((EXIT_SIGNAL_BASE + $(signal_number "${TERMINATED#SIG}")))
    fi
    ATTEMPT=$((ATTEMPT + 1))
    export AUTORESUME_ATTEMPT=$ATTEMPT
    # Local mode: a warning applies to the attempt it arrived in. (Slurm mode runs one attempt
    # per job; a warning that came before it started still means "requeue after it".)
    if [ "$MODE" = local ]; then WARNED=""; fi
    start=$(now)
    ATTEMPT_BAD_NODES=""
    PROGRESS_BEFORE=$(newest_progress)
    write_state 1 "$start" "$job_id"
    log "attempt $ATTEMPT starts"
    if [ "$MODE" = slurm ]; then run_slurm_attempt; else run_local_attempt; fi
    end=$(now)
    decide "$ATTEMPT_RC"
    if flag_present; then flag=yes; else flag=no; fi
    write_state 0 - -
    if [ "$VERDICT" = continue ] && [ "$MODE" = slurm ]; then
      exclude_failed_nodes
      # From the requeue on, SLURM is stopping this job: only builtins below (see log()).
      if requeue_job; then
        if [ -n "$EXCLUDE_JOINED" ] || [ -n "$EXCLUDE_CLEAR" ]; then exclude_after_requeue; fi
        DECISION+="; job $JOB_REF requeued"
        if [ -n "$EXCLUDED_NOTE" ]; then DECISION+=" $EXCLUDED_NOTE"; fi
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
