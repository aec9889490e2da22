"""A worker for signals that arrive during a restart: ``restart_signal_worker.py --dir DIR [options]``.

Started by ``ft_launcher`` (2 ranks) in tests/integration/test_signal_during_restart.py. Standard
library and ``ft_core`` only.

- Cycle 0: rank 0 exits 1 once ``DIR/crash`` exists. Rank 1, which the launcher then stops with
  SIGTERM, writes ``DIR/cycle0_rank1.stopping`` and exits 0 once ``DIR/go`` exists: the test
  sends its signal in between, while neither rank has a live worker that could take it.
- Cycles 1 and later: the worker writes ``DIR/cycle<C>_rank<R>.spawned`` at once, then takes
  ``--startup-delay`` seconds before it installs its handlers (as a worker that imports torch),
  so a signal that reaches it meanwhile kills it.
- Every cycle: a handler for SIGUSR1 and SIGTERM appends ``<SIGNAME> <pid> <time>`` to
  ``DIR/cycle<C>_rank<R>.signals`` (one line per handler run); then the worker connects its
  client, writes ``DIR/cycle<C>_rank<R>.json`` (its pid) and sends heartbeats. A worker of cycle
  1 or later exits 0 once ``DIR/done`` exists.
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


def path(directory: str, suffix: str) -> str:
    return os.path.join(directory, f"cycle{CYCLE}_rank{RANK}{suffix}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--startup-delay", type=float, default=1.5)
    parser.add_argument("--limit", type=float, default=120.0)
    args = parser.parse_args()
    exists = lambda name: os.path.exists(os.path.join(args.dir, name))  # noqa: E731

    if CYCLE >= 1:
        atomic_write_text(path(args.dir, ".spawned"), json.dumps({"pid": os.getpid(), "at": time.time()}))
        time.sleep(args.startup_delay)  # no handler yet: SIGUSR1's default action would end us
    log_fd = os.open(path(args.dir, ".signals"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stopping: list[bool] = []

    def on_signal(signum: int, _frame: object) -> None:
        os.write(log_fd, f"{signal.Signals(signum).name} {os.getpid()} {time.time():.4f}\n".encode())
        if signum == signal.SIGTERM:
            stopping.append(True)

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, on_signal)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    atomic_write_text(path(args.dir, ".json"), json.dumps({"pid": os.getpid(), "cycle": CYCLE, "rank": RANK}))
    deadline = time.monotonic() + args.limit
    while time.monotonic() < deadline:
        client.send_heartbeat()
        if CYCLE == 0 and RANK == 0 and exists("crash"):
            return 1
        if CYCLE == 0 and stopping:
            atomic_write_text(path(args.dir, ".stopping"), "")
            while not exists("go") and time.monotonic() < deadline:
                time.sleep(0.005)
            client.shutdown_workload_monitoring()
            return 0
        if CYCLE >= 1 and (exists("done") or stopping):
            client.shutdown_workload_monitoring()
            return 0
        time.sleep(0.01)
    print(f"restart_signal_worker: rank {RANK} not done within {args.limit} s", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
