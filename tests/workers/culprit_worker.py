"""A training loop for the detection tests: one rank freezes, crashes, hangs or blocks.

Every step: ``set_step``, one gloo ``all_reduce`` (couples the ranks as a training step does;
not with ``--no-gloo``), a heartbeat. In cycle 0, ``--fault-rank`` does ``--fault`` at
``--fault-step`` (after its heartbeat), inside a function named after the fault so the stack
shows it:

- ``sigstop``: ``freeze_here`` stops its own process (SIGSTOP);
- ``sigkill``: ``die_here`` kills its own process (SIGKILL);
- ``gil``: ``busy_in_c_holding_the_gil`` sleeps in a C call that keeps the GIL;
- ``hang``: ``hang_here`` sleeps (an ordinary, interruptible hang);
- ``crash``: ``crash_here`` exits with code 1.

With gloo the others block in the next step's ``all_reduce``; with ``--stall-others`` they stop
heartbeating at the same step, ignoring SIGTERM. ``--term-handler`` installs, in the fault rank
of cycle 0, a SIGTERM handler that returns (``return``) or exits 0 (``exit0``). Later cycles run
clean (``--later-steps`` steps). Writes ``<dir>/cycle<C>_rank<R>.json`` (pid) once started.
"""

import argparse
import ctypes
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from ft_core import RankMonitorClient
from ft_core.wire.atomic import atomic_write_text


def freeze_here() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def die_here() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def busy_in_c_holding_the_gil() -> None:
    ctypes.PyDLL(None).sleep(120)


def hang_here() -> None:
    time.sleep(3600)


def crash_here() -> None:
    os._exit(1)


def stall_here() -> None:
    time.sleep(3600)


def on_sigterm(mode: str):
    def handler(signum, frame):
        print(f"rank {os.environ['RANK']}: SIGTERM handler ({mode})", flush=True)
        if mode == "exit0":
            sys.exit(0)
    return handler


FAULTS = {"sigstop": freeze_here, "sigkill": die_here, "gil": busy_in_c_holding_the_gil, "hang": hang_here,
          "crash": crash_here}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--later-steps", type=int, help="steps in the cycles after cycle 0 (default: --steps)")
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--fault", choices=sorted(FAULTS))
    parser.add_argument("--fault-rank", type=int, default=1, help="-1: every rank given --fault")
    parser.add_argument("--fault-step", type=int, default=10)
    parser.add_argument("--no-step", action="store_true", help="do not call set_step")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--stall-others", action="store_true")
    parser.add_argument("--term-handler", choices=["return", "exit0"])
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    faulty = args.fault and cycle == 0
    fault_rank = rank if args.fault_rank == -1 else args.fault_rank
    if faulty and rank == fault_rank and args.term_handler:
        signal.signal(signal.SIGTERM, on_sigterm(args.term_handler))
    if faulty and rank != fault_rank and args.stall_others:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before the fault rank can fail
    client = RankMonitorClient()
    client.init_workload_monitoring()
    gloo = not args.no_gloo
    tensor = torch.ones(1)
    if gloo:
        dist.init_process_group("gloo")
        dist.all_reduce(tensor)
    atomic_write_text(os.path.join(args.dir, f"cycle{cycle}_rank{rank}.json"),
                      json.dumps({"pid": os.getpid(), "rank": rank, "cycle": cycle}))
    if not gloo:
        # Without a process group nothing lines the ranks up: wait until every rank has set up
        # (signal handlers, client) before any of them reaches its fault step.
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(args.dir, f"cycle{cycle}_rank{r}.json")) for r in range(world)):
            if time.monotonic() > deadline:
                raise SystemExit(f"rank {rank}: the other ranks did not start within 60 s")
            time.sleep(0.01)
    # (getattr: the same worker runs against older ft_core, to show what a fix changed)
    set_step = getattr(client, "set_step", None) if not args.no_step else None
    steps = args.steps if cycle == 0 or args.later_steps is None else args.later_steps
    for step in range(steps):
        if set_step is not None:
            set_step(step)
        if gloo:
            dist.all_reduce(tensor)
        client.send_heartbeat()
        if faulty and step == args.fault_step:
            if rank == fault_rank:
                FAULTS[args.fault]()
            elif args.stall_others:
                stall_here()
        time.sleep(args.step_time)
    if gloo:
        dist.destroy_process_group()
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
