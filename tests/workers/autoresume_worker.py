"""A rank for the auto-resume tests: ``autoresume_worker.py STATE_DIR BEHAVIOUR [N]``.

Started by ``ft_launcher`` under ``scripts/autoresume.sh``. Every run appends ``rank R run K``
to ``STATE_DIR/runs.log`` (one ``O_APPEND`` write per line, so concurrent ranks never mix their
lines); K counts this rank's runs from 1, independently of the script's own attempt counter.

Behaviours:
  fail-first N  runs 1..N exit 1; the next run finishes (rank 0 creates the flag file).
  always-fail   every run exits 1.
  until-usr1    run 1 blocks SIGUSR1, writes ``STATE_DIR/ready-R-1`` and waits (at most 60 s)
                for the signal, then exits 0 without the flag; later runs finish.
  slow-stop     run 1 writes ``STATE_DIR/ready-R-1`` (its pid) and waits (at most 60 s) for
                SIGTERM, then takes 3 s (a checkpoint), writes ``STATE_DIR/stopped-R-1`` and exits
                0 without the flag; later runs finish.
  shutdown      asks ft_launcher for ShutdownWorkload, then waits (at most 60 s) to be stopped.
  exclude-first N  runs 1..N ask ft_launcher for ExcludeThisNode (it exits 65), then wait (at
                most 60 s) to be stopped; the next run finishes.
  finish        finishes at once.
  clean-exit    exits 0 without the flag (as if stopped early on purpose).
Finishing means: rank 0 writes ``$FAULT_TOL_FINISHED_FLAG_FILE`` atomically; all ranks exit 0.
Standard library and ``ft_core`` only, so a run costs well under a second.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from ft_core import RankMonitorClient, WorkloadAction, WorkloadControlRequest
from ft_core.wire.atomic import atomic_write_text

WAIT_LIMIT_S = 60.0


def record_run(state_dir: str, rank: int) -> int:
    """Append this run to runs.log and return its number for this rank (1 for the first)."""
    path = os.path.join(state_dir, "runs.log")
    previous = 0
    if os.path.exists(path):
        with open(path) as stream:
            previous = sum(1 for line in stream if line.split()[:2] == ["rank", str(rank)])
    run = previous + 1
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"rank {rank} run {run} attempt {os.environ.get('AUTORESUME_ATTEMPT', '?')}\n".encode())
    finally:
        os.close(fd)
    return run


def wait_for_all_ranks(state_dir: str, run: int) -> None:
    """Wait (at most WAIT_LIMIT_S) until every rank of the job recorded its run ``run``: a request
    sent earlier could stop the job before a slower node's worker even started."""
    path = os.path.join(state_dir, "runs.log")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        with open(path) as stream:
            ranks = [line.split()[1] for line in stream if line.startswith("rank ")]
        if all(ranks.count(str(rank)) >= run for rank in range(world_size)):
            return
        time.sleep(0.05)


def finish(rank: int) -> int:
    if rank == 0:
        atomic_write_text(os.environ["FAULT_TOL_FINISHED_FLAG_FILE"], "finished\n")
    return 0


def main() -> int:
    state_dir, behaviour = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    rank = int(os.environ.get("RANK", "0"))
    run = record_run(state_dir, rank)

    if behaviour == "fail-first":
        return 1 if run <= count else finish(rank)
    if behaviour == "always-fail":
        return 1
    if behaviour == "finish":
        return finish(rank)
    if behaviour == "clean-exit":
        return 0
    if behaviour == "until-usr1":
        if run > 1:
            return finish(rank)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        atomic_write_text(os.path.join(state_dir, f"ready-{rank}-{run}"), str(os.getpid()))
        received = signal.sigtimedwait({signal.SIGUSR1}, WAIT_LIMIT_S)
        if received is None:
            print("autoresume_worker: no SIGUSR1 within the limit", file=sys.stderr)
            return 3
        return 0  # checkpointed (pretend) and stopped early: no flag
    if behaviour == "slow-stop":
        if run > 1:
            return finish(rank)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        atomic_write_text(os.path.join(state_dir, f"ready-{rank}-{run}"), str(os.getpid()))
        if signal.sigtimedwait({signal.SIGTERM}, WAIT_LIMIT_S) is None:
            print("autoresume_worker: no SIGTERM within the limit", file=sys.stderr)
            return 3
        time.sleep(3.0)  # a checkpoint being written
        atomic_write_text(os.path.join(state_dir, f"stopped-{rank}-{run}"), str(time.time()))
        return 0
    if behaviour == "shutdown" or (behaviour == "exclude-first" and run <= count):
        action = WorkloadAction.ShutdownWorkload if behaviour == "shutdown" else WorkloadAction.ExcludeThisNode
        if rank == 0:
            wait_for_all_ranks(state_dir, run)
            RankMonitorClient().send_workload_control_request(WorkloadControlRequest(action, "autoresume test"))
        time.sleep(WAIT_LIMIT_S)  # the launcher stops all workers (SIGTERM) well before this
        print(f"autoresume_worker: not stopped after {action.name}", file=sys.stderr)
        return 3
    if behaviour == "exclude-first":
        return finish(rank)
    print(f"autoresume_worker: unknown behaviour {behaviour!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
