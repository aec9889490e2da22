"""Time each Lightning fault tolerance callback adds per training step.

Whole-run A/B comparisons are too noisy on a small shared machine, so everything is measured in
one process and one ``Trainer.fit``: a tiny model trains for many steps while the callback is
taken out of ``trainer.callbacks`` and put back in alternating blocks of steps, in ABBA order so
that a slow drift cancels out. Blocks are a single step by default: the shorter the blocks, the
more alike the machine's load during the two blocks of a pair. The callback stays connected to a
real rank monitor all along; only its per-step work (and Lightning's dispatch of its hooks) is
switched. The cost per step is the median over block pairs of (step time with the callback -
step time without), with its standard error.

Step time is measured twice: as CPU time of the training thread (``time.thread_time``), which
other processes on a shared machine inflate less, and as wall time. Everything a step does
(data loading included, ``num_workers=0``) runs on that thread, and so does the callback's work.

Also printed: the callback's own per-step hook code called directly in a tight loop (no Lightning
dispatch), and the same A/B for an empty ``Callback``: Lightning calls each of a callback's
per-step hooks (six per training step) inside a profiler context, which costs more than the
callbacks' own work. The fault tolerance callbacks set the hooks they do not use to None, which
Lightning skips.

NVRx (``--impl nvrx``, in the venv that ``make bench-peer`` makes): its sections callback puts
the ``step`` section around ``trainer.strategy.training_step`` (an instance attribute it sets)
rather than in callback hooks, so that wrapper is switched in and out together with the callback;
its own hook code, timed directly, then leaves the wrapper out and is not reported.

Run: ``python bench/lightning_overhead.py [--pairs 15000] [--block-steps 1] [--impl ours|nvrx] [--json]``.
Target: <= 20 us per step (NVRx 0.4.1's heartbeat callback adds 0.29 ms per step here).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import _impl  # noqa: E402

FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = "FT_RANK_MONITOR_IPC_SOCKET"  # the same in both packages
# Strategy methods a callback may wrap in place (NVRx's sections callback: the "step" section).
WRAPPED_STRATEGY_METHODS = ("training_step",)

MONITOR_CONFIGS = {
    "heartbeats": dict(initial_rank_heartbeat_timeout=600, rank_heartbeat_timeout=600),
    "sections": dict(
        initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
        rank_section_timeouts={"setup": 600, "step": 600, "checkpointing": 600},
        rank_out_of_section_timeout=600,
    ),
    "empty": dict(),
}


class ABModel(BoringModel):
    """BoringModel that switches ``subject`` in and out of ``trainer.callbacks`` between blocks.

    The switch happens in the LightningModule's ``on_train_batch_end`` hook, which Lightning
    calls after the callbacks' hooks, outside any iteration over ``trainer.callbacks``.
    """

    def __init__(self, subject: Callback, warmup: int, block_steps: int, pairs: int, hook_calls: int) -> None:
        super().__init__()
        self.subject = subject
        self.warmup = warmup
        self.block_steps = block_steps
        self.blocks = 2 * pairs
        self.hook_calls = hook_calls
        self.total_steps = warmup + self.blocks * block_steps
        self.block_times: list[tuple[bool, float, float]] = []  # (on, cpu s/step, wall s/step)
        self.hook_cost_us: float | None = None
        self._step = 0
        self._block_start = (0.0, 0.0)
        self._block_on = True
        self._wrappers: dict[str, Any] | None = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 2 * (self.total_steps + 10)), batch_size=2)

    @staticmethod
    def _block_is_on(index: int) -> bool:
        return index % 4 in (0, 3)  # ABBA ABBA ...

    def _set_subject(self, on: bool) -> None:
        callbacks = self.trainer.callbacks
        present = self.subject in callbacks
        if on and not present:
            callbacks.insert(0, self.subject)
        elif not on and present:
            callbacks.remove(self.subject)
        strategy = self.trainer.strategy
        if self._wrappers is None:  # first call: the subject is in and set up
            self._wrappers = {name: strategy.__dict__[name] for name in WRAPPED_STRATEGY_METHODS
                              if name in strategy.__dict__}
        for name, wrapper in self._wrappers.items():
            if on:
                setattr(strategy, name, wrapper)
            elif name in strategy.__dict__:
                delattr(strategy, name)  # the class's method again

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        self._step += 1
        measured = self._step - self.warmup
        if measured < 0 or measured % self.block_steps:
            return
        if measured == 0:
            # Objects alive after warm-up never need collecting again: keeps the rare full
            # collections short, so that they do not dominate the block they land in.
            gc.collect()
            gc.freeze()
        if measured > 0:
            cpu0, wall0 = self._block_start
            n = self.block_steps
            self.block_times.append((self._block_on, (cpu - cpu0) / n, (wall - wall0) / n))
        index = measured // self.block_steps
        if index < self.blocks:
            self._block_on = self._block_is_on(index)
            self._set_subject(self._block_on)
            self._block_start = (time.thread_time(), time.perf_counter())

    def on_train_end(self) -> None:
        self._set_subject(True)  # the callback's teardown must run
        self.hook_cost_us = self._time_hooks_directly()

    def _time_hooks_directly(self) -> float | None:
        """Microseconds per step of the subject's own per-step hook code, without Lightning."""
        subject, trainer = self.subject, self.trainer
        if type(subject) is Callback or self._wrappers:
            return None  # nothing of its own, or work outside its hooks (NVRx sections)
        # Only the hooks Lightning would call (the callbacks set unused ones to None).
        start_hooks = [h for h in (subject.on_train_batch_start,) if callable(h)]
        end_hooks = [h for h in (subject.on_train_batch_end,) if callable(h)]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for i in range(self.hook_calls):
                for hook in start_hooks:
                    hook(trainer, self, None, i)
                for hook in end_hooks:
                    hook(trainer, self, None, None, i)
            best = min(best, (time.perf_counter() - t0) / self.hook_calls * 1e6)
        return best


def make_subject(kind: str, impl: str, run_dir: str) -> Callback:
    if kind == "empty":
        return Callback()
    cbs = _impl.callbacks(impl)
    # exp_dir: NVRx's default (<log_dir>/ft_state) is only created by rank 0 of a process group.
    if kind == "heartbeats":
        return cbs.FaultToleranceCallback(autoresume=False, calculate_timeouts=False, exp_dir=run_dir)
    if kind == "sections":
        return cbs.FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False, exp_dir=run_dir)
    raise SystemExit(f"lightning_overhead: unknown callback {kind!r}")


def measure(kind: str, args: argparse.Namespace, run_dir: str) -> dict[str, Any]:
    ft = _impl.core(args.impl)
    socket_path = os.path.join(run_dir, f"{kind}.sock")
    monitor = ft.RankMonitorServer.run_in_subprocess(ft.FaultToleranceConfig(**MONITOR_CONFIGS[kind]), socket_path)
    os.environ[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = socket_path
    try:
        subject = make_subject(kind, args.impl, run_dir)
        model = ABModel(subject, args.warmup, args.block_steps, args.pairs, args.hook_calls)
        trainer = Trainer(
            accelerator="cpu", devices=1, max_steps=model.total_steps, max_epochs=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=0, num_sanity_val_steps=0, callbacks=[subject],
            default_root_dir=run_dir,
        )
        trainer.fit(model)
        monitor_alive = monitor.is_alive()
    finally:
        monitor.terminate()
        monitor.join(10)
        os.environ.pop(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, None)
    cpu = _added_per_step([(on, c) for on, c, _ in model.block_times])
    wall = _added_per_step([(on, w) for on, _, w in model.block_times])
    return {
        "callback": kind,
        "impl": args.impl,
        "cpu": cpu,
        "wall": wall,
        "own_hook_code_us_per_step": None if model.hook_cost_us is None else round(model.hook_cost_us, 3),
        "steps": model.total_steps,
        "monitor_alive": monitor_alive,
    }


def _added_per_step(blocks: list[tuple[bool, float]]) -> dict[str, Any]:
    """Median (and spread) over adjacent block pairs of on-minus-off time per step, in us."""
    diffs = []
    for i in range(0, len(blocks) - 1, 2):
        (on_a, t_a), (on_b, t_b) = blocks[i], blocks[i + 1]
        assert on_a != on_b
        diffs.append(((t_a - t_b) if on_a else (t_b - t_a)) * 1e6)
    quartiles = statistics.quantiles(diffs, n=4)
    # Standard error of the median, estimated from the quartiles (normal approximation).
    sem = 1.2533 * (quartiles[2] - quartiles[0]) / 1.349 / len(diffs) ** 0.5
    return {
        "added_us_per_step_median": round(statistics.median(diffs), 2),
        "added_us_per_step_sem": round(sem, 2),
        "added_us_per_step_iqr": [round(quartiles[0], 2), round(quartiles[2], 2)],
        "pairs": len(diffs),
        "step_us_without_callback_median": round(statistics.median(t * 1e6 for on, t in blocks if not on), 1),
    }


def _iqr(figures: dict[str, Any]) -> str:
    low, high = figures["added_us_per_step_iqr"]
    return f"[{low:.1f}, {high:.1f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=15000, help="A/B block pairs per callback")
    parser.add_argument("--block-steps", type=int, default=1, help="training steps per block")
    parser.add_argument("--warmup", type=int, default=300, help="steps before measuring")
    parser.add_argument("--hook-calls", type=int, default=100_000, help="direct hook calls timed")
    parser.add_argument("--callbacks", default="empty,heartbeats,sections",
                        help="comma-separated: empty, heartbeats, sections")
    parser.add_argument("--impl", choices=_impl.IMPLS, default="ours")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    os.environ.setdefault("RANK", "0")  # NVRx's client asks for its rank
    os.environ.setdefault("LOCAL_RANK", "0")

    torch.set_num_threads(1)  # 2-core machine: OpenMP spin-waiting swamps step times
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    run_dir = tempfile.mkdtemp(prefix="ftb-")
    results = []
    try:
        for kind in args.callbacks.split(","):
            with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
                results.append(measure(kind.strip(), args, run_dir))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__, "results": results}))
        return 0
    print(f"{'callback':<10} {'added CPU us/step':>18} {'IQR':>16} {'added wall us/step':>19} "
          f"{'IQR':>16} {'own hooks us/step':>18} {'step CPU us':>12}")
    for r in results:
        cpu, wall = r["cpu"], r["wall"]
        own = "-" if r["own_hook_code_us_per_step"] is None else f"{r['own_hook_code_us_per_step']:.2f}"
        print(f"{r['callback']:<10} {cpu['added_us_per_step_median']:>10.1f} +- {cpu['added_us_per_step_sem']:<4.1f} "
              f"{_iqr(cpu):>16} {wall['added_us_per_step_median']:>11.1f} +- {wall['added_us_per_step_sem']:<4.1f} "
              f"{_iqr(wall):>16} {own:>18} {cpu['step_us_without_callback_median']:>12.0f}")
    print(f"(median over {results[0]['cpu']['pairs']} ABBA block pairs of {args.block_steps} steps, "
          "+- its standard error; target <= 20 us/step; NVRx 0.4.1 heartbeat callback: 290 us/step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
