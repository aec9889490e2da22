"""A configurable worker for ft_launcher tests (stdlib + ft_core; torch only with --gloo).

Each run writes ``<record-dir>/cycle<C>_rank<R>.json`` (pid, env, effective config) so tests can
check what the launcher gave it, then runs ``--steps`` heartbeat steps and misbehaves as told.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from ft_core import RankMonitorClient, WorkloadAction, WorkloadControlRequest
from ft_core.wire.atomic import atomic_write_text


def matches(selected_rank, selected_cycle, rank, cycle):
    return selected_rank is not None and selected_rank in (rank, -1) and (
        selected_cycle is None or selected_cycle == cycle or (selected_cycle < 0 and cycle < -selected_cycle))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--record-dir")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--hang-rank", type=int)
    p.add_argument("--hang-cycle", type=int, help="negative -N: all cycles below N")
    p.add_argument("--hang-in-section")
    p.add_argument("--crash-rank", type=int)
    p.add_argument("--crash-cycle", type=int)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--signal-self")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--request", choices=["shutdown", "exclude"])
    p.add_argument("--request-rank", type=int, default=0)
    p.add_argument("--request-cycle", type=int)
    p.add_argument("--gloo", action="store_true")
    p.add_argument("--spawn-children", type=int, default=0)
    p.add_argument("--no-client", action="store_true")
    p.add_argument("--wait-for-signal", action="store_true", help="after the steps, wait for SIGUSR1")
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "-1"))
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    got_usr1 = []
    signal.signal(signal.SIGUSR1, lambda *_: got_usr1.append(time.time()))
    client = None if args.no_client else RankMonitorClient()
    if client is not None:
        client.init_workload_monitoring()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                for _ in range(args.spawn_children)]
    record = {
        "rank": rank, "cycle": cycle, "pid": os.getpid(), "pgid": os.getpgid(0),
        "children": [c.pid for c in children],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("FT_", "FAULT_TOL", "RANK", "LOCAL_RANK",
                                                                      "WORLD_SIZE", "MASTER_", "TORCHELASTIC"))},
        "cfg": client.cfg.to_dict() if client else None,
    }
    if args.gloo:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size()
        record["process_group_ready"] = True
    if args.record_dir:
        atomic_write_text(os.path.join(args.record_dir, f"cycle{cycle}_rank{rank}.json"), json.dumps(record))
    if args.request and args.request_rank in (rank, -1) and args.request_cycle in (None, cycle):
        action = {"shutdown": WorkloadAction.ShutdownWorkload, "exclude": WorkloadAction.ExcludeThisNode}[args.request]
        client.send_workload_control_request(WorkloadControlRequest(action, f"test asked for {args.request}"))
        return 1  # a worker usually dies right after asking
    for step in range(args.steps):
        if args.gloo:
            dist.all_reduce(t)  # couples the ranks like a training step does
        if client is not None:
            client.send_heartbeat()
        if matches(args.crash_rank, args.crash_cycle, rank, cycle) and step == args.steps // 2:
            if args.signal_self:
                os.kill(os.getpid(), getattr(signal, args.signal_self))
            os._exit(args.exit_code)
        if matches(args.hang_rank, args.hang_cycle, rank, cycle) and step == args.steps // 2:
            if args.hang_in_section:
                client.start_section(args.hang_in_section)
            time.sleep(3600)
        time.sleep(args.step_time)
    if args.wait_for_signal:
        deadline = time.time() + 60
        while not got_usr1 and time.time() < deadline:
            time.sleep(0.01)
        print(f"rank {rank} got SIGUSR1: {bool(got_usr1)}", flush=True)
        if args.record_dir:
            atomic_write_text(os.path.join(args.record_dir, f"usr1_rank{rank}.json"), json.dumps(got_usr1))
    if args.ignore_sigterm:
        time.sleep(3600)
    if args.gloo:
        dist.destroy_process_group()
    if client is not None:
        client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
