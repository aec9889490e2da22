"""A worker with a bug that comes back after every restart (issue 23's crash loop).

Runs steps with heartbeats and ``set_step``; rank ``--crash-rank`` raises
``ValueError("bad shard <random number>")`` at step ``--crash-step`` + ``--advance`` x cycle
(``--advance 0``: the same step every cycle, a deterministic bug; more: progress between
failures). ``@record`` writes the exception to torch's error file, as a training script of
torchrun's documentation does.
"""

import argparse
import os
import random
import time

from torch.distributed.elastic.multiprocessing.errors import record

from ft_core import RankMonitorClient


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--crash-step", type=int, default=30)
    p.add_argument("--advance", type=int, default=0)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.01)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    client = RankMonitorClient()
    client.init_workload_monitoring()
    crash_at = args.crash_step + args.advance * cycle
    for step in range(args.steps):
        client.set_step(step)
        client.send_heartbeat()
        if rank == args.crash_rank and step == crash_at:
            raise ValueError(f"bad shard {random.randrange(10**6)}")
        time.sleep(args.step_time)
    client.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
