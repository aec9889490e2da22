"""What a report leads to: the flags, the log lines, the launcher's events and the actions.

:class:`ReportHandler` is shared by the Lightning callback and the plain-loop integration. For each
report it

* flags ranks (and nodes) whose scores are below the thresholds, and counts reports in a row;
* logs (rank 0), with ``num_to_print`` > 0, the reference's best and worst scores under its
  headings ``GPU relative performance:`` and ``GPU individual performance:`` (log checks written
  for the reference find them), then our one line naming the worst ranks with node and scores;
  for flagged ranks the reference's ``"... Affected ranks: {...}"`` warning;
* sends one ``straggler`` event per flagged rank and node to this node's ``ft_launcher`` (local
  rank 0 only, entries of its own node: each node's launcher records its own ranks);
* decides the action: ``"stop"`` (``stop_if_detected``: any flag), ``"replace"`` (a node flagged
  by its *relative* score in ``replace_after`` reports in a row leaves at the next checkpoint), or
  ``"report"``. Every rank decides from the same report, so they agree without a collective.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from typing import Any, Optional

from ft_core.straggler.scores import Report, StragglerId, Streaks

log = logging.getLogger(__name__)

__all__ = ["ACTIONS", "DEFAULT_REPLACE_AFTER", "StragglerOutcome", "ReportHandler", "reference_scores_lines",
           "request_node_exclusion"]

ACTIONS = ("report", "stop", "replace")
DEFAULT_REPLACE_AFTER = 3
"""Reports in a row a node must be flagged (relative score) before the replace action takes it out."""


@dataclasses.dataclass(frozen=True)
class StragglerOutcome:
    """One report's result on this rank.

    Attributes:
        relative: Ranks below the relative threshold.
        individual: Ranks below the individual threshold.
        nodes: Nodes below the relative threshold (per-node median score).
        stop: Every rank stops now (``stop_if_detected`` and a flag).
        replace_nodes: Nodes to leave the job at the next checkpoint.
    """

    relative: frozenset[StragglerId]
    individual: frozenset[StragglerId]
    nodes: frozenset[str]
    stop: bool
    replace_nodes: frozenset[str]

    @property
    def flagged(self) -> bool:
        """True when any rank or node was flagged."""
        return bool(self.relative or self.individual or self.nodes)


def _fmt(score: Optional[float]) -> str:
    return "-" if score is None or not math.isfinite(score) else f"{score:.2f}"


def reference_scores_lines(scores: Mapping[int, float], rank_to_node: Mapping[int, str], count: int) -> list[str]:
    """The reference's listing of ``scores`` for ``count`` best and worst ranks.

    Returns:
        ``"  Rank=R Node=N Score=S.SS"`` lines (scores to 2 decimals): every scored rank, worst
        first, when there are at most ``2 * count``; else the worst ``count`` (worst first) and
        the best ``count`` (best first), each group under a ``" Worst/Best performing
        count/total ranks:"`` line. Ranks without a finite score are left out.
    """
    ranked = sorted((score, rank) for rank, score in scores.items() if score is not None and math.isfinite(score))

    def row(score: float, rank: int) -> str:
        return f"  Rank={rank} Node={rank_to_node.get(rank, '<unk>')} Score={score:.2f}"

    if len(ranked) <= 2 * count:
        return [row(score, rank) for score, rank in ranked]
    total = len(ranked)
    return ([f" Worst performing {count}/{total} ranks:", *(row(s, r) for s, r in ranked[:count]),
             f" Best performing {count}/{total} ranks:", *(row(s, r) for s, r in reversed(ranked[-count:]))])


class ReportHandler:
    """Turns reports into flags, log lines, launcher events and an action (see the module docstring).

    Args:
        relative_threshold: A rank (node) whose relative score is below this is flagged; None: not computed.
        individual_threshold: A rank whose individual score is below this is flagged; None: not computed.
        num_to_print: Worst ranks the report line names (0: the line only when something is flagged).
        action: ``"report"``, ``"stop"`` or ``"replace"``.
        replace_after: Reports in a row before ``"replace"`` acts on a node.
        logger: Where the lines go.
    """

    def __init__(self, relative_threshold: Optional[float], individual_threshold: Optional[float],
                 num_to_print: int, action: str = "report", replace_after: int = DEFAULT_REPLACE_AFTER,
                 logger: Optional[logging.Logger] = None) -> None:
        if action not in ACTIONS:
            raise ValueError(f"straggler action must be one of {ACTIONS}, got {action!r}")
        if replace_after < 1:
            raise ValueError(f"replace_after must be >= 1, got {replace_after}")
        self.relative_threshold = relative_threshold
        self.individual_threshold = individual_threshold
        self.num_to_print = num_to_print
        self.action = action
        self.replace_after = replace_after
        self.log = logger or log
        self.rank_streaks = Streaks()
        self.node_streaks = Streaks()

    def handle(self, report: Report, rank: int, local_rank: int) -> StragglerOutcome:
        """Flag, log, send the events (local rank 0) and decide; the same decision on every rank."""
        found = report.identify_stragglers(
            gpu_rel_threshold=self.relative_threshold if self.relative_threshold is not None else -math.inf,
            gpu_indiv_threshold=self.individual_threshold if self.individual_threshold is not None else -math.inf,
        )
        relative = frozenset(found["straggler_gpus_relative"])
        individual = frozenset(found["straggler_gpus_individual"])
        nodes = frozenset(found["straggler_nodes_relative"]) if len(set(report.rank_to_node.values())) > 1 \
            else frozenset()
        self.rank_streaks.update({sid.rank for sid in relative | individual})
        node_counts = self.node_streaks.update(nodes)
        replace = frozenset(n for n, c in node_counts.items() if c >= self.replace_after) \
            if self.action == "replace" else frozenset()
        outcome = StragglerOutcome(relative, individual, nodes, self.action == "stop" and bool(relative or individual),
                          replace)
        if rank == 0:
            self._log(report, outcome)
        if local_rank == 0 and outcome.flagged:
            self._send(report, outcome)
        return outcome

    def _log(self, report: Report, outcome: StragglerOutcome) -> None:
        rel, ind = report.gpu_relative_perf_scores, report.gpu_individual_perf_scores
        if self.num_to_print > 0:
            for heading, scores, on in (("GPU relative performance:", rel, self.relative_threshold is not None),
                                        ("GPU individual performance:", ind, self.individual_threshold is not None)):
                if on:
                    lines = reference_scores_lines(scores, report.rank_to_node, self.num_to_print)
                    self.log.info("%s\n%s", heading, "\n".join(lines) or "  no scores yet")
        if self.num_to_print > 0 or outcome.flagged:
            ranks = sorted(set(rel) | set(ind), key=lambda r: (rel.get(r, math.inf), ind.get(r, math.inf)))
            worst = ranks[:max(self.num_to_print, len(outcome.relative | outcome.individual), 1)]
            named = "; ".join(f"rank {r} node {report.rank_to_node.get(r, '<unk>')} relative {_fmt(rel.get(r))} "
                              f"individual {_fmt(ind.get(r))}" for r in worst)
            self.log.info("straggler report %d (%.1f s, %d steps, %d ranks): worst: %s", report.index,
                          report.interval_s, report.steps, len(report.rank_to_node), named or "no scores yet")
        if outcome.relative:
            self.log.warning("STRAGGLER DETECTION WARNING: Some GPUs have worse relative performance. "
                             "Affected ranks: %s", set(outcome.relative))
        if outcome.individual:
            self.log.warning("STRAGGLER DETECTION WARNING: Some GPUs performance dropped. Affected ranks: %s",
                             set(outcome.individual))
        if outcome.nodes:
            self.log.warning("STRAGGLER DETECTION WARNING: Some nodes have worse relative performance. "
                             "Affected nodes: %s (reports in a row: %s)", set(outcome.nodes),
                             {n: self.node_streaks.count(n) for n in outcome.nodes})
        if outcome.replace_nodes:
            self.log.warning("straggler detection: node(s) %s flagged in %d reports in a row; they leave the job "
                             "after the next checkpoint (ExcludeThisNode)", sorted(outcome.replace_nodes),
                             self.replace_after)

    def entries(self, report: Report, outcome: StragglerOutcome, node: str) -> list[dict[str, Any]]:
        """The launcher entries for ``node``'s flagged ranks and for ``node`` itself if flagged."""
        rel, ind = report.gpu_relative_perf_scores, report.gpu_individual_perf_scores
        action = "stop" if outcome.stop else "replace" if node in outcome.replace_nodes else "report"
        out: list[dict[str, Any]] = []
        for rank in sorted({sid.rank for sid in outcome.relative | outcome.individual
                            if sid.node == node}):
            out.append({"scope": "rank", "rank": rank, "node": node, "relative": rel.get(rank),
                        "individual": ind.get(rank), "consecutive": self.rank_streaks.count(rank),
                        "action": action})
        if node in outcome.nodes:
            out.append({"scope": "node", "rank": None, "node": node,
                        "relative": report.node_relative_perf_scores.get(node),
                        "individual": report.node_individual_perf_scores.get(node),
                        "consecutive": self.node_streaks.count(node), "action": action})
        return out

    def _send(self, report: Report, outcome: StragglerOutcome) -> None:
        node = report.rank_to_node.get(report.rank if report.rank is not None else 0, "")
        entries = self.entries(report, outcome, node)
        if not entries:
            return
        try:
            from ft_core.client.straggler_channel import report_to_launcher
        except ImportError:  # the launcher side is not in this installation
            self.log.debug("straggler detection: no launcher channel; %d entries not sent", len(entries))
            return
        report_to_launcher(entries, report.interval_s)


def request_node_exclusion(reason: str, logger: Optional[logging.Logger] = None) -> bool:
    """Ask this node's ``ft_launcher`` to replace this node (``ExcludeThisNode``, only if the job
    can go on without it); never raises.

    The launcher decides: it knows the rendezvous (a spare waiting, ``--nnodes`` MIN). When the
    job cannot go on without this node, it keeps the node, says why, and the ranks train on; the
    rank itself never stops for it.

    Returns:
        True when the launcher acknowledged the request (it was received, not necessarily granted).
    """
    logger = logger or log
    from ft_core.client.rank_monitor_client import RankMonitorClient
    from ft_core.wire.data import WorkloadAction, WorkloadControlRequest
    from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
    from ft_core.wire.errors import RankMonitorClientError

    if not os.environ.get(FT_LAUNCHER_IPC_SOCKET_ENV_VAR):
        logger.warning("straggler detection: cannot leave the job (%s): not started by ft_launcher", reason)
        return False
    try:
        RankMonitorClient().send_workload_control_request(
            WorkloadControlRequest(WorkloadAction.ExcludeThisNode, reason, only_if_replaceable=True))
    except RankMonitorClientError as err:
        logger.error("straggler detection: ExcludeThisNode request failed: %s", err)
        return False
    logger.warning("straggler detection: asked ft_launcher to replace this node (%s); it does when a spare node "
                   "waits or --nnodes MIN allows one node fewer, else training goes on", reason)
    return True


def scores_summary(scores: Mapping[int, float]) -> tuple[float, float, float]:
    """(min, median, max) of ``scores``; NaNs when there are none."""
    import statistics

    values = [v for v in scores.values() if math.isfinite(v)]
    if not values:
        return math.nan, math.nan, math.nan
    return min(values), float(statistics.median(values)), max(values)
