"""A worker whose node, not its code, fails it (issue 23's in-job node exclusion).

Every rank joins a gloo group and all-reduces at each step (a failure on one node fails the
others' collectives, so every node records the cycle's failure and chooses the same root); it
reports its step with ``set_step``. A rank raises ``ValueError("bad shard <random number>")`` at
``--crash-step`` when its launcher's environment says so: ``NODE_CRASH=any`` on every cycle, or
``NODE_CRASH=<path>`` once that file exists (a node that fails once another one has left). Only
that launcher's environment has the variable, as only a bad node has the bad disk. ``@record``
writes the exception to torch's error file.
"""

import argparse
import os
import random
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ft_core import RankMonitorClient


def crashes_here() -> bool:
    """True if this node's environment asks for the crash now."""
    wanted = os.environ.get("NODE_CRASH", "")
    return wanted == "any" or (wanted != "" and os.path.exists(wanted))


def shard(step: int, crash_step: int) -> None:
    """The step's data: a bad shard where this node fails."""
    if step == crash_step and crashes_here():
        raise ValueError(f"bad shard {random.randrange(10**6)}")


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--crash-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.01)
    args = p.parse_args()
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    tensor = torch.ones(1)
    for step in range(args.steps):
        client.set_step(step)
        client.send_heartbeat()
        shard(step, args.crash_step)
        dist.all_reduce(tensor)  # couples the ranks like a training step does
        time.sleep(args.step_time)
    dist.destroy_process_group()
    client.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
