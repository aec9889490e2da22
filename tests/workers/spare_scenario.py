"""The worker of the spare-node scenarios (tests/integration/test_reference_scenarios.py).

Like the reference's own scenario workers it needs no process group (the launchers, not a failed
collective, must notice a node that leaves): it sends heartbeats and counts itself in a directory
shared by every node of the job:

- ``<state-dir>/runs``: one line per run of the workload, written by global rank 0 at its start
  (the run count);
- ``<state-dir>/alive/<pid>``: this worker, while it runs (the world size: the live ones);
- ``<state-dir>/finish``: when it appears, every worker exits 0 (the end of the job);
- ``--control-file``: this node's command file; ``exclude`` makes this node's worker consume it
  (unlink it), send ``ExcludeThisNode`` and exit 1, as a worker that hit a node fault does.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from ft_core import RankMonitorClient, WorkloadAction, WorkloadControlRequest


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--state-dir", required=True)
    p.add_argument("--control-file")
    p.add_argument("--max-time", type=float, default=90.0, help="a bound: exit 0 after this many seconds")
    args = p.parse_args()
    state = Path(args.state_dir)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    alive = state / "alive" / str(os.getpid())

    def leave(*_: object) -> None:
        alive.unlink(missing_ok=True)
        os._exit(143)  # at once, even while the interpreter shuts down (sys.exit there only prints)

    signal.signal(signal.SIGTERM, leave)
    alive.parent.mkdir(exist_ok=True)
    alive.write_text(f"{rank} {world_size}\n")
    if rank == 0:
        with open(state / "runs", "a") as runs:  # O_APPEND: one whole line per run
            runs.write(f"{world_size} {os.getpid()}\n")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    control = Path(args.control_file) if args.control_file else None
    deadline = time.monotonic() + args.max_time
    while time.monotonic() < deadline and not (state / "finish").exists():
        client.send_heartbeat()
        if control is not None and control.exists():
            command = control.read_text().strip()
            control.unlink()
            if command == "exclude":
                client.send_workload_control_request(
                    WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "test node exclusion"))
                alive.unlink(missing_ok=True)
                return 1
        time.sleep(0.1)
    client.shutdown_workload_monitoring()
    alive.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
