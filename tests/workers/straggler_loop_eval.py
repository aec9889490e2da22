"""A hand-written 2+ rank DDP loop (gloo, CPU) with ft_core.integration.straggler_detection, for tests.

``python straggler_loop_eval.py CONFIG_JSON`` under ft_launcher. Config keys:

* ``steps``: training steps (default 60);
* ``fwd_ms``: {"<rank>": milliseconds} slept in that rank's forward (default none: a small Linear);
* ``more_fwd_ms``: {"<rank>": [step, milliseconds]}: that rank's forward sleeps this much more from
  that training step on (its own speed changes, as on a machine whose load changes);
* ``eval_rank``: this rank alone runs evaluation forwards between its training steps (sample
  predictions): on odd steps ``ddp(x)`` under ``torch.no_grad()``, on even steps the wrapped module
  in eval mode with autograd on; the others never do (default: no rank);
* ``report_time_interval`` (default 0.5), ``relative_threshold`` (0.8), ``individual_threshold``
  (0.7; null: off), ``min_samples`` (8).

Every rank prints one JSON line per report: {"rank", "report", "steps", "relative": [flagged ranks],
"individual": [flagged ranks], "compute_ms": {rank: median forward + backward}}.
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
        self.l1 = torch.nn.Linear(32, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.delay = delay
        self.extra = 0.0  # set from a step on: see more_fwd_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra:
            time.sleep(self.extra)
        if self.delay:
            time.sleep(self.delay)
        return self.l2(torch.relu(self.l1(x)))


def main(cfg: dict) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    delay = float(cfg.get("fwd_ms", {}).get(str(rank), 0)) / 1000.0
    model = torch.nn.parallel.DistributedDataParallel(Net(delay))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stragglers = ft_integration.straggler_detection(
        report_time_interval=float(cfg.get("report_time_interval", 0.5)),
        relative_threshold=cfg.get("relative_threshold", 0.8),
        individual_threshold=cfg.get("individual_threshold", 0.7),
        min_samples=int(cfg.get("min_samples", 8)))
    assert stragglers.instrument(model)
    evaluates = cfg.get("eval_rank") == rank
    more_from, more_ms = cfg.get("more_fwd_ms", {}).get(str(rank), (None, 0.0))
    reports = 0
    for step in range(int(cfg.get("steps", 60))):
        if step == more_from:
            model.module.extra = float(more_ms) / 1000.0
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        if evaluates:  # sample predictions on this rank only, between two training steps
            if step % 2:
                with torch.no_grad():
                    model(torch.randn(2, 32))
            else:
                model.module.eval()
                model.module(torch.randn(2, 32))
                model.module.train()
        outcome = stragglers.on_training_step_end()
        if outcome is None:
            continue
        reports += 1
        report = stragglers.last_report
        assert report is not None
        print(json.dumps({"rank": rank, "report": reports, "steps": step + 1,
                          "relative": sorted(s.rank for s in outcome.relative),
                          "individual": sorted(s.rank for s in outcome.individual),
                          "compute_ms": {r: t.median_s * 1000.0 for r, t in report.timings.items()}}), flush=True)
    stragglers.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
