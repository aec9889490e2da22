"""Exercise straggler detection's CUDA path on one GPU and print what it measured.

One process, no process group: a small model on ``cuda:0`` whose step is made slower in the
forward for the second half of the run (a larger matmul), instrumented with
``ft_core.straggler.Detector``. Prints each report's individual score and the forward/backward
medians the CUDA events measured; the slowed half must show a lower individual score. Also checks
that nothing synchronises per step (the events are read at the report only).

Run on a GPU machine: ``python bench/straggler_cuda_check.py [--steps N]``; exits 1 if the CUDA path
did not measure or did not see the slowdown, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ft_core.straggler import Detector  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(2048, 2048)
        self.l2 = torch.nn.Linear(2048, 2048)
        self.extra = 0  # matmuls added to the forward (the "slow" half)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x))
        for _ in range(self.extra):
            h = h @ self.l2.weight.detach().T / 45.0
        return self.l2(h)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: nothing to check")
        return 2
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048, device="cuda")
    Detector.initialize(report_time_interval=0.1, scores_to_compute="all")
    assert Detector.instrument(model), "the backward is not measured"
    reports = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        model.extra = 4 if step >= args.steps // 2 else 0
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        report = Detector.generate_report_if_interval_elapsed()
        if report is not None:
            t = report.timings[0]
            print(f"report {report.index}: step {step} individual {report.gpu_individual_perf_scores.get(0)} "
                  f"median compute {t.median_s * 1e3:.3f} ms over {t.samples} samples")
            reports.append((step, report))
    torch.cuda.synchronize()
    print(f"{args.steps} steps in {time.perf_counter() - t0:.2f} s")
    Detector.shutdown()
    fast = [r.gpu_individual_perf_scores.get(0, 1.0) for s, r in reports if s < args.steps // 2]
    slow = [r.gpu_individual_perf_scores.get(0, 1.0) for s, r in reports if s >= args.steps // 2 + 100]
    measured = any(r.timings[0].samples > 0 for _, r in reports)
    # the slowed half must score clearly below every report of the normal half
    ok = measured and bool(slow) and bool(fast) and max(slow) < min(fast)
    print("CUDA path:", "OK" if ok else f"FAILED (fast {fast}, slow {slow}, measured {measured})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
