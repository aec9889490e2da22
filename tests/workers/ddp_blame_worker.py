"""A plain DDP training loop (gloo, CPU) in which one rank sleeps inside a step (issue 31 item 7).

Every step: ``set_step``, a forward of a small ``DistributedDataParallel`` model, ``backward``
(DDP all-reduces the gradients inside it, out of Python's sight), an optimizer step. With
``--api sections`` the step is the section ``step``; with ``--api heartbeat`` a heartbeat ends
each step. In cycle 0, ``--fault-rank`` sleeps in ``sleep_inside_step`` at ``--fault-step``
after its forward and before its backward, so its peers wait for it inside ``loss.backward()``.
With ``--lag S`` the fault rank's last progress before the hang comes S seconds after its
peer's (it opens the section of the fault step late, or sends the heartbeat of the step before
late: a slower data loader), so a rule that went by the clocks would blame the peer.
Later cycles run clean. Writes ``<dir>/cycle<C>_rank<R>.json`` (pid) once started.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ft_core import RankMonitorClient
from ft_core.wire.atomic import atomic_write_text


def sleep_inside_step() -> None:
    time.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--api", choices=["sections", "heartbeat"], required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=12)
    parser.add_argument("--lag", type=float, default=0.0)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(4, 16)
    atomic_write_text(os.path.join(args.dir, f"cycle{cycle}_rank{rank}.json"),
                      json.dumps({"pid": os.getpid(), "rank": rank, "cycle": cycle}))
    sections = args.api == "sections"
    faulty = cycle == 0 and rank == args.fault_rank
    for step in range(args.steps):
        if sections:
            if faulty and step == args.fault_step:
                time.sleep(args.lag)
            client.start_section("step")
        client.set_step(step)
        loss = model(batch).square().mean()
        if faulty and step == args.fault_step:
            sleep_inside_step()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if sections:
            client.end_section("step")
        else:
            if faulty and step == args.fault_step - 1:
                time.sleep(args.lag)
            client.send_heartbeat()
    dist.destroy_process_group()
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
