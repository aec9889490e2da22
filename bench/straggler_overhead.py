"""Per-step cost of straggler detection's measurement (ft_core.straggler.timing), on this CPU.

A one-process gloo DDP job (the hooks and the reducer work as with more ranks; the all-reduce is
local) runs the same small step in alternating blocks: plain DDP, and DDP instrumented by
``ComputeTimer`` (a wrapper around the wrapped module's forward, one gradient hook on the
parameter whose gradient comes last). Prints the median
step time of each and the median of the paired block differences, in microseconds; and the cost
of the measurement's own calls alone (called directly). The reference's callback
(nvidia-resiliency-ext 0.4.1) cannot run here: its ``Detector`` needs CUDA (CUPTI, and
``torch.cuda.synchronize()`` in every report), so it has no CPU number to stand next to ours.

Run: ``python bench/straggler_overhead.py [--steps N] [--blocks N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ft_core.straggler.timing import ComputeTimer  # noqa: E402


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def _block(ddp: torch.nn.Module, opt: torch.optim.Optimizer, data: torch.Tensor, steps: int) -> float:
    """Seconds per step over ``steps`` steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        ddp(data).sum().backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def _direct_cost(calls: int) -> float:
    """Microseconds per step of the timer's own calls: forward start, forward end, gradient hook."""
    timer = ComputeTimer(use_cuda=False)
    timer._measures_backward = True
    t0 = time.perf_counter()
    for _ in range(calls):
        timer._forward_start()
        timer._forward_end()
        timer._backward_end(None)
        if len(timer._samples) > 10_000:
            timer._samples.clear()
    return (time.perf_counter() - t0) / calls * 1e6


def _paired(plain: Callable[[], None], timed: Callable[[], None], blocks: int, calls: int) -> tuple[float, float]:
    """Median µs per call of ``plain`` and median paired difference (timed - plain), alternating ABBA blocks."""
    per: dict[str, list[float]] = {"plain": [], "timed": []}
    for i in range(blocks):
        order = (("plain", plain), ("timed", timed)) if i % 2 == 0 else (("timed", timed), ("plain", plain))
        for name, fn in order:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per[name].append((time.perf_counter() - t0) / calls * 1e6)
    diffs = [t - p for t, p in zip(per["timed"], per["plain"], strict=True)]
    return statistics.median(per["plain"]), statistics.median(diffs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100, help="DDP steps per block")
    parser.add_argument("--blocks", type=int, default=60, help="blocks per variant (alternating)")
    parser.add_argument("--profiling-interval", type=int, default=1, help="the timer's profiling_interval")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, object] = {}
    # 1. the forward wrapper: a tiny module's call with and without it
    plain_mod, timed_mod = _model(), _model()
    timer = ComputeTimer(use_cuda=False)
    timer.attach(timed_mod)
    x = torch.randn(1, 64)
    with torch.no_grad():
        base, added = _paired(lambda: plain_mod(x), lambda: timed_mod(x), args.blocks, 2000)
    result.update(forward_call_us=base, forward_wrapper_added_us=added)
    timer.detach()
    # 2. a whole DDP step (forward, backward, all-reduce, SGD) with and without the timer
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            data = torch.randn(16, 64)
            plain = torch.nn.parallel.DistributedDataParallel(_model())
            timed = torch.nn.parallel.DistributedDataParallel(_model())
            timer = ComputeTimer(use_cuda=False, profiling_interval=args.profiling_interval)
            assert timer.attach(timed.module)
            opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.01) for m in (plain, timed)}
            for m in (plain, timed):  # warm-up (bucket rebuild, the timer's learning backwards)
                _block(m, opts[id(m)], data, 20)
            base, added = _paired(lambda: _block(plain, opts[id(plain)], data, 1),
                                  lambda: _block(timed, opts[id(timed)], data, 1), args.blocks, args.steps)
            samples = timer.take_samples()
        finally:
            dist.destroy_process_group()
    result.update(ddp_step_us=base, ddp_step_added_us=added, samples_per_step=len(samples) / max(1, timer.steps))
    result["timer_calls_us"] = _direct_cost(200_000)
    result.update(blocks=args.blocks, steps=args.steps, profiling_interval=args.profiling_interval,
                  reference="not measurable here: nvidia-resiliency-ext 0.4.1's Detector needs CUDA (CUPTI)")
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
