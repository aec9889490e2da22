"""Goodput and time to recover: one computation for a user's run and for our benchmarks.

``ft_report`` (:mod:`launcher.events.report`) feeds it from a run's event log, ``bench/goodput.py`` from
its instrumented training job; each decides what counts as useful time and as "recovered", and
this module does the arithmetic, so the two report the same figures the same way:

- goodput = useful time / wall time;
- time to recover, per failure = recovered (productive again) - failed; the mean over all
  failures (MTTR) and per kind of failure; and, where known, failed -> replacement processes
  started (detection, stop, restart), per kind.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Recovery:
    """One failure and the way back from it.

    Attributes:
        kind: What failed, for the per-kind figures (e.g. ``hang``, ``kill``, ``exit``).
        failed_at: When it failed or was detected (epoch seconds).
        recovered_at: When the job was productive again (epoch seconds).
        restarted_at: When the replacement processes started, if known.
    """

    kind: str
    failed_at: float
    recovered_at: float
    restarted_at: Optional[float] = None

    @property
    def to_recover_s(self) -> float:
        return self.recovered_at - self.failed_at

    @property
    def to_restart_s(self) -> Optional[float]:
        return None if self.restarted_at is None else self.restarted_at - self.failed_at


def _mean(values: Iterable[float], digits: int) -> Optional[float]:
    values = list(values)
    return round(statistics.mean(values), digits) if values else None


def run_figures(started: float, ended: float, useful_s: float, recoveries: Sequence[Recovery],
                kinds: Sequence[str] = ()) -> dict[str, Any]:
    """Goodput and recovery figures of one run.

    Args:
        started: When the run started (epoch seconds).
        ended: When it ended.
        useful_s: Seconds of useful work in between (the caller's definition).
        recoveries: One per failure the run recovered from.
        kinds: Kinds to report per kind even when no failure of that kind happened (as None).

    Returns:
        ``wall_s``, ``useful_s``, ``goodput`` (None for an empty run), ``recoveries`` (count),
        ``mttr_s``, ``mttr_by_kind_s`` and ``to_restart_by_kind_s`` (kind -> mean or None).
    """
    wall = ended - started
    by_kind = {kind: [] for kind in kinds}
    for recovery in recoveries:
        by_kind.setdefault(recovery.kind, []).append(recovery)
    return {
        "wall_s": round(wall, 2),
        "useful_s": round(useful_s, 2),
        "goodput": round(useful_s / wall, 4) if wall > 0 else None,
        "recoveries": len(recoveries),
        "mttr_s": _mean((r.to_recover_s for r in recoveries), 3),
        "mttr_by_kind_s": {kind: _mean((r.to_recover_s for r in items), 3) for kind, items in by_kind.items()},
        "to_restart_by_kind_s": {
            kind: _mean((r.to_restart_s for r in items if r.to_restart_s is not None), 3)
            for kind, items in by_kind.items()},
    }
