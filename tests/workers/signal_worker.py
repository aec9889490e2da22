"""A worker that counts the signals it receives: ``signal_worker.py --dir DIR [options]``.

Started by ``ft_launcher`` in the signal tests (tests/integration/test_signals.py, tests/faults,
tests/slurm). Standard library and ``ft_core`` only.

- Installs a handler for SIGUSR1, SIGUSR2, SIGTERM, SIGINT and SIGHUP that appends one line
  ``<SIGNAME> <pid> <time>`` to ``DIR/cycle<C>_rank<R>.signals`` (one ``O_APPEND`` write per
  handler run: the line count is the number of times the handler ran).
- Connects its ``RankMonitorClient``, then writes ``DIR/cycle<C>_rank<R>.json`` (pid, process
  group, session, argv) and sends heartbeats until it is stopped (at most ``--limit`` seconds).
- ``--crash-ranks 0,1``: in cycle 0 these ranks exit 1 once the file ``DIR/crash`` exists (the
  test creates it when it wants the restart, e.g. once the warm template is ready, so that the
  next cycle is a warm restart). Any worker exits 1 once ``DIR/exit-<its pid>`` exists.
- On SIGTERM/SIGINT/SIGHUP: keeps stepping for ``--stop-delay`` seconds (a checkpoint being
  written), writes ``DIR/cycle<C>_rank<R>.stopped`` and exits ``--stop-code`` (default 0).
- ``--exit-after-usr1``: exits 0 one second after the first SIGUSR1 (a warning honoured).
- ``--spawn-daemon``: forks a child that leaves the session (double fork + ``setsid``) and
  sleeps; its pid goes into the record as ``daemon``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from ft_core import RankMonitorClient
from ft_core.wire.atomic import atomic_write_text

CYCLE = int(os.environ.get("FT_LAUNCHER_CYCLE", "-1"))
RANK = int(os.environ.get("RANK", "-1"))
COUNTED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def path(directory: str, suffix: str, cycle: int = CYCLE, rank: int = RANK) -> str:
    return os.path.join(directory, f"cycle{cycle}_rank{rank}{suffix}")


def spawn_daemon() -> int:
    """A grandchild in its own session, re-parented away from us; returns its pid."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.close(read_end)
            os.close(write_end)
            time.sleep(600)
            os._exit(0)
        os.write(write_end, str(grandchild).encode())
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32))
    os.close(read_end)
    os.waitpid(child, 0)
    return pid


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--crash-ranks", default="")
    parser.add_argument("--stop-delay", type=float, default=0.0)
    parser.add_argument("--stop-code", type=int, default=0)
    parser.add_argument("--exit-after-usr1", action="store_true")
    parser.add_argument("--spawn-daemon", action="store_true")
    parser.add_argument("--limit", type=float, default=120.0)
    args = parser.parse_args()

    log_fd = os.open(path(args.dir, ".signals"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stop_at: list[float] = []
    usr1_at: list[float] = []

    def on_signal(signum: int, _frame: object) -> None:
        now = time.time()
        os.write(log_fd, f"{signal.Signals(signum).name} {os.getpid()} {now:.4f}\n".encode())
        if signum in STOPPING and not stop_at:
            stop_at.append(time.monotonic() + args.stop_delay)
        if signum == signal.SIGUSR1 and not usr1_at:
            usr1_at.append(time.monotonic() + 1.0)

    for sig in COUNTED:
        signal.signal(sig, on_signal)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    record = {"cycle": CYCLE, "rank": RANK, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
              "argv": sys.argv, "daemon": spawn_daemon() if args.spawn_daemon else None}
    atomic_write_text(path(args.dir, ".json"), json.dumps(record))
    deadline = time.monotonic() + args.limit
    while time.monotonic() < deadline:
        client.send_heartbeat()
        if CYCLE == 0 and str(RANK) in args.crash_ranks.split(",") and os.path.exists(
                os.path.join(args.dir, "crash")):
            return 1
        if os.path.exists(os.path.join(args.dir, f"exit-{os.getpid()}")):
            return 1
        now = time.monotonic()
        if stop_at and now >= stop_at[0]:
            atomic_write_text(path(args.dir, ".stopped"), json.dumps({"at": time.time()}))
            client.shutdown_workload_monitoring()
            return args.stop_code
        if args.exit_after_usr1 and usr1_at and now >= usr1_at[0]:
            client.shutdown_workload_monitoring()
            return 0
        time.sleep(0.02)
    print(f"signal_worker: rank {RANK} not stopped within {args.limit} s", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
