#!/usr/bin/env bash
# autoresume.sh: run a training command under ft_launcher until it has finished.
# Run with --help for the options; docs/autoresume.md explains the design. What this script
# decides (options, the verdict after each attempt, state and history files, nodes to exclude) is
# Python: launcher/resume/, run as `python -m launcher.resume STEP`. The shell keeps what must be
# a shell: starting the launchers, catching and passing on signals, the run directory's lock, and
# the builtins-only section after `scontrol requeue`.
set -euo pipefail

readonly PROG=autoresume.sh

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
                           the flag file. Must be shared by all nodes, yours, and not
                           writable by group or others (a new one is made so); a file of
                           another user, or a symbolic link, among its files is refused
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
                           ExcludeThisNode, or the node of the failure's root rank in
                           --node-failures-to-exclude attempts) from the requeued job (the
                           oldest go first); 0 = never. Per-node history: RUN_DIR/node_history.tsv
                           [$AUTORESUME_MAX_EXCLUDED, else 4]
      --progress-path P    a checkpoint file or directory: an attempt made progress when a
                           file under P is newer than before it [$AUTORESUME_PROGRESS_PATH]
      --max-stalled N      with --progress-path: stop with exit 3 after N consecutive failed
                           attempts without progress [$AUTORESUME_MAX_STALLED, else 2]
      --max-repeats N      stop with exit 66 once the same failure (the fingerprint the
                           launchers report) ended N attempts since the last one that did
                           not fail or made progress, on different nodes (or anywhere in
                           local mode): a bug, not a node. On one node only, that node is
                           excluded instead (slurm mode). 0 = never [$AUTORESUME_MAX_REPEATS,
                           else 2]
      --node-failures-to-exclude K
                           slurm mode: exclude a node named as the root of the failure in K
                           attempts (a lost node or one that exited 65 at once)
                           [$AUTORESUME_NODE_FAILURES_TO_EXCLUDE, else 2]
      --node-exclusion-expiry N
                           slurm mode: an excluded node may come back after N attempts that
                           did not fail; 0 = never [$AUTORESUME_NODE_EXCLUSION_EXPIRY, else 3]
  -h, --help               this text

In slurm mode the launcher gets, before your own arguments (so yours win):
  --nnodes=$SLURM_NNODES (left out when your arguments give --nnodes, e.g. an elastic
  --nnodes MIN:MAX) --rdzv-backend=c10d --rdzv-endpoint=ADDR:PORT (ADDR: the NodeAddr
  of the first node of the allocation, usually its host name)
  --rdzv-id=autoresume-$SLURM_JOB_ID-ATTEMPT
With --nnodes MIN:MAX and sbatch --no-kill, a job that SLURM shrank after losing a node is
requeued on the nodes it has left (at least MIN), not held until the lost node returns.
The ranks see FAULT_TOL_FINISHED_FLAG_FILE, AUTORESUME_ATTEMPT (1, 2, ...) and
AUTORESUME_RUN_DIR, plus the rest of the environment.

After each attempt (first match wins):
  flag file present          finished: exit 0 (whatever ft_launcher returned)
  launcher exit 64           ShutdownWorkload was requested by a rank: stop, exit 64
  launcher exit 2            usage error, nothing changes on retry: stop, exit 2
  launcher exit 66           the launcher stopped a repeating failure (the same failure ended
                             its restarts without progress): stop, exit 66, not requeued
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
                             else stop, exit 1; stop, exit 66 when its fingerprint repeats
                             (--max-repeats)
  launcher exit 65           ExcludeThisNode: continue, counted as a failure
  launcher exit 128+N        the launcher's stop by signal N was forced (a third stop signal)
                             or it died of signal N: continue, counted as a failure
  any other code             failure, as for 1
A continuation that is not a failure resets the consecutive failure count; so does a stop.
With several nodes the codes of all launchers are combined: 64 if any is 64, else 2 if any
is 2, else 66 if any is 66, else the highest. In slurm mode ask for the warning with sbatch
--signal=B:USR1@SECONDS (B: signals this script, which must be the batch shell or exec'd
by it); a signal sent to the job steps instead reaches the launchers and counts the same.

Exit codes of this script: 0 finished, or continuation requeued (slurm mode); 1 stopped after
failures, --max-attempts, or a failed requeue; 2 usage error (this script's or ft_launcher's);
3 no progress (--max-stalled failed attempts without a newer file under --progress-path);
64 ShutdownWorkload requested; 66 a repeating failure (ft_launcher's exit 66, or --max-repeats);
128+N stopped by signal N.

Examples:
  autoresume.sh --run-dir runs/a --launcher-args "--standalone --nproc-per-node 2" train.py --lr 0.1
  sbatch --requeue --open-mode=append --signal=B:USR1@120 -N 2 \
         autoresume.sh --launcher-args "--nproc-per-node 8 --max-restarts 2" train.py
EOF
}

# Builtins only (no `date`): after a requeue SLURM sends SIGTERM to every process of the job, and
# this script must still be able to write its history line then.
log() { printf '%(%Y-%m-%dT%H:%M:%S)T %s: %s\n' -1 "$PROG" "$*" >&2; }

# ------------------------------------------------------------------------------------ python
# The interpreter of the policy: ft_autoresume's own (AUTORESUME_PYTHON), else the one named in
# the shebang of the --launcher (ft_launcher's environment has launcher.resume), else python3. Run
# from a checkout, the checkout's launcher/ goes first on its path, so that script and policy are
# of one version. Only --help and --launcher are looked for here: every other option takes a
# value, so this walk meets the options that the real parse (in Python) meets.
find_python() {
  local launcher=${FT_LAUNCHER:-ft_launcher} path line root
  while [ "$#" -gt 0 ]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      --launcher=*) launcher=${1#*=}; shift ;;
      --) break ;;
      --*=*) shift ;;
      -*) [ "$#" -ge 2 ] || break; [ "$1" != --launcher ] || launcher=$2; shift 2 ;;
      *) break ;;
    esac
  done
  PY=${AUTORESUME_PYTHON:-}
  if [ -z "$PY" ] && path=$(command -v -- "$launcher" 2>/dev/null) && [ -f "$path" ] \
      && read -r line < "$path" && [[ "$line" =~ ^'#!'[[:space:]]*(/[^[:space:]]*/python[0-9.]*)[[:space:]]*$ ]]; then
    PY=${BASH_REMATCH[1]}
  fi
  PY=${PY:-python3}
  PY_PATH=${PYTHONPATH:-}
  root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
  if [ -f "$root/launcher/resume/__main__.py" ]; then PY_PATH=$root${PY_PATH:+:$PY_PATH}; fi
  if ! PYTHONPATH=$PY_PATH "$PY" -c 'import launcher.resume' 2>/dev/null; then
    # Exit 2 (EXIT_USAGE) written out: the Python that defines it is what is missing.
    printf "%s: error: cannot import launcher.resume with '%s' (AUTORESUME_PYTHON, else the shebang of --launcher, else python3): install ptl-resiliency there or set AUTORESUME_PYTHON\n" "$PROG" "$PY" >&2
    exit 2
  fi
}

# Runs one step of the policy and takes its results: shell assignments whose values Python quoted
# with shlex.quote, so that eval assigns them and runs nothing. A failed step (its message is on
# stderr) ends this script with its exit status.
step() {
  local out
  out=$(PYTHONPATH=$PY_PATH "$PY" -m launcher.resume "$@") || exit
  eval "$out"
}

# ------------------------------------------------------------------------------------ per node
# The task srun starts on every node, shipped with `declare -f` so that it works even where this
# file is not readable (an sbatch'ed copy of this script lives only on the batch host). It runs
# ft_launcher, which leaves its result (the nodes its records name as the root of the failure)
# in RESULTS/launcher.<SLURM_NODEID>, and it leaves "<node> <exit code> <warning signal or ->
# <stop signal or -> <host name>" in RESULTS/node.<SLURM_NODEID>, for the decide step.
# It passes no signal on: SLURM signals every process of the step (srun relays what it gets to
# the whole step), ft_launcher included, and a second copy from here would reach the launcher
# (and its workers) twice. FT_LAUNCHER_PARENT_PID: ft_launcher stops if this task dies.
autoresume_node_task() {
  local results=$1
  shift
  local node=${SLURMD_NODENAME:-$(hostname -s)} index=${SLURM_NODEID:-0}
  local warned=- stopped=- interrupted=0 rc=0 child host=""
  trap 'warned=USR1; interrupted=1' USR1
  trap 'warned=USR2; interrupted=1' USR2
  trap 'stopped=TERM; interrupted=1' TERM
  trap 'stopped=INT; interrupted=1' INT
  trap 'stopped=HUP; interrupted=1' HUP
  FT_LAUNCHER_PARENT_PID=$$ FT_LAUNCHER_RESULT_FILE=$results/launcher.$index "$@" &
  child=$!
  while :; do
    interrupted=0
    if wait "$child"; then rc=0; else rc=$?; fi
    [ "$interrupted" = 1 ] || break
  done
  # The kernel's host name, as the launcher's records have it (SLURM may set $HOSTNAME to the
  # node's SLURM name).
  read -r host < /proc/sys/kernel/hostname 2>/dev/null || host=$(hostname)
  printf '%s %s %s %s %s\n' "$node" "$rc" "$warned" "$stopped" "${host:-$node}" > "$results/.node.$index.tmp"
  mv -f "$results/.node.$index.tmp" "$results/node.$index"
  return "$rc"
}

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
# Each sets ATTEMPT_RESULT, the arguments that tell the policy's decide step how the attempt ended.
run_local_attempt() {
  local results=$RUN_DIR/nodes
  rm -rf -- "$results"
  mkdir -p -- "$results"
  log "attempt $ATTEMPT: $LAUNCHER ${LAUNCHER_ARGS[*]} ${COMMAND[*]}"
  # ft_launcher runs in a session of its own, so that a terminal's Ctrl-C (or any signal to this
  # script's process group) reaches only this script, which passes it on once. It stops when this
  # script dies, even by SIGKILL (FT_LAUNCHER_PARENT_PID), and it and its sentinel keep the
  # run-dir lock (FT_LAUNCHER_KEEP_FD) until every process of the attempt is gone.
  # FT_LAUNCHER_RESULT_FILE: the fingerprint of the failure, for --max-repeats.
  FT_LAUNCHER_PARENT_PID=$$ FT_LAUNCHER_KEEP_FD=$LOCK_FD FT_LAUNCHER_RESULT_FILE=$results/launcher.0 \
    $SETSID "$LAUNCHER" "${LAUNCHER_ARGS[@]}" "${COMMAND[@]}" &
  CHILD=$!
  wait_child
  ATTEMPT_RESULT=(--rc="$CHILD_RC" --results="$results")
}

run_slurm_attempt() {
  local results=$RUN_DIR/nodes
  rm -rf -- "$results"
  mkdir -p -- "$results"
  local srun_cmd=(srun --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1 --kill-on-bad-exit=0)
  if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then srun_cmd+=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi
  srun_cmd+=("${SRUN_ARGS[@]}")
  local launcher_cmd=("$LAUNCHER" ${NNODES_ARGS[@]+"${NNODES_ARGS[@]}"} --rdzv-backend=c10d
    --rdzv-endpoint="$RDZV_HOST:$RDZV_PORT" --rdzv-id="autoresume-$SLURM_JOB_ID-$ATTEMPT"
    "${LAUNCHER_ARGS[@]}" "${COMMAND[@]}")
  log "attempt $ATTEMPT: $NNODES node(s), rendezvous on $FIRST_HOST ($RDZV_HOST:$RDZV_PORT): ${launcher_cmd[*]}"
  "${srun_cmd[@]}" bash -c "$(declare -f autoresume_node_task)"$'\nautoresume_node_task "$@"' \
    autoresume-node "$results" "${launcher_cmd[@]}" {LOCK_FD}>&- &
  CHILD=$!
  wait_child
  ATTEMPT_RESULT=(--srun-rc="$CHILD_RC" --results="$results")
}

# ------------------------------------------------------------------------------------ requeue
# SLURM changes ExcNodeList only while a job is pending, and a requeued job becomes pending only
# once every process of this attempt has ended, this script included. So right after the
# requeue the update is sent in the background and the script exits at once: slurmctld holds the
# request until the job is pending (it waits up to 5 s for that), then applies it before the
# job starts again (a requeued job waits for its BeginTime). The update ignores the SIGTERM that
# SLURM sends to the job's processes (an ignored signal stays ignored across exec). At worst the
# exclusion is lost (logged in slurmctld's log), never the requeue; no hold that could be left
# in place.
exclude_after_requeue() {
  local fields=()
  if [ -n "$EXCLUDE_UPDATE" ]; then fields+=("ExcNodeList=$EXCLUDE_LIST"); fi
  # A --no-kill job that lost a node asks for its first count again: the count it has left.
  # NODE_COUNT_FIELDS: NumNodes and NumTasks, from the decide step.
  if [ -n "$NUM_NODES_UPDATE" ]; then fields+=("${NODE_COUNT_FIELDS[@]}"); fi
  (trap '' TERM; exec scontrol update JobId="$JOB_REF" "${fields[@]}") </dev/null &
  if [ -n "$EXCLUDE_UPDATE" ] && [ -n "$EXCLUDE_LIST" ]; then
    log "asked SLURM to start job $JOB_REF again without $EXCLUDE_LIST"
  elif [ -n "$EXCLUDE_UPDATE" ]; then
    log "asked SLURM to start job $JOB_REF again on any node (exclusion list cleared)"
  fi
  if [ -n "$NUM_NODES_UPDATE" ]; then
    log "asked SLURM to start job $JOB_REF again on $NUM_NODES_UPDATE node(s)"
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

# ------------------------------------------------------------------------------------ main
main() {
  find_python "$@"
  # AUTORESUME_SCRIPT_PID: the config step warns when this script is not SLURM's batch shell.
  AUTORESUME_SCRIPT_PID=$$ step config "$@"   # RUN_DIR, LOCK_FILE, FLAG_FILE, MODE, LAUNCHER, LAUNCHER_ARGS, COMMAND, ..., POLICY_ARGS
  if [ -n "${HELP:-}" ]; then usage; exit 0; fi

  # LOCK_FILE: made 0600 by the config step, so that no other user can open it, let alone lock
  # it. The config step also checked that no one else can write to the run dir: every path in it
  # names this user's file (docs/security.md).
  exec {LOCK_FD}>>"$LOCK_FILE"
  local lock_rc=0
  flock -n -E 75 "$LOCK_FD" || lock_rc=$?
  if [ "$lock_rc" = 75 ]; then
    log "error: run dir $RUN_DIR is in use by another autoresume.sh"
    exit "$EXIT_FAILURE"
  elif [ "$lock_rc" != 0 ]; then
    log "warning: cannot lock $LOCK_FILE (flock exit $lock_rc); make sure only one loop uses this run dir"
  fi

  step resume "${POLICY_ARGS[@]}"   # records a killed script's attempt; STOP: nothing to run
  if [ -n "$STOP" ]; then exit "$STOP"; fi
  export FAULT_TOL_FINISHED_FLAG_FILE=$FLAG_FILE
  export AUTORESUME_RUN_DIR=$RUN_DIR
  while :; do
    if [ -n "$TERMINATED" ]; then
      log "stopping before attempt $((ATTEMPT + 1)): received $TERMINATED"
      exit $((EXIT_SIGNAL_BASE + $(kill -l "${TERMINATED#SIG}")))
    fi
    # Local mode: a warning applies to the attempt it arrived in. (Slurm mode runs one attempt
    # per job; a warning that came before it started still means "requeue after it".)
    if [ "$MODE" = local ]; then WARNED=""; fi
    step start "${POLICY_ARGS[@]}"   # ATTEMPT; the state file says it runs
    export AUTORESUME_ATTEMPT=$ATTEMPT
    if [ "$MODE" = slurm ]; then run_slurm_attempt; else run_local_attempt; fi
    # -> VERDICT (finished|continue|stop), SCRIPT_RC, DECISION, HISTORY_*, and for a requeue
    # DECISION_REQUEUED, EXCLUDE_UPDATE, EXCLUDE_LIST. The state file is up to date after it.
    step decide "${POLICY_ARGS[@]}" "${ATTEMPT_RESULT[@]}" --warned="$WARNED" --terminated="$TERMINATED"
    if [ "$VERDICT" = continue ] && [ "$MODE" = slurm ]; then
      # From the requeue on, SLURM is stopping this job: only builtins below (see log()). A
      # refused requeue leaves the job running, so the policy may run a step then.
      if requeue_job; then
        if [ -n "$EXCLUDE_UPDATE$NUM_NODES_UPDATE" ]; then exclude_after_requeue; fi
        DECISION=$DECISION_REQUEUED
      else
        step requeue-failed "${POLICY_ARGS[@]}" --decision="$DECISION"
      fi
    fi
    [ -s "$RUN_DIR/history.tsv" ] || printf '%s\n' "$HISTORY_HEADER" >> "$RUN_DIR/history.tsv"
    printf '%s\t%s\n' "$HISTORY_FIELDS" "$DECISION" >> "$RUN_DIR/history.tsv"  # one write
    log "attempt $ATTEMPT: $DECISION"
    case "$VERDICT" in
      finished) exit 0 ;;
      stop) exit "$SCRIPT_RC" ;;
    esac
    [ "$MODE" = slurm ] && exit 0   # the requeued job carries on
  done
}

main "$@"
