#!/usr/bin/env bash
# Start a private, single-node SLURM cluster on this machine for tests/slurm.
#
#   bash tests/slurm/cluster/start.sh     # installs Debian packages if missing, starts, waits
#   source /tmp/ptlr-slurm/env            # exports SLURM_CONF (make test-slurm does this for you)
#   bash tests/slurm/cluster/stop.sh      # stops exactly what start.sh started
#
# It runs munged, slurmctld and one slurmd per node from Debian 12's packages (slurm-wlm 22.05,
# munge 0.5), as root, without systemd or cgroups. The nodes are virtual: PTLR_SLURM_NODES slurmd
# daemons on this machine, named ptlr1, ptlr2, ..., each with its own port and spool directory,
# all at NodeAddr 127.0.0.1, sharing out this machine's CPUs and memory. So multi-node jobs (one
# srun task per node, a rendezvous on the first node) run for real on one machine. Every daemon
# listens on 127.0.0.1 only. State is fresh on every start (job ids begin at 1) and everything
# lives under $PTLR_SLURM_DIR:
#   etc/slurm.conf  env  daemons.pids  munge/  state/  spool/<node>/  run/  log/
# daemons.pids lists "name pid executable" for each daemon this script started; stop.sh stops
# those pids and nothing else. Nothing outside $PTLR_SLURM_DIR is written (no /etc/slurm link).
#
# Settings (environment variables, defaults in brackets):
#   PTLR_SLURM_DIR            where everything lives                           [/tmp/ptlr-slurm]
#   PTLR_SLURM_CTLD_PORT      SlurmctldPort                                    [6827]
#   PTLR_SLURM_SLURMD_PORT    SlurmdPort of ptlr1; ptlrN uses this + N - 1     [6828]
#   PTLR_SLURM_NODES          how many virtual nodes                           [2]
#   PTLR_SLURM_KILL_WAIT      KillWait: seconds from SIGTERM to SIGKILL        [5]  (SLURM: 30)
#   PTLR_SLURM_CRED_EXPIRE    munge credential lifetime (>= 5); a requeued job [5]  (SLURM: 120)
#                             may start again only after this many seconds + 1
#   PTLR_SLURM_SCHED_INTERVAL seconds between main scheduler passes            [2]  (SLURM: 60)
#   PTLR_SLURM_READY_TIMEOUT  seconds to wait for the node to become idle      [60]
#   PTLR_SLURM_NO_INSTALL=1   fail instead of running apt-get when packages are missing
# The ports differ from SLURM's defaults (6817/6818) so that a system cluster or another
# checkout's harness on the usual ports is never disturbed.
set -euo pipefail

DIR=${PTLR_SLURM_DIR:-/tmp/ptlr-slurm}
CTLD_PORT=${PTLR_SLURM_CTLD_PORT:-6827}
SLURMD_PORT=${PTLR_SLURM_SLURMD_PORT:-6828}
NODES=${PTLR_SLURM_NODES:-2}
KILL_WAIT=${PTLR_SLURM_KILL_WAIT:-5}
CRED_EXPIRE=${PTLR_SLURM_CRED_EXPIRE:-5}
SCHED_INTERVAL=${PTLR_SLURM_SCHED_INTERVAL:-2}
READY_TIMEOUT=${PTLR_SLURM_READY_TIMEOUT:-60}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { printf 'slurm-cluster: %s\n' "$*" >&2; }

STARTED_SOMETHING=0
on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "$STARTED_SOMETHING" = 1 ]; then
    say "start failed (exit $rc); stopping what this run started"
    PTLR_SLURM_DIR=$DIR bash "$HERE/stop.sh" || true
  fi
}
trap on_exit EXIT

die() { say "ERROR: $*"; exit 1; }

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
for setting in "PTLR_SLURM_CTLD_PORT=$CTLD_PORT" "PTLR_SLURM_SLURMD_PORT=$SLURMD_PORT" "PTLR_SLURM_NODES=$NODES" \
    "PTLR_SLURM_KILL_WAIT=$KILL_WAIT" "PTLR_SLURM_CRED_EXPIRE=$CRED_EXPIRE" \
    "PTLR_SLURM_SCHED_INTERVAL=$SCHED_INTERVAL" "PTLR_SLURM_READY_TIMEOUT=$READY_TIMEOUT"; do
  is_uint "${setting#*=}" || die "${setting%%=*} must be a whole number, got '${setting#*=}'"
done
case "$DIR" in
  /?*) ;;
  *) die "PTLR_SLURM_DIR must be an absolute path, got '$DIR'" ;;
esac
{ [ "$NODES" -ge 1 ] && [ "$NODES" -le 16 ]; } || die "PTLR_SLURM_NODES must be 1 to 16, got '$NODES'"
[ "$CRED_EXPIRE" -ge 5 ] || die "PTLR_SLURM_CRED_EXPIRE must be at least 5 (SLURM ignores smaller values and uses 120), got '$CRED_EXPIRE'"
[ "$(readlink -m "$DIR")" != / ] || die "PTLR_SLURM_DIR must not be '/'"
[ "$(id -u)" = 0 ] || die "must run as root (slurmd launches jobs as their owner), running as uid $(id -u)"

# ------------------------------------------------------------------------------ packages
missing=()
for exe in munged mungekey munge slurmctld slurmd sbatch srun scontrol squeue sinfo scancel; do
  command -v "$exe" >/dev/null 2>&1 || missing+=("$exe")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "${PTLR_SLURM_NO_INSTALL:-0}" != 1 ] \
    || die "missing ${missing[*]} and PTLR_SLURM_NO_INSTALL=1; install: munge slurmctld slurmd slurm-client"
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
  say "installing munge slurmctld slurmd slurm-client (missing: ${missing[*]})"
  # A policy-rc.d that answers 101 keeps the packages' scripts from starting system services.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  install_rc=0
  {
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
           munge slurmctld slurmd slurm-client >/dev/null
  } || install_rc=$?
  if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ "$install_rc" = 0 ] || die "apt-get failed (exit $install_rc)"
fi

# ------------------------------------------------------------------------------ not twice
pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
if [ -f "$DIR/daemons.pids" ]; then
  while read -r name pid _exe; do
    if pid_alive "$pid"; then die "a cluster from $DIR is running ($name pid $pid); run stop.sh first"; fi
  done < "$DIR/daemons.pids"
fi
NODE_NAMES=()
for i in $(seq "$NODES"); do NODE_NAMES+=("ptlr$i"); done
for port in "$CTLD_PORT" $(seq "$SLURMD_PORT" $((SLURMD_PORT + NODES - 1))); do
  if [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]; then
    die "TCP port $port is in use; choose others with PTLR_SLURM_CTLD_PORT / PTLR_SLURM_SLURMD_PORT"
  fi
done

# ------------------------------------------------------------------------------ fresh layout
mkdir -p "$DIR"
chmod 0755 "$DIR"
for sub in etc munge state spool run log; do rm -rf "${DIR:?}/$sub"; done
rm -f "$DIR/daemons.pids" "$DIR/env"
mkdir -p "$DIR/etc" "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
chmod 0755 "$DIR/etc" "$DIR/munge" "$DIR/spool" "$DIR/run" "$DIR/log"   # munged wants 0755 here
chmod 0700 "$DIR/state"
: > "$DIR/daemons.pids"
STARTED_SOMETHING=1

record() {   # name pid: remember a daemon this run started, with its executable
  local exe
  exe=$(readlink "/proc/$2/exe") || die "$1 (pid $2) vanished right after starting"
  printf '%s %s %s\n' "$1" "$2" "$exe" >> "$DIR/daemons.pids"
}

wait_for_pidfile() {   # name pidfile -> prints the pid once the file names a live process
  local deadline=$((SECONDS + 15)) pid=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    pid=$(cat "$2" 2>/dev/null || true)
    if pid_alive "$pid"; then printf '%s\n' "$pid"; return 0; fi
    sleep 0.1
  done
  return 1
}

HOST=$(hostname -s)
[ -n "$HOST" ] || die "hostname -s printed nothing"

# ------------------------------------------------------------------------------ munge
KEY=$DIR/munge/munge.key
SOCKET=$DIR/munge/munge.socket
head -c 1024 /dev/urandom > "$KEY"
chmod 0400 "$KEY"
munged --key-file="$KEY" --socket="$SOCKET" --pid-file="$DIR/munge/munged.pid" \
  --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
  || die "munged did not start; see $DIR/munge/munged.log"
MUNGED_PID=$(wait_for_pidfile munged "$DIR/munge/munged.pid") || die "munged did not come up; see $DIR/munge/munged.log"
record munged "$MUNGED_PID"
munge -n -S "$SOCKET" | unmunge -S "$SOCKET" >/dev/null || die "munge credential round trip failed"

# ------------------------------------------------------------------------------ slurm.conf
# Share out what slurmd's own probe finds, so no node claims more than this machine has.
PROBE=$(slurmd -C)
[[ "$PROBE" =~ CPUs=([0-9]+) ]] || die "slurmd -C did not report CPUs: $PROBE"
NODE_CPUS=$(( BASH_REMATCH[1] / NODES )); [ "$NODE_CPUS" -ge 1 ] || NODE_CPUS=1
[[ "$PROBE" =~ RealMemory=([0-9]+) ]] || die "slurmd -C did not report RealMemory: $PROBE"
NODE_MEMORY=$(( BASH_REMATCH[1] / NODES ))
CONF=$DIR/etc/slurm.conf
cat > "$CONF" <<EOF
# Written by tests/slurm/cluster/start.sh; regenerated on every start.
ClusterName=ptlrtest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# Bind to the address the host name resolves to (loopback here), never to 0.0.0.0.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET,cred_expire=$CRED_EXPIRE
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=$SCHED_INTERVAL
ReturnToService=2
JobRequeue=0
KillWait=$KILL_WAIT
MinJobAge=300
InactiveLimit=0
Waittime=0
$(for i in $(seq "$NODES"); do
  printf 'NodeName=ptlr%s NodeAddr=127.0.0.1 NodeHostname=%s Port=%s CPUs=%s RealMemory=%s State=UNKNOWN\n' \
    "$i" "$HOST" $((SLURMD_PORT + i - 1)) "$NODE_CPUS" "$NODE_MEMORY"
done)
PartitionName=debug Nodes=ptlr[1-$NODES] Default=YES MaxTime=INFINITE State=UP
EOF
printf 'export SLURM_CONF=%q\n' "$CONF" > "$DIR/env"
export SLURM_CONF=$CONF

# ------------------------------------------------------------------------------ daemons
# Both fork into the background themselves and write their pid files.
slurmctld -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
CTLD_PID=$(wait_for_pidfile slurmctld "$DIR/run/slurmctld.pid") || die "slurmctld did not come up; see $DIR/log/slurmctld.log"
record slurmctld "$CTLD_PID"

SLURMD_PIDS=()
for node in "${NODE_NAMES[@]}"; do
  mkdir -p "$DIR/spool/$node"
  slurmd -f "$CONF" -N "$node" || die "slurmd for $node did not start; see $DIR/log/slurmd-$node.log"
  pid=$(wait_for_pidfile slurmd "$DIR/run/slurmd-$node.pid") || die "slurmd for $node did not come up; see $DIR/log/slurmd-$node.log"
  record slurmd "$pid"
  SLURMD_PIDS+=("$pid")
done

deadline=$((SECONDS + READY_TIMEOUT))
states=""
while :; do
  states=$(timeout 10 sinfo -h -N -o '%T' 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [ "$states" = "idle " ] && [ "$(timeout 10 sinfo -h -N -t idle -o '%N' | wc -l)" = "$NODES" ] && break
  if [ "$SECONDS" -ge "$deadline" ]; then
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log"/slurmd-*.log >&2 || true
    die "nodes are '${states:-not answering}' after ${READY_TIMEOUT}s, not all idle"
  fi
  sleep 0.2
done
say "ready: $NODES idle node(s) ${NODE_NAMES[*]} with $NODE_CPUS CPU(s) each (munged $MUNGED_PID, slurmctld $CTLD_PID, slurmd ${SLURMD_PIDS[*]}); SLURM_CONF=$CONF"
