"""Scenario 6's worker: a 2-rank NCCL DDP loop whose state is tracked for just-in-time saving
(issue 32: ``track_state`` / ``load_jit_state``). In cycle 0 rank 1 freezes itself (``SIGSTOP``) at
``FREEZE_STEP``; rank 0 is then blocked in the gradient all-reduce on the GPU, and the launcher asks it
to copy its state to host memory before stopping it. The restarted ranks load that state; rank 0
writes the step it resumed from (or ``none``) to ``GPU_CHECK_OUT/resumed``.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ft_core import RankMonitorClient
from ft_core.client import integration

STEPS, FREEZE_STEP = 120, 60


def main() -> int:
    out = os.environ["GPU_CHECK_OUT"]
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    integration.track_state(model, opt)
    start = integration.load_jit_state(model, opt)
    if rank == 0 and cycle > 0:
        with open(os.path.join(out, "resumed"), "w") as stream:
            stream.write("none" if start is None else str(start))
    ddp = DistributedDataParallel(model, device_ids=[device.index])
    x, y = torch.randn(256, 1024, device=device), torch.randn(256, 1, device=device)
    for step in range((start or 0) + 1 if start is not None else 0, STEPS):
        if cycle == 0 and rank == 1 and step == FREEZE_STEP:
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen: rank 0 waits in the next all-reduce
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # the gradient all-reduce
        opt.step()
        torch.cuda.synchronize()
        client.send_heartbeat()
        time.sleep(0.01)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
