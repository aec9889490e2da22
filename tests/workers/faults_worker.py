"""The worker of the fault matrix (tests/faults): stdlib + ft_core; torch with --gloo/--record-errors.

``--plan CYCLE:RANK:KIND`` (repeatable; ``*`` matches any cycle or rank) plans what goes wrong.
The worker writes, in ``--dir``:

- ``cycle<C>_rank<R>.json`` once connected to its monitor (pid, process group, session, sockets);
- ``cycle<C>_rank<R>.group.json`` (``--gloo``) once the process group works;
- ``cycle<C>_rank<R>.fault.json`` right before it misbehaves (with the pids of any children);
- ``cycle<C>_rank<R>.waiting.json`` right before it blocks in a collective whose peer failed;
- ``cycle<C>_rank<R>.done.json`` when it finished all its steps.

Kinds (``KIND``; the fault fires at step ``FAULT_STEP`` unless said otherwise):

==========================  ===========================================================
import_error                 the script fails while importing a module (before any client)
hang_before_hb               connects to its monitor, then never sends a heartbeat
hang_between_hb              stops sending heartbeats
hang_in_setup / _step /      (``--sections``) hangs with that section open
  _checkpointing
hang_out_of_section          (``--sections``) hangs with no section open
sigstop                      stops itself with SIGSTOP
gil                          a thread sends heartbeats, then the main thread calls libc
                             ``sleep`` through ``ctypes.PyDLL``, which holds the GIL: the
                             thread stops too
exit1 / os_exit3             ``sys.exit(1)`` / ``os._exit(3)``
raise                        raises an exception (exit code 1, with traceback)
sigsegv / sigkill            a real segmentation fault (``ctypes.string_at(0)``) / SIGKILL
children_hang                forks two data-loader-like children and one daemon that leaves
                             the process group and session (double fork + setsid), then hangs
raise_in_collective          (``--gloo``) raises while the other ranks wait in ``all_reduce``
exit1_after_peer_done        exits 1 once rank 0 of this cycle wrote its done record
exit1_once_warm              exits 1 once the launcher's warm template listens (so that the
                             restart is forked from it, however slowly the template started)
exclude_node                 asks the launcher for ``ExcludeThisNode``, then exits 1
shutdown_workload            asks the launcher for ``ShutdownWorkload``, then exits 1
ignore_sigterm               ignores SIGTERM from the start and keeps stepping (no failure)
==========================  ===========================================================
"""

import sys


def _planned_fault(argv: list, cycle: str, rank: str) -> str:
    """The fault planned for this cycle and rank ('' if none); first match wins."""
    for index, arg in enumerate(argv[:-1]):
        if arg == "--plan":
            want_cycle, want_rank, kind = argv[index + 1].split(":", 2)
            if want_cycle in ("*", cycle) and want_rank in ("*", rank):
                return kind
    return ""


import os  # noqa: E402

FAULT = _planned_fault(sys.argv, os.environ.get("FT_LAUNCHER_CYCLE", "-1"), os.environ.get("RANK", "-1"))
if FAULT == "import_error":
    import ft_faults_no_such_module  # noqa: F401  (a dependency missing on this node)

import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from ft_core import RankMonitorClient  # noqa: E402
from ft_core.wire.atomic import atomic_write_text  # noqa: E402

FAULT_STEP = 2
CYCLE = int(os.environ.get("FT_LAUNCHER_CYCLE", "-1"))
RANK = int(os.environ.get("RANK", "-1"))


def write(directory: str, suffix: str, **fields) -> None:
    fields.setdefault("pid", os.getpid())
    fields.setdefault("at", time.time())
    path = os.path.join(directory, f"cycle{CYCLE}_rank{RANK}{suffix}.json")
    atomic_write_text(path, json.dumps({"cycle": CYCLE, "rank": RANK, "fault": FAULT, **fields}))


def hang() -> None:
    while True:
        time.sleep(3600)


def fork_children() -> list:
    """Two children in our process group, and one daemon in its own session; returns pids."""
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                hang()
            finally:
                os._exit(0)
        pids.append(pid)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.write(write_fd, str(os.getpid()).encode())
                hang()
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    daemon = int(os.read(read_fd, 32))
    os.close(read_fd)
    return pids + [daemon]


def beat_until_exists(client, path: str, limit: float = 60.0) -> None:
    """Send heartbeats (alive while it waits) until ``path`` exists, for at most ``limit`` s."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        client.send_heartbeat()
        time.sleep(0.02)


def misbehave(args, client, fault: str) -> None:
    """Carry out a fault that ends or freezes this process."""
    if fault == "children_hang":
        write(args.dir, ".fault", children=fork_children())
        hang()
    if fault == "gil":
        beats = [0]

        def beat() -> None:
            while True:
                client.send_heartbeat()
                beats[0] += 1
                time.sleep(0.01)

        threading.Thread(target=beat, daemon=True).start()
        deadline = time.monotonic() + 10
        while beats[0] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        write(args.dir, ".fault", thread_heartbeats=beats[0])
        ctypes.PyDLL(None).sleep(3600)  # libc sleep(3) with the GIL held
        hang()
    write(args.dir, ".fault")
    if fault.startswith("hang"):
        hang()
    elif fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        hang()
    elif fault == "exit1":
        sys.exit(1)
    elif fault == "os_exit3":
        os._exit(3)
    elif fault == "raise":
        raise RuntimeError(f"injected failure in rank {RANK}")
    elif fault == "sigsegv":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
        ctypes.string_at(0)
    elif fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault in ("exclude_node", "shutdown_workload"):
        from ft_core import WorkloadAction, WorkloadControlRequest

        action = WorkloadAction.ExcludeThisNode if fault == "exclude_node" else WorkloadAction.ShutdownWorkload
        client.send_workload_control_request(WorkloadControlRequest(action, f"rank {RANK} asks for {fault}"))
        sys.exit(1)
    elif fault == "exit1_once_warm":
        # The template listens next to the monitors' sockets in the launcher's private run
        # directory, and reports itself ready to the launcher right after it binds.
        beat_until_exists(client, os.path.join(os.path.dirname(os.environ["FT_RANK_MONITOR_IPC_SOCKET"]), "warm.sock"))
        sys.exit(1)
    elif fault == "exit1_after_peer_done":
        beat_until_exists(client, os.path.join(args.dir, f"cycle{CYCLE}_rank0.done.json"))
        sys.exit(1)
    else:
        raise SystemExit(f"faults_worker: unknown fault {fault!r}")


def run(args) -> int:
    if FAULT == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    write(args.dir, "", pgid=os.getpgid(0), sid=os.getsid(0),
          monitor_socket=os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"),
          control_socket=os.environ.get("FT_LAUNCHER_IPC_SOCKET"))
    if args.gloo:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        write(args.dir, ".group", world_size=dist.get_world_size())
    if FAULT == "hang_before_hb":
        misbehave(args, client, FAULT)
    if args.sections:
        client.start_section("setup")
        if FAULT == "hang_in_setup":
            misbehave(args, client, FAULT)
        client.end_section("setup")
    steps = args.steps if CYCLE != 0 or args.steps_cycle0 is None else args.steps_cycle0
    for step in range(steps):
        fault_now = step == FAULT_STEP and FAULT not in ("", "ignore_sigterm")
        if args.gloo:
            if fault_now and FAULT == "raise_in_collective":
                time.sleep(0.5)  # the other ranks are waiting in all_reduce by now
                raise RuntimeError(f"injected failure in rank {RANK} while its peers wait in all_reduce")
            if step == FAULT_STEP and _planned_anywhere(args, "raise_in_collective"):
                write(args.dir, ".waiting")
            dist.all_reduce(tensor)
        if args.sections:
            client.start_section("step")
            if fault_now and FAULT == "hang_in_step":
                misbehave(args, client, FAULT)
            time.sleep(args.step_time)
            client.end_section("step")
            if step % 2 == 0:
                client.start_section("checkpointing")
                if step >= FAULT_STEP and FAULT == "hang_in_checkpointing":
                    misbehave(args, client, FAULT)
                client.end_section("checkpointing")
            if fault_now and FAULT not in ("hang_in_step", "hang_in_checkpointing"):
                misbehave(args, client, FAULT)
        else:
            client.send_heartbeat()
            if fault_now:
                misbehave(args, client, FAULT)
            time.sleep(args.step_time)
    write(args.dir, ".done", monitor_lost=client._conn.lost)
    if args.gloo:
        dist.destroy_process_group()
    client.shutdown_workload_monitoring()
    return 0


def _planned_anywhere(args, kind: str) -> bool:
    return any(spec.endswith(":" + kind) for spec in args.plan)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--plan", action="append", default=[], metavar="CYCLE:RANK:KIND")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--steps-cycle0", type=int, help="steps in cycle 0 (default: --steps)")
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--sections", action="store_true", help="use sections instead of heartbeats")
    parser.add_argument("--gloo", action="store_true", help="couple the ranks with a gloo all_reduce per step")
    parser.add_argument("--record-errors", action="store_true",
                        help="wrap the worker in torch's @record (its error reaches the launcher)")
    args = parser.parse_args()
    if args.record_errors:
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(run)(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
