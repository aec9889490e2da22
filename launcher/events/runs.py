"""A run as its event logs tell it: the shapes ``ft_report``'s text and its plot both read.

:mod:`launcher.events.report` builds a :class:`RunReport` from event logs and autoresume's
``history.tsv`` and writes its timeline; :mod:`launcher.events.plot` draws the same
:class:`RunReport`. The small readings of a failure both need (its role, when it failed, its kind)
are here, so neither module reaches into the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from launcher.events.records import EventRecord, Failure, LauncherStart, Result


class ReportError(Exception):
    """The input cannot be read; the message says what to pass instead."""


@dataclass
class Cycle:
    """One start of a node's worker group."""

    index: int
    started: float
    ready: Optional[float] = None
    ended: Optional[float] = None
    since_failure_s: Optional[float] = None
    warm: Optional[bool] = None
    failures: list[Failure] = field(default_factory=list)


@dataclass
class LauncherRecords:
    """One ``ft_launcher`` process: its records from ``launcher_start`` to ``result``."""

    node: str
    pid: int
    run_id: Optional[str]
    started: float
    attempt: Optional[int] = None
    start_record: LauncherStart = field(default_factory=LauncherStart)
    cycles: list[Cycle] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    result: Optional[Result] = None

    @property
    def ended(self) -> float:
        if self.result is not None:
            return record_time(self.result)
        return max([self.started] + [record_time(e) for e in self.events])


@dataclass
class HistoryAttempt:
    """One line of autoresume's ``history.tsv``."""

    number: int
    start: Optional[float]
    end: Optional[float]
    exit_code: str
    flag: str
    decision: str


@dataclass
class RunReport:
    """Every launcher run and autoresume attempt read as one run, with where they were read from."""

    runs: list[LauncherRecords]
    attempts: list[HistoryAttempt]
    sources: list[str]
    skipped_lines: int = 0


def record_time(record: EventRecord) -> float:
    """A record's time stamp (every record :func:`read_events` yields has one)."""
    return record.ts if record.ts is not None else 0.0


def role(failure: Failure) -> str:
    """``root`` or ``collateral``: the record's ``role`` when the launcher gives one, else from
    its cause (a worker the launcher stopped because another failed is collateral)."""
    return failure.effective_role


def failed_at(failure: Failure) -> float:
    """When a failure was detected (its monitor's time for a crash), else when it was recorded."""
    return failure.detected_at if failure.detected_at is not None else record_time(failure)


def failure_kind(failure: Failure) -> str:
    """``hang (heartbeat)``, ``hang (section 'step')``, ``exit``, ``signal``...: for per-kind figures."""
    kind = failure.cause_kind
    if kind == "hang" and failure.hang_kind:
        section = failure.section
        return f"hang ({failure.hang_kind}{' ' + repr(section) if section else ''})"
    return kind


def timeline_origin(report: RunReport) -> float:
    """Time zero of the timeline: the first attempt's or launcher's start."""
    return min([r.started for r in report.runs] + [a.start for a in report.attempts if a.start is not None])


def seconds_text(value: Optional[float]) -> str:
    """``1.23 s``, or ``-`` for an unknown duration."""
    return "-" if value is None else f"{value:.2f} s"
