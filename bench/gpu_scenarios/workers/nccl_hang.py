"""Scenario 1's worker: NCCL all-reduces with heartbeats; in cycle 0 rank 1 stops calling them.

Rank 0 then waits in the all-reduce on the GPU (its ``.item()`` blocks, so its heartbeats stop
too). The process group's timeout is ``GPU_CHECK_PG_TIMEOUT`` (60 s), longer than the heartbeat
timeout, so the rank monitors should act first; NCCL's watchdog must not. Writes ``hang_at`` (epoch)
and, in the cycle that finishes, ``done_r<rank>``, into ``GPU_CHECK_OUT``.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from ft_core import RankMonitorClient

STEPS, HANG_STEP = 150, 40


def main() -> int:
    out = os.environ["GPU_CHECK_OUT"]
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())  # 2 ranks may share a GPU
    torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=float(os.environ.get("GPU_CHECK_PG_TIMEOUT", "60")))
    dist.init_process_group("nccl", timeout=timeout, device_id=device)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    data = torch.ones(1 << 20, device=device)
    for step in range(STEPS):
        if cycle == 0 and rank == 1 and step == HANG_STEP:
            with open(os.path.join(out, "hang_at"), "w") as stream:
                stream.write(repr(time.time()))
            time.sleep(3600)  # stops calling the collective, and heartbeats
        dist.all_reduce(data)
        data.div_(dist.get_world_size()).item()  # waits for the collective on the GPU
        client.send_heartbeat()
        time.sleep(0.01)
    with open(os.path.join(out, f"done_r{rank}"), "w") as stream:
        stream.write(str(cycle))
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
