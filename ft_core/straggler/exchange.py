"""The exchange of per-rank timings: one small collective per report, at a step every rank agrees on.

A collective must be entered by every rank at the same point, so the report cannot be triggered
by each rank's own clock. Instead every exchange also fixes the step count of the next one: each
rank proposes ``report_time_interval / its mean step time since the last exchange`` steps, the
gathered proposals are the same on every rank, and all take the smallest. The first exchange comes
after ``first_report_step`` steps. Between exchanges a step costs one integer comparison.

The exchange is one ``all_gather`` of a few float64 per rank, on a process group of its own (gloo,
CPU tensors), created when detection starts; the host names are gathered once, at the first
exchange, and section timings (the plain-loop API) only while some rank has sections. Collectives
of different groups never pair with each other: even a rank that reached its report step early
(a bug, or a step count skewed by the user's code) cannot have its ``all_gather`` taken for the
job's gradient all-reduce (a hang, or garbage gathered); and on a GPU the exchange stays off the
job's NCCL streams.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

__all__ = ["Exchange"]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _own_group() -> Optional[Any]:
    """A gloo process group of all ranks for the exchange (every rank creates it at the same point:
    ``new_group`` meets the other ranks through the store, not through a collective of the job's
    group). None, with a warning, when it cannot be made: the exchange then uses the default group."""
    try:
        return dist.new_group(backend="gloo")
    except Exception as err:  # a torch build or network without gloo: detection still works
        log.warning("straggler detection: could not create its own gloo process group (%s); its exchange "
                    "uses the job's default group, so every rank must reach each report step with no "
                    "collective of its own in between", err)
        return None


class Exchange:
    """When the next report is due and how the ranks' rows are gathered.

    Args:
        report_time_interval: Seconds wanted between reports.
        first_report_step: Steps before the first exchange (its interval calibrates the next ones).
        clock: Monotonic clock (seconds).
    """

    def __init__(self, report_time_interval: float, first_report_step: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not report_time_interval > 0:
            raise ValueError(f"report_time_interval must be > 0, got {report_time_interval!r}")
        self.report_time_interval = float(report_time_interval)
        self.next_step = max(1, int(first_report_step))
        self._clock = clock
        self._last_time = clock()
        self._last_step = 0
        self.rank = dist.get_rank() if _distributed() else 0
        self.world_size = dist.get_world_size() if _distributed() else 1
        self.group: Optional[Any] = _own_group() if self.world_size > 1 else None

    def due(self, steps: int) -> bool:
        """True when step count ``steps`` is the agreed exchange step (or past it)."""
        return steps >= self.next_step

    def interval(self, steps: int) -> tuple[float, int]:
        """Seconds and steps since the previous exchange, as of now."""
        return self._clock() - self._last_time, steps - self._last_step

    def proposal(self, steps: int) -> float:
        """This rank's proposal for the number of steps until the next exchange."""
        seconds, done = self.interval(steps)
        if done <= 0 or seconds <= 0:
            return float(self.next_step)
        return max(1.0, math.floor(self.report_time_interval / (seconds / done)))

    def gather(self, row: Sequence[float]) -> list[list[float]]:
        """Every rank's ``row`` (same length on all ranks), in rank order: one collective."""
        if not _distributed() or self.world_size == 1:
            return [list(row)]
        group = self.group
        device = torch.device("cpu")
        if group is None and "nccl" in str(dist.get_backend()):  # the default group, without our own
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.tensor(list(row), dtype=torch.float64, device=device)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=group)
        return [t.cpu().tolist() for t in out]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order (a collective; used rarely)."""
        if not _distributed() or self.world_size == 1:
            return [obj]
        out: list[Optional[Any]] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def advance(self, steps: int, proposals: Sequence[float]) -> float:
        """After an exchange at ``steps``: fix the next one from all ranks' proposals.

        Returns:
            The seconds the interval that just ended lasted.
        """
        now = self._clock()
        seconds = now - self._last_time
        self._last_time, self._last_step = now, steps
        usable = [p for p in proposals if math.isfinite(p) and p >= 1]
        self.next_step = steps + int(min(usable) if usable else 1)
        return seconds
