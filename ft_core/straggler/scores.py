"""Straggler scores: from per-rank compute times to relative, individual and per-node scores.

Pure functions and value types, no torch and no collectives, so that they can be tested alone.

A score is a ratio ``reference time / this rank's time`` over one report interval, where each
time is the *median* of the interval's samples (one sample per measured step): a score of 1.0
means "as fast as the reference", 0.77 means "1.3x slower".

* **relative**: the reference is the median, over all ranks, of the ranks' interval medians. A
  fast rank scores a little above 1; the median rank scores 1. (The reference's 0.4.1 divides by
  the fastest rank instead; against the median one unusually fast rank cannot make every other
  rank look slow.)
* **individual**: the reference is the rank's own best interval median so far in this run.
* **per node**: the median of the scores of the node's ranks (a node going slow slows all its ranks;
  one slow rank on a node is a rank problem, flagged as a rank).

Medians over an interval with at least ``min_samples`` samples make the scores robust to the
jitter of single steps (a garbage collection, a page fault, a step right after an evaluation or a
checkpoint): it takes a slowdown of more than half the interval's steps to move a median.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

__all__ = [
    "RankTiming", "Report", "StragglerId", "Streaks", "individual_scores", "interval_median", "node_scores",
    "relative_scores",
]


@dataclasses.dataclass(frozen=True)
class StragglerId:
    """A flagged rank: its global rank and the host name of its node."""

    rank: int
    node: str


@dataclasses.dataclass(frozen=True)
class RankTiming:
    """One rank's timing over one report interval, as exchanged between ranks.

    Attributes:
        median_s: The median compute time of the interval's samples, seconds; NaN with too few samples.
        best_s: The rank's best (smallest) interval median so far, seconds; NaN before the first.
        samples: How many samples the interval had.
    """

    median_s: float
    best_s: float
    samples: int


def interval_median(samples: Sequence[float], min_samples: int) -> float:
    """The median of ``samples``, or NaN when there are fewer than ``min_samples`` of them."""
    if len(samples) < max(1, min_samples):
        return math.nan
    return float(statistics.median(samples))


def _usable(value: float) -> bool:
    return math.isfinite(value) and value > 0.0


def relative_scores(medians: Mapping[int, float]) -> dict[int, float]:
    """Each rank's median of all ranks' medians divided by its own median.

    Ranks without a usable median (NaN, zero) get no score. A single rank scores 1.0.
    """
    usable = {rank: m for rank, m in medians.items() if _usable(m)}
    if not usable:
        return {}
    reference = statistics.median(usable.values())
    return {rank: reference / m for rank, m in usable.items()}


def individual_scores(timings: Mapping[int, RankTiming]) -> dict[int, float]:
    """Each rank's best interval median divided by its current one (at most 1.0).

    The caller updates ``best_s`` with the current median before calling, so a rank's first
    usable interval scores 1.0.
    """
    return {rank: t.best_s / t.median_s for rank, t in timings.items()
            if _usable(t.median_s) and _usable(t.best_s)}


def node_scores(rank_scores: Mapping[int, float], rank_to_node: Mapping[int, str]) -> dict[str, float]:
    """The median score of each node's ranks (nodes whose ranks have no score are left out)."""
    by_node: dict[str, list[float]] = {}
    for rank, score in rank_scores.items():
        by_node.setdefault(rank_to_node.get(rank, "<unk>"), []).append(score)
    return {node: float(statistics.median(values)) for node, values in by_node.items()}


def _below(scores: Mapping[Any, float], threshold: float) -> list[Any]:
    return [key for key, score in scores.items() if score < threshold]


def _slow(scores: Mapping[Any, float], threshold: float, relative: Mapping[Any, float]) -> list[Any]:
    """The keys of ``scores`` below ``threshold`` that are not at least as fast as the median.

    A rank (node) whose relative score is 1 or more is at least as fast as the median one: the
    job does not wait for it, whatever its other scores say (its individual score can drop while
    it waits for a slower peer or shares its CPUs with other work). With one scored key, its
    relative score (1.0 by definition) says nothing, and the scores alone decide.
    """
    if len(relative) < 2:
        return _below(scores, threshold)
    return [key for key in _below(scores, threshold) if not relative.get(key, 0.0) >= 1.0]


@dataclasses.dataclass(frozen=True)
class Report:
    """The scores of one report interval (every rank gets the whole report).

    The fields up to ``rank`` are the reference's (``nvidia_resiliency_ext.straggler.Report``);
    the ``node_*`` fields, ``timings``, ``interval_s``, ``steps`` and ``index`` are ours. Scores
    are ``reference time / rank time`` (see the module docstring): below 1.0 is slower.

    Attributes:
        gpu_relative_perf_scores: Rank -> relative score of the rank's compute.
        section_relative_perf_scores: Section name -> (rank -> relative score of the section).
        gpu_individual_perf_scores: Rank -> individual score of the rank's compute.
        section_individual_perf_scores: Section name -> (rank -> individual score).
        rank_to_node: Rank -> node host name.
        local_section_summaries: This rank's section statistics (name -> {"median", "num"}).
        local_kernel_summaries: Always empty (no per-kernel timing; see docs/stragglers.md).
        generate_report_elapsed_time: Seconds it took to make this report.
        gather_on_rank0: As given to ``Detector.initialize``.
        rank: This rank.
        node_relative_perf_scores: Node -> median relative score of its ranks.
        node_individual_perf_scores: Node -> median individual score of its ranks.
        timings: Rank -> the interval's :class:`RankTiming`.
        interval_s: Seconds since the previous report (or since the start).
        steps: Steps in the interval.
        index: 1 for the run's first report, then 2, 3, ...
    """

    gpu_relative_perf_scores: Mapping[int, float]
    section_relative_perf_scores: Mapping[str, Mapping[int, float]]
    gpu_individual_perf_scores: Mapping[int, float]
    section_individual_perf_scores: Mapping[str, Mapping[int, float]]
    rank_to_node: Mapping[int, str]
    local_section_summaries: Mapping[str, Any]
    local_kernel_summaries: Mapping[str, Any]
    generate_report_elapsed_time: float
    gather_on_rank0: bool
    rank: Optional[int]
    node_relative_perf_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)
    node_individual_perf_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)
    timings: Mapping[int, RankTiming] = dataclasses.field(default_factory=dict)
    interval_s: float = math.nan
    steps: int = 0
    index: int = 0

    def _ids(self, ranks: Iterable[int]) -> set[StragglerId]:
        return {StragglerId(rank=r, node=self.rank_to_node.get(r, "<unk>")) for r in ranks}

    def identify_stragglers(
        self,
        gpu_rel_threshold: float = 0.75,
        section_rel_threshold: float = 0.75,
        gpu_indiv_threshold: float = 0.75,
        section_indiv_threshold: float = 0.75,
    ) -> dict[str, Any]:
        """The ranks (and nodes) whose scores are below the thresholds and that are slow.

        A rank (node) with a relative score of 1 or more (at least as fast as the median rank
        or node of the same scores) is never a straggler, whatever its individual score or a
        threshold above 1: the job does not wait for it. This needs at least two scored ranks
        (nodes); a single one is judged by its scores alone.

        Returns:
            The reference's keys: ``straggler_gpus_relative`` and ``straggler_gpus_individual``
            (sets of :class:`StragglerId`), ``straggler_sections_relative`` and
            ``straggler_sections_individual`` (section -> set of :class:`StragglerId`, only
            sections with a straggler); and ours: ``straggler_nodes_relative`` and
            ``straggler_nodes_individual`` (sets of node names, from the per-node scores with
            the gpu thresholds).
        """
        rel, node_rel = self.gpu_relative_perf_scores, self.node_relative_perf_scores
        sec_rel = self.section_relative_perf_scores
        sections_rel = {name: self._ids(_slow(scores, section_rel_threshold, scores))
                        for name, scores in sec_rel.items()}
        sections_ind = {name: self._ids(_slow(scores, section_indiv_threshold, sec_rel.get(name, {})))
                        for name, scores in self.section_individual_perf_scores.items()}
        return {
            "straggler_gpus_relative": self._ids(_slow(rel, gpu_rel_threshold, rel)),
            "straggler_gpus_individual": self._ids(_slow(self.gpu_individual_perf_scores, gpu_indiv_threshold, rel)),
            "straggler_sections_relative": {k: v for k, v in sections_rel.items() if v},
            "straggler_sections_individual": {k: v for k, v in sections_ind.items() if v},
            "straggler_nodes_relative": set(_slow(node_rel, gpu_rel_threshold, node_rel)),
            "straggler_nodes_individual": set(_slow(self.node_individual_perf_scores, gpu_indiv_threshold, node_rel)),
        }


class Streaks:
    """How many reports in a row each rank or node has been flagged (0 once it is not)."""

    def __init__(self) -> None:
        self._counts: dict[Any, int] = {}

    def update(self, flagged: Iterable[Any]) -> dict[Any, int]:
        """Count one more report: keys in ``flagged`` go up by one, all others drop out.

        Returns:
            The flagged keys with their consecutive counts.
        """
        flagged = set(flagged)
        self._counts = {key: self._counts.get(key, 0) + 1 for key in flagged}
        return dict(self._counts)

    def count(self, key: Any) -> int:
        """Reports in a row ``key`` has been flagged (0 if not flagged in the last one)."""
        return self._counts.get(key, 0)
