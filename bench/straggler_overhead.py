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

from ft_core.straggler.timing import WALL_CLOCK_SAMPLE_EVERY, ComputeTimer  # noqa: E402


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


class _Scale(torch.nn.Module):
    """The smallest step with a forward and a backward: one parameter, one multiply."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * x).sum()


class _NoopForward(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self) -> None:
        return None


def _timer_code_cost(calls: int) -> float:
    """µs per step of the timer's own Python code on its common path: the forward wrapper around a
    no-op forward, and the gradient hook called directly. Precise, as it leaves out what varies
    with the machine's load; the autograd engine's call of the hook is in ``minimal_step_added_us``."""
    module = _NoopForward()
    timer = ComputeTimer(use_cuda=False)
    timer.attach(module)
    timer._learning.clear()  # as after the learning backwards: the weight's gradient comes last
    timer._last_param = module.weight
    assert timer._fast, "the timer's common path is not active"
    wrapped, hook, noop = module.forward, timer._backward_end, _NoopForward.forward.__get__(module)
    best = {}
    for name, forward in (("timed", wrapped), ("plain", noop)):
        runs = []
        for _ in range(5):
            t0 = time.process_time()
            for _ in range(calls):
                forward()
                hook(None)
            runs.append((time.process_time() - t0) / calls * 1e6)
            timer.take_samples()
        best[name] = min(runs)
    timer.detach()
    return best["timed"] - best["plain"]


def _attached_vs_not(module: torch.nn.Module, step: Callable[[], None], blocks: int, calls: int,
                     profiling_interval: int = 1) -> tuple[float, float, int]:
    """Median µs per ``step`` without the timer and median paired difference with it, on the same
    module (attached and detached block by block, alternating ABBA: no instance or layout bias).

    Returns:
        (µs per plain step, µs added per step, samples the timer took).
    """
    per: dict[str, list[float]] = {"plain": [], "timed": []}
    samples = 0
    for i in range(blocks):
        for name in (("plain", "timed") if i % 2 == 0 else ("timed", "plain")):
            timer = None
            if name == "timed":
                timer = ComputeTimer(use_cuda=False, profiling_interval=profiling_interval)
                timer.attach(module)
                for _ in range(4):  # the learning backwards and the first measured step, untimed
                    step()
                timer.take_samples()
            t0 = time.process_time()
            for _ in range(calls):
                step()
            per[name].append((time.process_time() - t0) / calls * 1e6)
            if timer is not None:
                samples += len(timer.take_samples())
                timer.detach()
    diffs = [t - p for t, p in zip(per["timed"], per["plain"], strict=True)]
    return statistics.median(per["plain"]), statistics.median(diffs), samples


def _per_step_medians(module: torch.nn.Module, step: Callable[[], None], blocks: int, calls: int) -> dict[str, float]:
    """µs each kind of step adds, from per-step medians: every step timed on its own (wall clock,
    the same clock reads around it in every variant), the variants in rotating blocks on the same
    module, and each variant's median step time minus the plain one's. Medians leave out the steps
    the machine's load stretched. Variants: the timer as configured (one step in three sampled),
    never sampling (its unsampled steps), sampling every step (its sampled steps), and a
    pass-through forward wrapper with a no-op gradient hook (what any such hooking costs)."""
    def timer_variant(sample_every: int) -> Callable[[], Callable[[], None]]:
        def attach() -> Callable[[], None]:
            timer = ComputeTimer(use_cuda=False, sample_every=sample_every)
            timer.attach(module)
            for _ in range(4):
                step()
            return timer.detach
        return attach

    def passthrough() -> Callable[[], None]:
        original = module.forward

        def forward(*args: object, **kwargs: object) -> object:
            return original(*args, **kwargs)

        module.__dict__["forward"] = forward
        param = next(p for p in module.parameters() if p.requires_grad)
        handle = param.register_post_accumulate_grad_hook(lambda p: None)

        def undo() -> None:
            handle.remove()
            del module.__dict__["forward"]
        return undo

    variants: dict[str, Callable[[], Callable[[], None]]] = {
        "plain": lambda: (lambda: None), "default": timer_variant(WALL_CLOCK_SAMPLE_EVERY),
        "unsampled": timer_variant(10**9), "sampled": timer_variant(1), "passthrough": passthrough}
    durations: dict[str, list[int]] = {name: [] for name in variants}
    clock = time.perf_counter_ns
    names = list(variants)
    for i in range(blocks):
        for name in names[i % len(names):] + names[:i % len(names)]:
            undo = variants[name]()
            out = durations[name]
            for _ in range(calls):
                t0 = clock()
                step()
                out.append(clock() - t0)
            undo()
    plain = statistics.median(durations["plain"])
    return {name: (statistics.median(values) - plain) / 1000.0 for name, values in durations.items() if name != "plain"}


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
    module = _model()
    x = torch.randn(1, 64)
    with torch.no_grad():
        base, added, _ = _attached_vs_not(module, lambda: module(x), args.blocks, 2000)
    result.update(forward_call_us=base, forward_wrapper_added_us=added)
    # 2. the smallest step (one parameter: forward, backward): the timer's whole per-step cost, the
    # gradient hook's call from the autograd engine included, with little else to add noise
    scale, x4 = _Scale(), torch.ones(4)

    def minimal_step() -> None:
        scale.weight.grad = None
        scale(x4).backward()

    base, added, samples = _attached_vs_not(scale, minimal_step, args.blocks, 2000, args.profiling_interval)
    result.update(minimal_step_us=base, minimal_step_added_us=added,
                  minimal_samples_per_step=samples / (args.blocks * 2000))
    if args.profiling_interval == 1:
        for name, added in _per_step_medians(scale, minimal_step, args.blocks // 2, 2000).items():
            result[f"minimal_step_median_added_{name}_us"] = added
    # 3. a whole DDP step (forward, backward, all-reduce, SGD) with and without the timer, same model
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            data = torch.randn(16, 64)
            ddp = torch.nn.parallel.DistributedDataParallel(_model())
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            _block(ddp, opt, data, 20)  # warm-up (bucket rebuild)
            base, added, samples = _attached_vs_not(ddp.module, lambda: _block(ddp, opt, data, 1), args.blocks,
                                                    args.steps, args.profiling_interval)
        finally:
            dist.destroy_process_group()
    result.update(ddp_step_us=base, ddp_step_added_us=added, samples_per_step=samples / (args.blocks * args.steps))
    result["timer_code_us"] = _timer_code_cost(100_000)
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
