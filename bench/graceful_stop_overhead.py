"""What the graceful stop's agreement costs per training step: 2 ranks, gloo on CPU.

Two processes form a gloo group (``torch.multiprocessing``, a TCP store on localhost). Each runs
blocks of ``--block`` steps of ``--step-us`` microseconds of busy work, alternately without and
with :meth:`ft_core.client.graceful_stop.GracefulStop.step_ended` after every step (ABBA order, so a
change in the machine's load affects both alike). Reported, from rank 0: the time per step in each
mode and the difference (what the agreement adds per step, on average), the agreement checks per
second and the cost of one check (its all-reduce of two numbers, timed on its own). No signal is
sent: this is the cost a run pays all along.

Run: ``python bench/graceful_stop_overhead.py [--steps 200000] [--step-us 1000] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import emit, summarize  # noqa: E402


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def rank_main(rank: int, port: int, args: argparse.Namespace, queue) -> None:
    import torch
    import torch.distributed as dist

    from ft_core.client.collectives import TorchDistributedCollectives
    from ft_core.client.graceful_stop import GracefulStop, GracefulStopConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    collectives = TorchDistributedCollectives()
    stop = GracefulStop(GracefulStopConfig(check_interval=args.check_interval))  # not installed: no handlers needed
    work = args.step_us / 1e6
    per_mode: dict[str, list[float]] = {"without": [], "with": []}
    blocks = args.steps // args.block
    for index in range(blocks):
        order = ("without", "with") if index % 2 == 0 else ("with", "without")
        for mode in order:
            dist.barrier()
            start = time.perf_counter()
            if mode == "with":
                for _ in range(args.block):
                    busy(work)
                    stop.step_ended(collectives)
            else:
                for _ in range(args.block):
                    busy(work)
            per_mode[mode].append((time.perf_counter() - start) / args.block)
    checks_with = stop.checks
    # One check on its own: the all-reduce of two numbers the agreement runs.
    samples = []
    for _ in range(200):
        dist.barrier()
        start = time.perf_counter()
        collectives.all_max([0.0, -1.0])
        samples.append(time.perf_counter() - start)
    if rank == 0:
        with_steps = args.block * len(per_mode["with"])
        with_seconds = sum(per_mode["with"]) * args.block
        diffs = [w - o for w, o in zip(per_mode["with"], per_mode["without"], strict=True)]
        queue.put({
            "steps_per_mode": with_steps, "step_work_us": args.step_us, "check_interval_s": args.check_interval,
            "step_us_without": summarize([v * 1e6 for v in per_mode["without"]], 2),
            "step_us_with": summarize([v * 1e6 for v in per_mode["with"]], 2),
            "added_us_per_step": summarize([d * 1e6 for d in diffs], 3),
            "added_us_per_step_mean": round(statistics.mean(diffs) * 1e6, 3),
            "checks": checks_with, "checks_per_s": round(checks_with / with_seconds, 2),
            "check_us": summarize([s * 1e6 for s in samples], 1),
        })
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000, help="steps per mode")
    parser.add_argument("--block", type=int, default=2000, help="steps per block")
    parser.add_argument("--step-us", type=float, default=1000.0, help="busy work per step")
    parser.add_argument("--check-interval", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(rank, port, args, queue)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    result = queue.get(timeout=3600)
    for proc in procs:
        proc.join(60)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
