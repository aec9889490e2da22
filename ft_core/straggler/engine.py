"""One rank's straggler detection state: its timers, its exchange schedule, its best so far.

:class:`StragglerEngine` is what both front ends use: :class:`~ft_core.straggler.detector.Detector`
(the reference-shaped plain-loop API) and ``ptl_resiliency.StragglerDetectionCallback``. It turns
the samples of :class:`~ft_core.straggler.timing.ComputeTimer` (and of detection sections) into a
:class:`~ft_core.straggler.scores.Report` at the agreed steps of
:class:`~ft_core.straggler.exchange.Exchange`.
"""

from __future__ import annotations

import logging
import math
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any, Optional

import torch

from ft_core.straggler.exchange import Exchange
from ft_core.straggler.scores import (
    RankTiming,
    Report,
    individual_scores,
    interval_median,
    node_scores,
    relative_scores,
)
from ft_core.straggler.timing import ComputeTimer

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MIN_SAMPLES", "SCORE_NAMES", "StragglerEngine"]

SCORE_NAMES = ("relative_perf_scores", "individual_perf_scores")
MIN_PHASE_SHARE = 0.1
"""A phase (forward, backward) shorter than this share of the step's compute gets no score of its own."""
DEFAULT_MIN_SAMPLES = 8
"""An interval with fewer samples gives a rank no score (its median would be noise)."""

_CPU_NOTE_LOGGED = False


def _log_cpu_note_once() -> None:
    global _CPU_NOTE_LOGGED
    if not _CPU_NOTE_LOGGED:
        _CPU_NOTE_LOGGED = True
        log.info("straggler detection: no CUDA, so the \"gpu\" performance scores are computed from each rank's "
                 "own compute time on the CPU (wall clock from forward start to its last gradient)")


def _min(best: float, now: float) -> float:
    if not math.isfinite(now):
        return best
    return now if not math.isfinite(best) else min(best, now)


def _share(phase: dict[int, RankTiming], totals: dict[int, RankTiming]) -> float:
    """The phase's median (over ranks) as a fraction of the median total compute; 0 without data."""
    values = [t.median_s for t in phase.values() if math.isfinite(t.median_s)]
    whole = [t.median_s for t in totals.values() if math.isfinite(t.median_s) and t.median_s > 0]
    if not values or not whole:
        return 0.0
    return statistics.median(values) / statistics.median(whole)


def _worst(per_phase: list[dict[int, float]]) -> dict[int, float]:
    """Per rank, the lowest of its phase scores."""
    out: dict[int, float] = {}
    for scores in per_phase:
        for rank, score in scores.items():
            out[rank] = min(score, out.get(rank, score))
    return out


class StragglerEngine:
    """Per-rank state of straggler detection.

    Args:
        report_time_interval: Seconds between reports (converted to an agreed step count).
        scores_to_compute: Any of ``"relative_perf_scores"``, ``"individual_perf_scores"``.
        profiling_interval: Measure every n-th step.
        node_name: This node's name in reports (default: the host name).
        min_samples: Samples an interval needs for a rank to be scored.
        first_report_step: Steps before the first exchange.
        gather_on_rank0: Kept for the reference's API (every rank gets the whole report).
    """

    def __init__(
        self,
        report_time_interval: float,
        scores_to_compute: Sequence[str] = SCORE_NAMES,
        profiling_interval: int = 1,
        node_name: Optional[str] = None,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        first_report_step: int = 10,
        gather_on_rank0: bool = True,
    ) -> None:
        unknown = [name for name in scores_to_compute if name not in SCORE_NAMES]
        if unknown or not scores_to_compute:
            raise ValueError(f"scores_to_compute must name some of {SCORE_NAMES}, got {list(scores_to_compute)}")
        self.relative = "relative_perf_scores" in scores_to_compute
        self.individual = "individual_perf_scores" in scores_to_compute
        self.use_cuda = torch.cuda.is_available()
        if not self.use_cuda:
            _log_cpu_note_once()
        self.timer = ComputeTimer(self.use_cuda, profiling_interval)
        self.exchange = Exchange(report_time_interval, first_report_step)
        self.timer.notify_step = self.exchange.next_step  # the timer's on_step_end: from the exchange step on
        self.node_name = node_name or socket.gethostname()
        self.min_samples = min_samples
        self.gather_on_rank0 = gather_on_rank0
        self.rank_to_node: dict[int, str] = {}
        self._best = (math.nan, math.nan)  # this rank's best interval medians: forward, backward
        self._section_samples: dict[str, list[float]] = {}
        self._section_best: dict[str, float] = {}
        self._reports = 0

    def add_section_sample(self, name: str, seconds: float) -> None:
        """Record one entry of detection section ``name`` (plain-loop API)."""
        self._section_samples.setdefault(name, []).append(seconds)

    def report(self) -> Report:
        """Exchange this interval's timings and score every rank: a collective, every rank at the same step."""
        started = time.monotonic()
        steps = self.timer.steps
        samples = self.timer.take_samples()
        forward = interval_median([f for f, _ in samples], self.min_samples)
        backward = interval_median([b for _, b in samples], self.min_samples) if self.timer.measures_backward \
            else math.nan
        self._best = tuple(_min(best, now) for best, now in zip(self._best, (forward, backward), strict=True))
        _, interval_steps = self.exchange.interval(steps)
        section_medians = {name: interval_median(values, self.min_samples)
                           for name, values in self._section_samples.items()}
        self._section_samples = {name: [] for name in self._section_samples}
        row = [forward, self._best[0], backward, self._best[1], float(len(samples)), self.exchange.proposal(steps),
               1.0 if section_medians else 0.0]
        rows = self.exchange.gather(row)
        if not self.rank_to_node:
            self.rank_to_node = dict(enumerate(self.exchange.gather_objects(self.node_name)))
        # An interval shorter than min_samples measured steps could never be scored; the margin
        # covers the steps left out after a checkpoint or an evaluation inside the interval.
        floor = float((self.min_samples + max(2, self.min_samples // 4)) * self.timer.steps_per_sample)
        seconds = self.exchange.advance(steps, [max(r[5], floor) for r in rows])
        self.timer.notify_step = self.exchange.next_step
        phases = [{rank: RankTiming(median_s=r[i], best_s=r[i + 1], samples=int(r[4])) for rank, r in enumerate(rows)}
                  for i in (0, 2)]
        timings = {rank: RankTiming(median_s=r[0] + (r[2] if math.isfinite(r[2]) else 0.0), best_s=math.nan,
                                    samples=int(r[4])) for rank, r in enumerate(rows)}
        # A rank's score is its worse phase: a 1.3x slower forward is a 1.3x slower forward, however
        # long the backward is. A phase under MIN_PHASE_SHARE of the step's compute is left out: the
        # ratio of two tiny times is noise (a backward of 50 us next to a forward of 20 ms).
        phases = [phase for phase in phases if _share(phase, timings) >= MIN_PHASE_SHARE]
        rel = _worst([relative_scores({rank: t.median_s for rank, t in phase.items()}) for phase in phases]) \
            if self.relative else {}
        ind = _worst([individual_scores(phase) for phase in phases]) if self.individual else {}
        sec_rel: dict[str, dict[int, float]] = {}
        sec_ind: dict[str, dict[int, float]] = {}
        if any(r[6] for r in rows):
            sec_rel, sec_ind = self._section_scores(section_medians)
        self._reports += 1
        return Report(
            gpu_relative_perf_scores=rel,
            section_relative_perf_scores=sec_rel,
            gpu_individual_perf_scores=ind,
            section_individual_perf_scores=sec_ind,
            rank_to_node=dict(self.rank_to_node),
            local_section_summaries={name: {"median": m} for name, m in section_medians.items()},
            local_kernel_summaries={},
            generate_report_elapsed_time=time.monotonic() - started,
            gather_on_rank0=self.gather_on_rank0,
            rank=self.exchange.rank,
            node_relative_perf_scores=node_scores(rel, self.rank_to_node),
            node_individual_perf_scores=node_scores(ind, self.rank_to_node),
            timings=timings,
            interval_s=seconds,
            steps=interval_steps,
            index=self._reports,
        )

    def _section_scores(self, medians: dict[str, float]) -> tuple[dict[str, dict[int, float]],
                                                                   dict[str, dict[int, float]]]:
        for name, m in medians.items():
            if math.isfinite(m):
                best = self._section_best.get(name, math.inf)
                self._section_best[name] = min(best, m)
        mine = {name: (m, self._section_best.get(name, math.nan)) for name, m in medians.items()}
        everyone: list[Any] = self.exchange.gather_objects(mine)
        names = sorted({name for per_rank in everyone for name in per_rank})
        rel: dict[str, dict[int, float]] = {}
        ind: dict[str, dict[int, float]] = {}
        for name in names:
            timings = {rank: RankTiming(*per_rank[name], samples=0)
                       for rank, per_rank in enumerate(everyone) if name in per_rank}
            if self.relative:
                rel[name] = relative_scores({rank: t.median_s for rank, t in timings.items()})
            if self.individual:
                ind[name] = individual_scores(timings)
        return rel, ind
