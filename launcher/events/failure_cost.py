"""What each failure cost in training steps: ``ft_report``'s "steps redone" (docs/jit-state.md).

A failure throws away the work between the state the restart resumes from and the step the job was
in when it failed. The event log knows both ends:

* the step it failed at: the ``step`` of the cycle's ``failure`` records (each rank's last
  ``set_step``, as its monitor saw it; the largest of every rank of every node, since the ranks of a
  replicated job fail in the same step or one apart), and ``root_step``;
* the step the restart resumed from, and where that state came from: the next cycle's ``resumed``
  records (each rank reports once after its restore, ``RankMonitorClient.report_resumed``):
  ``jit`` (the survivors' just-in-time state, whose ``state_saved`` record names the step saved),
  ``checkpoint`` (a periodic checkpoint) or ``scratch``.

steps redone = failed step - resumed step (the step in flight when it failed is in neither: it is
lost in part, whatever the state). Seconds redone = steps redone x the run's median step time, where a
cycle's step time is (its failure's step - the step it started from) / (its failure's last progress -
when it started: its ``resumed`` record, or for the run's first cycle its workers' ready time, from
step 0), and the median is taken over the cycles that have both ends. Unknown where a record is missing
(a rank that never reports its step, a training script that does not report its restore).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

from launcher.events.records import ROLE_ROOT, Failure, JitStateNotSaved, JitStateSaved, Resumed
from launcher.events.runs import Cycle, LauncherRecords, RunReport, failed_at, failure_kind, record_time, role

SOURCE_WORDS = {"jit": "just-in-time state", "jit_shared": "a previous job's just-in-time state",
                "checkpoint": "periodic checkpoint", "scratch": "from scratch"}
"""How ``ft_report`` names each ``resumed`` source."""
_FROM_WORDS = {"jit": "from just-in-time state", "jit_shared": "from a previous job's just-in-time state",
               "checkpoint": "from a periodic checkpoint", "scratch": "from scratch"}


@dataclass
class FailureCost:
    """One failure (one cycle of one run id, all its nodes together) and the work it threw away.

    Attributes:
        run_id: The launchers' run id.
        cycle: The cycle that failed.
        kind: The root cause's kind (``exit``, ``hang (heartbeat)``...; ``lost node``).
        failed_at: When it was detected (epoch seconds).
        nodes: The nodes whose launchers recorded it.
        failed_step: The largest step any rank was in when it failed (None: no rank reported one).
        failed_step_at: The last progress of the first rank seen in that step (epoch seconds; a hang's
            is its timeout before its detection): where the redone stretch ends.
        resumed_step: The step the restart resumed from (the smallest any rank reported).
        resumed_at: When the first rank reported it (epoch seconds).
        source: Where that state came from: ``jit``, ``checkpoint``, ``scratch`` (None: no rank told;
            ``mixed`` if the ranks disagree).
        jit_step: The step of the just-in-time state a survivor saved after this failure.
        jit_seconds: How long that save took.
        jit_not_saved: Why no just-in-time state was saved, when a launcher said so.
        steps_redone: failed_step - resumed_step (None if either is unknown).
        seconds_redone: steps_redone x the run's median step time (None if either is unknown).
    """

    run_id: Optional[str]
    cycle: int
    kind: str
    failed_at: float
    nodes: list[str]
    failed_step: Optional[int] = None
    failed_step_at: Optional[float] = None
    resumed_step: Optional[int] = None
    resumed_at: Optional[float] = None
    source: Optional[str] = None
    jit_step: Optional[int] = None
    jit_seconds: Optional[float] = None
    jit_not_saved: Optional[str] = None
    steps_redone: Optional[int] = None
    seconds_redone: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _node_cycles(report: RunReport) -> dict[str, list[tuple[LauncherRecords, Cycle]]]:
    """Each node's cycles in time order, across its launcher runs (autoresume attempts)."""
    by_node: dict[str, list[tuple[LauncherRecords, Cycle]]] = {}
    for run in report.runs:
        by_node.setdefault(run.node, []).extend((run, cycle) for cycle in run.cycles)
    return by_node


def _of_cycle(run: LauncherRecords, cycle: Cycle, kind: type) -> list[Any]:
    return [r for r in run.events if isinstance(r, kind) and r.cycle == cycle.index]


def _steps(failures: Iterable[Failure]) -> list[int]:
    return [s for f in failures for s in (f.step, f.root_step) if isinstance(s, int)]


def cost_records(failures: Iterable[Failure], step: Optional[int]) -> list[Failure]:
    """The failure records of ranks in ``step`` whose last progress is known."""
    return [f for f in failures if step is not None and f.step == step and f.last_progress_at is not None]


def _last_per_rank(records: list[Resumed]) -> list[Resumed]:
    """Each rank's last report with a step: a script that loads its periodic checkpoint and then a
    newer just-in-time state reports both; the state it trains from is the last."""
    last: dict[Any, Resumed] = {}
    for record in records:
        if record.step is not None:
            last[(record.rank, record.worker_pid)] = record
    return list(last.values())


def cycle_step_seconds(report: RunReport) -> list[float]:
    """Seconds per step of every cycle whose start and failure are both known (see the module
    docstring)."""
    found = []
    for cycles in _node_cycles(report).values():
        for position, (run, cycle) in enumerate(cycles):
            resumed = _last_per_rank(_of_cycle(run, cycle, Resumed))
            if resumed:
                start_step = min(r.step for r in resumed)
                start_at = min(record_time(r) for r in resumed)
            elif position == 0 and cycle.ready is not None:
                start_step, start_at = 0, cycle.ready
            else:
                continue
            ends = [(f.step, f.last_progress_at) for f in cycle.failures
                    if isinstance(f.step, int) and f.last_progress_at is not None]
            if not ends:
                continue
            step = max(s for s, _ in ends)
            at = min(a for s, a in ends if s == step)  # the first rank seen in it
            if step > start_step and at > start_at:
                found.append((at - start_at) / (step - start_step))
    return found


def failure_costs(report: RunReport) -> list[FailureCost]:
    """One :class:`FailureCost` per failed cycle (per run id and cycle, every node's records
    together), oldest first."""
    incidents: dict[tuple[Optional[str], int], FailureCost] = {}
    resumed_by_incident: dict[tuple[Optional[str], int], list[Resumed]] = {}
    for node, cycles in _node_cycles(report).items():
        for position, (run, cycle) in enumerate(cycles):
            if not cycle.failures:
                continue
            key = (run.run_id, cycle.index)
            roots = [f for f in cycle.failures if role(f) == ROLE_ROOT]
            first = min(roots or cycle.failures, key=failed_at)
            cost = incidents.get(key)
            if cost is None:
                kind = failure_kind(first) if roots else "lost node" if first.root_outcome == "lost" else "other"
                cost = incidents[key] = FailureCost(run.run_id, cycle.index, kind, failed_at(first), [])
            elif roots and failed_at(first) < cost.failed_at:
                cost.kind, cost.failed_at = failure_kind(first), failed_at(first)
            cost.nodes.append(node)
            steps = _steps(cycle.failures)
            if steps:
                cost.failed_step = max(steps + ([cost.failed_step] if cost.failed_step is not None else []))
            at = [f.last_progress_at for f in cost_records(cycle.failures, cost.failed_step)]
            if at:
                cost.failed_step_at = min(at + ([cost.failed_step_at] if cost.failed_step_at is not None else []))
            for saved in _of_cycle(run, cycle, JitStateSaved):
                if saved.step is not None and (cost.jit_step is None or saved.step > cost.jit_step):
                    cost.jit_step, cost.jit_seconds = saved.step, saved.seconds
            for refused in _of_cycle(run, cycle, JitStateNotSaved):
                cost.jit_not_saved = cost.jit_not_saved or refused.reason or None
            if position + 1 < len(cycles):
                next_run, following = cycles[position + 1]
                resumed_by_incident.setdefault(key, []).extend(_of_cycle(next_run, following, Resumed))
    step_s = statistics.median(cycle_step_seconds(report) or [float("nan")])
    for key, cost in incidents.items():
        resumed = _last_per_rank(resumed_by_incident.get(key, []))
        if resumed:
            earliest = min(resumed, key=lambda r: r.step)
            cost.resumed_step, cost.resumed_at = earliest.step, min(record_time(r) for r in resumed)
            sources = {r.source for r in resumed}
            cost.source = earliest.source if len(sources) == 1 else "mixed"
        if cost.failed_step is not None and cost.resumed_step is not None:
            cost.steps_redone = max(0, cost.failed_step - cost.resumed_step)
            if step_s == step_s:  # not NaN: a step time is known
                cost.seconds_redone = round(cost.steps_redone * step_s, 3)
    return sorted(incidents.values(), key=lambda c: c.failed_at)


def cost_figures(report: RunReport, useful_s: float, wall_s: float) -> dict[str, Any]:
    """The run's figures of redone work: ``failure_costs`` (one dict each), ``redone_steps`` and
    ``redone_s`` (totals over the failures whose cost is known), ``step_s`` (the median step time
    used), ``goodput_less_redone`` ((useful - redone) / wall)."""
    costs = failure_costs(report)
    per_cycle = cycle_step_seconds(report)
    known = [c for c in costs if c.steps_redone is not None]
    seconds = [c.seconds_redone for c in known if c.seconds_redone is not None]
    redone_s = round(sum(seconds), 3) if seconds else None
    return {
        "failure_costs": [c.to_dict() for c in costs],
        "redone_steps": sum(c.steps_redone for c in known) if known else None,
        "redone_s": redone_s,
        "redone_known": len(known),
        "step_s": round(statistics.median(per_cycle), 5) if per_cycle else None,
        "goodput_less_redone": round(max(0.0, useful_s - redone_s) / wall_s, 4)
        if redone_s is not None and wall_s > 0 else None,
    }


def cost_text(cost: FailureCost) -> str:
    """One failure's cost in words, for the timeline."""
    failed = f"failed in step {cost.failed_step}" if cost.failed_step is not None else "failed in an unknown step"
    if cost.resumed_step is None:
        return f"cost of the cycle {cost.cycle} failure: {failed}; no rank reported where it resumed from"
    where = SOURCE_WORDS.get(cost.source or "", cost.source or "an unknown source")
    if cost.source == "jit" and cost.jit_step is not None and cost.jit_seconds is not None:
        where += f", saved in {cost.jit_seconds:.2f} s"
    elif cost.source != "jit" and cost.jit_not_saved:
        where += f"; no just-in-time state: {cost.jit_not_saved}"
    redone = "steps redone unknown" if cost.steps_redone is None else f"{cost.steps_redone} step(s) redone"
    if cost.seconds_redone is not None:
        redone += f", about {cost.seconds_redone:.2f} s"
    return (f"cost of the cycle {cost.cycle} failure: {failed}, resumed from step {cost.resumed_step} ({where}): "
            f"{redone}")


def cost_lines(values: dict[str, Any]) -> list[str]:
    """The figures' line about redone work (none when no failure's cost is known)."""
    costs: Sequence[dict[str, Any]] = values.get("failure_costs", [])
    if not costs:
        return []
    if not values.get("redone_known"):
        return [f"work redone: unknown for all {len(costs)} failure(s) (no rank reported its resumed step: "
                "RankMonitorClient.report_resumed)"]
    seconds = f", about {values['redone_s']:.1f} s at {values['step_s']:.3f} s per step (median)" \
        if values.get("redone_s") is not None else " (step time unknown)"
    net = f"; goodput less the redone work {values['goodput_less_redone']:.3f}" \
        if values.get("goodput_less_redone") is not None else ""
    by_source: dict[str, int] = {}
    for cost in costs:
        if cost["steps_redone"] is not None:
            name = _FROM_WORDS.get(cost["source"] or "", f"from {cost['source'] or 'an unknown source'}")
            by_source[name] = by_source.get(name, 0) + 1
    sources = ", ".join(f"{n} {name}" for name, n in sorted(by_source.items()))
    return [f"work redone: {values['redone_steps']} step(s) over {values['redone_known']} of {len(costs)} "
            f"failure(s) ({sources}){seconds}{net}"]
