"""A hand-written DDP loop (gloo, CPU) with ft_core.integration.straggler_detection, for tests.

``python straggler_loop.py STEPS SLOW_RANK`` under ft_launcher/torchrun: every rank's forward
sleeps 20 ms (a stand-in for compute), SLOW_RANK's 1.5x that. Prints one JSON line per report on
rank 0: {"report": index, "relative": [ranks flagged], "stop": bool}.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import torch
import torch.distributed as dist

import ft_core.integration as ft_integration


class Net(torch.nn.Module):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 16)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.l1(x)


def main(steps: int, slow_rank: int) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(Net(0.03 if rank == slow_rank else 0.02))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stragglers = ft_integration.straggler_detection(report_time_interval=0.6, individual_threshold=None,
                                                    relative_threshold=0.8)
    assert stragglers.instrument(model)
    reports = 0
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        outcome = stragglers.on_training_step_end()
        if outcome is not None:
            reports += 1
        if outcome is not None and rank == 0:
            print(json.dumps({"report": reports, "stop": outcome.stop,
                              "relative": sorted(s.rank for s in outcome.relative)}), flush=True)
    stragglers.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
