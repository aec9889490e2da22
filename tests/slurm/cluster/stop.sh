#!/usr/bin/env bash
# Stop the cluster that tests/slurm/cluster/start.sh started, and nothing else.
#
#   bash tests/slurm/cluster/stop.sh
#
# 1. cancels the jobs of this cluster and waits (bounded) until none is left;
# 2. stops the slurmd daemons, then slurmctld, then munged: only the pids listed in
#    $PTLR_SLURM_DIR/daemons.pids, and only after checking that each pid still runs the recorded
#    executable with this cluster's files on its command line (a recycled pid is left alone);
#    SIGTERM first, SIGKILL if it is still there after 15 s;
# 3. kills a slurmstepd that outlived slurmd (found by the pid listening on a socket in this
#    cluster's spool directory) together with its descendants;
# 4. removes what start.sh made in $PTLR_SLURM_DIR unless PTLR_SLURM_KEEP=1 (to read log/*.log).
# It never looks processes up by name. Running it twice, or without a cluster, is harmless.
set -uo pipefail

DIR=${PTLR_SLURM_DIR:-/tmp/ptlr-slurm}
CONF=$DIR/etc/slurm.conf
PIDS=$DIR/daemons.pids
say() { printf 'slurm-cluster: %s\n' "$*" >&2; }

if [ ! -d "$DIR" ]; then
  say "nothing to stop: $DIR does not exist"
  exit 0
fi
[ -f "$PIDS" ] || : > "$PIDS"

recorded() { awk -v name="$1" -v field="$2" '$1 == name { print $field }' "$PIDS"; }   # one per line

# Is pid $2 still the daemon $1 this cluster started (recorded with executable $3)?
is_ours() {
  local name=$1 pid=$2 want=$3 exe cmdline
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1      # a zombie has none: it is gone
  [ "$exe" = "$want" ] || return 1
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  case "$name" in
    munged) [[ "$cmdline" == *"$DIR/munge/"* ]] ;;
    *)      [[ "$cmdline" == *"$CONF"* ]] ;;
  esac
}

FAILED=0
stop_daemons() {   # name: every recorded daemon of that name, SIGTERM together, then wait
  local name=$1 pid exe deadline pids=() exes=() i
  while read -r _ pid exe; do
    if is_ours "$name" "$pid" "$exe"; then
      pids+=("$pid"); exes+=("$exe")
    else
      say "$name (pid $pid) is not running any more"
    fi
  done < <(awk -v name="$name" '$1 == name' "$PIDS")
  [ "${#pids[@]}" -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  for i in "${!pids[@]}"; do
    deadline=$((SECONDS + 15))
    while is_ours "$name" "${pids[$i]}" "${exes[$i]}" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if is_ours "$name" "${pids[$i]}" "${exes[$i]}"; then
      say "$name (pid ${pids[$i]}) ignored SIGTERM for 15 s; sending SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null
      deadline=$((SECONDS + 5))
      while is_ours "$name" "${pids[$i]}" "${exes[$i]}" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    fi
    if is_ours "$name" "${pids[$i]}" "${exes[$i]}"; then
      say "WARNING: $name (pid ${pids[$i]}) is still running"
      FAILED=1
    else
      say "$name (pid ${pids[$i]}) stopped"
    fi
  done
}

# 1. jobs
CTLD_PID=$(recorded slurmctld 2 | tail -n 1)
if is_ours slurmctld "$CTLD_PID" "$(recorded slurmctld 3 | tail -n 1)" && [ -f "$CONF" ]; then
  export SLURM_CONF=$CONF
  jobs=$(timeout 10 squeue -h -o '%i' 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    say "cancelling jobs: $jobs"
    read -r -a job_ids <<< "$jobs"
    timeout 10 scancel "${job_ids[@]}" 2>/dev/null
    kill_wait=$(awk -F= '$1 == "KillWait" { print $2 }' "$CONF")
    deadline=$((SECONDS + ${kill_wait:-30} + 20))
    while [ -n "$(timeout 10 squeue -h -o '%i' 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.2
    done
  fi
fi

# 2. daemons, the compute side first; munged last because the others use it while stopping
stop_daemons slurmd
stop_daemons slurmctld

# 3. step daemons that outlived slurmd, identified by their sockets in our spool directory
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    printf '%s\n' "$child"
    descendants "$child"
  done
}
if [ -d "$DIR/spool" ]; then
  for pid in $(ss -xlpH 2>/dev/null | grep -F "$DIR/spool/" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
    case "${exe##*/}" in
      slurmstepd|slurmstepd-wlm)
        mapfile -t kids < <(descendants "$pid")
        say "slurmstepd $pid outlived slurmd; killing it and its processes ${kids[*]:-}"
        kill -KILL "$pid" "${kids[@]}" 2>/dev/null
        ;;
    esac
  done
fi

stop_daemons munged

if [ "$FAILED" = 1 ]; then
  say "some daemons are still running; $DIR kept"
  exit 1
fi
if [ "${PTLR_SLURM_KEEP:-0}" = 1 ]; then
  rm -f "$PIDS"
  say "stopped; logs kept in $DIR/log"
else
  # Only what start.sh creates, then the directory itself if that left it empty.
  for sub in etc munge state spool run log; do rm -rf "${DIR:?}/$sub"; done
  rm -f "$PIDS" "$DIR/env"
  rmdir "$DIR" 2>/dev/null || say "left $DIR: it holds files start.sh did not make"
  say "stopped; removed its files from $DIR"
fi
