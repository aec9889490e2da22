"""Why workers failed: torch's failures, the monitors' reports and the evidence, turned into records.

:func:`failure_records` is a pure function (no clock, no I/O): the agent hands it what torch
reported, the hangs the monitors reported before signalling, the workers it stopped itself, the
evidence it gathered (:class:`Evidence`: progress and stacks from the monitors, when it saw each
exit, the other nodes' views) and the time; it returns one :class:`FailureRecord` per failed
worker of this node, the root first. Which rank is the root and which are collateral is
:mod:`launcher.decision.culprit`'s rule, applied over every node's ranks.

A record is typed through and through: what a hang report said (:class:`HangDetail`), the
rank's last progress and stacks (the monitor's own :class:`~ft_core.wire.messages.Progress` and
:class:`~ft_core.wire.messages.StackSummary`) and, for a collateral rank, its root
(:class:`RootDetail`); :meth:`launcher.events.log.EventLog.failure` writes each field of the
``failure`` record from them.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ft_core.monitor.deadlines import HangKind
from ft_core.wire.messages import Progress, ProgressReport, RankHang, StacksCaptured, StackSummary
from ft_core.wire.stacks import innermost_user_frame
from launcher.decision import culprit
from launcher.decision.crash_loop import Fingerprint, failed_before_first_step, fingerprint, killed_from_outside
from launcher.decision.culprit import COLLATERAL, LOST, ROOT, LostNode, RankState
from launcher.decision.unwinding import caller_frame, ending_reason, is_own_frame

KIND_HANG = "hang"
KIND_EXIT = "exit"
KIND_SIGNAL = "signal"
KIND_TERMINATED = "terminated"
"""Stopped by the launcher (or torch) because another worker failed: a consequence."""
KIND_UNHEALTHY = "unhealthy"

MAX_ERROR_CHARS = 1000
# torch's placeholder messages when a worker left no error file: not the worker's error.
_PLACEHOLDER_PREFIXES = ("To enable traceback", "Signal ")
FOUND_THROUGH_TIMEOUT = "found through another rank's timeout"
"""The hang kind of a root found through another rank's timeout (rule 3 of :mod:`launcher.decision.culprit`)."""


@dataclass(frozen=True)
class HangDetail:
    """What the monitor's hang report said (or, for a root found through another rank's
    timeout, only :data:`FOUND_THROUGH_TIMEOUT` as the kind).

    Attributes:
        kind: A :class:`~ft_core.monitor.deadlines.HangKind`; a kind this launcher does not know
            (a newer monitor) as sent; or :data:`FOUND_THROUGH_TIMEOUT`.
        section: The section whose timeout passed, if any.
        elapsed: Seconds since the deadline's start.
        timeout: The timeout that passed, seconds.
        signal: The termination signal the monitor sent (its name).
    """

    kind: HangKind | str
    section: str | None = None
    elapsed: float | None = None
    timeout: float | None = None
    signal: str | None = None


@dataclass(frozen=True)
class RootDetail:
    """A collateral rank's root, as every node chose it.

    Attributes:
        rank: Its global rank (None for a lost node).
        node: Its host, None if unknown.
        group_rank: Its node's rank in the round.
        cause: Its cause.
        outcome: ``hang``, ``crash``, ``stopped``, ``lost`` or ``left`` (:mod:`launcher.decision.culprit`).
        lost_nodes: For a ``lost`` root, every node that sent no report; None otherwise.
    """

    rank: int | None
    node: str | None
    group_rank: int | None
    cause: str
    outcome: str
    lost_nodes: tuple[LostNode, ...] | None = None


@dataclass
class FailureRecord:
    """Why one worker failed in one cycle.

    Attributes:
        cycle: Cycle index (0 = first start).
        rank: Global rank (``None`` if unknown).
        local_rank: Local rank on this node.
        pid: Worker process id.
        cause: Human-readable cause, e.g. ``hang: section 'step' open 12.3 s > timeout 10.0 s``,
            ``exit code 1`` or ``signal SIGSEGV``.
        kind: ``hang``, ``exit``, ``signal`` or ``terminated`` (stopped by us after another
            worker failed).
        detected_at: Wall-clock time of detection (epoch seconds).
        exit_code: torch's exit code of the worker (negative: a signal), None without one.
        error: The worker's own error message (torch's error file), None without one.
        hang: What the hang report said, None for a rank that did not hang.
        progress: The rank's last progress as its monitor saw it, None if unknown.
        stacks: The rank's stacks (taken by its monitor, or the frames of its traceback), None
            when none were taken and none failed.
        root: For a collateral rank, the cycle's root; None otherwise or without a root.
        role: ``root`` (this rank caused the failure) or ``collateral`` (it stopped because of
            the root, which may be on another node).
        explanation: The sentence the launcher's line adds, e.g. ``rank 1 froze in step 61
            (outside any section for 3.0 s); rank 0 stopped waiting for it``.
        fingerprint: What the cycle's root failure was (:mod:`launcher.decision.crash_loop`; every record
            of the cycle carries the root's, on every node), None without a root.
        root_step: The root rank's last step, None if unknown.
        root_before_first_step: The root raised its own exception before its first step
            (:func:`launcher.decision.crash_loop.failed_before_first_step`).
        root_from_outside: The root was killed by a signal from outside with no exception of its
            own (:func:`launcher.decision.crash_loop.killed_from_outside`): never a repeat.
    """

    cycle: int
    rank: int | None
    local_rank: int
    pid: int | None
    cause: str
    kind: str
    detected_at: float
    exit_code: int | None = None
    error: str | None = None
    hang: HangDetail | None = None
    progress: Progress | None = None
    stacks: StackSummary | None = None
    root: RootDetail | None = None
    role: str = ROOT
    explanation: str = ""
    fingerprint: Fingerprint | None = None
    root_step: int | None = None
    root_before_first_step: bool = False
    root_from_outside: bool = False

    @property
    def user_frame(self) -> str | None:
        """The innermost frame of the user's code in :attr:`stacks`, None without one."""
        return innermost_user_frame(list(self.stacks.stack_frames)) if self.stacks is not None else None


class ProcessFailureLike(Protocol):
    """What we read of torch's ``ProcessFailure``."""

    local_rank: int
    pid: int
    exitcode: int
    message: Any


@dataclass
class Evidence:
    """What the agent learnt about a failed cycle besides torch's failures and the hang reports.

    Attributes:
        node: This node's host name.
        group_rank: This node's rank in the rendezvous.
        reports: Local rank -> the monitor's :class:`~ft_core.wire.messages.ProgressReport`, taken
            when the failure was noticed (a crashed rank's report holds its last progress and
            when its monitor saw it disconnect, ``disconnected_at``).
        stacks: Local rank -> the monitor's :class:`~ft_core.wire.messages.StacksCaptured` for
            ranks stopped as collateral.
        exits_seen_at: Local rank -> epoch seconds at which the launcher saw the worker exit.
        remote: The other nodes' :class:`~launcher.decision.culprit.RankState` for this cycle.
    """

    node: str = ""
    group_rank: int | None = None
    reports: Mapping[int, ProgressReport] = field(default_factory=dict)
    stacks: Mapping[int, StacksCaptured] = field(default_factory=dict)
    exits_seen_at: Mapping[int, float] = field(default_factory=dict)
    remote: Sequence[RankState] = ()


@dataclass(frozen=True)
class Exchanged:
    """What the exchange with the other nodes brought back (see :func:`failure_records`).

    Attributes:
        states: The other nodes' :class:`~launcher.decision.culprit.RankState` for this cycle.
        lost: The nodes that sent no view within the wait (empty when the store could not be
            read: nothing is known about them then).
        waited: How long this node waited for the views, in seconds.
    """

    states: Sequence[RankState] = ()
    lost: Sequence[LostNode] = ()
    waited: float = 0.0


def failure_records(
    failures: Mapping[int, ProcessFailureLike],
    *,
    local_ranks: Mapping[int, int],
    hangs: Mapping[int, RankHang],
    stopped_by_us: Collection[int],
    cycle: int,
    now: float,
    evidence: Evidence | None = None,
    exchange: Callable[[list[RankState]], Exchanged] | None = None,
) -> list[FailureRecord]:
    """One record per failed worker; the root first, then the collateral.

    Args:
        failures: torch's ``RunResult.failures``: global rank -> ``ProcessFailure`` (the agent
            adds a hung worker that exited 0: a hang fails the cycle whatever the exit status).
        local_ranks: Global rank -> local rank of this node's workers.
        hangs: The monitors' :class:`~ft_core.wire.messages.RankHang` reports of this cycle, by
            local rank (their ``kind`` is a :class:`~ft_core.monitor.deadlines.HangKind` value; with warm
            starts torch knows the trampoline's pid and the monitor the forked worker's, so
            the local rank is the key both share).
        stopped_by_us: Pids the launcher stopped because another worker had failed.
        cycle: The cycle the failures belong to.
        now: Detection time (epoch seconds) of failures without a better one.
        evidence: Progress, stacks, exit times and the other nodes' views (see :class:`Evidence`).
        exchange: Called with this node's rank states once they are known; returns the other
            nodes' and the nodes that sent none (the agent publishes and reads them in the
            rendezvous store).

    Returns:
        The root first (if it is on this node), then hangs, exits and signals, then workers
        that were stopped as a consequence (``terminated``); within each, by detection time
        and local rank.
    """
    evidence = evidence or Evidence()
    # torch's own poll SIGTERMs the survivors when it sees a failure we had not peeked yet;
    # a SIGTERM beside any other cause is that consequence, not a second root cause.
    other_causes = any(f.exitcode != -signal.SIGTERM for f in failures.values())
    records, states = [], []
    for global_rank, failure in failures.items():
        local_rank = local_ranks.get(global_rank, failure.local_rank)
        record, state = _one(global_rank, local_rank, failure, hangs.get(local_rank),
                             failure.pid in stopped_by_us or (failure.exitcode == -signal.SIGTERM and other_causes),
                             cycle, now, evidence)
        records.append(record)
        states.append(state)
    return _judged(records, states, evidence, exchange)


DROPPED_MEMBER_CAUSE = "stopped: a node of its round was dropped from the rendezvous"
"""The cause of a rank restarted because its round lost a node (:func:`dropped_member_records`)."""


def dropped_member_records(
    workers: Mapping[int, tuple[int, int | None]],
    *,
    dropped: Collection[int],
    cycle: int,
    now: float,
    evidence: Evidence | None = None,
    exchange: Callable[[list[RankState]], Exchanged] | None = None,
) -> list[FailureRecord]:
    """Records for this node's still-running workers when torch restarts them because nodes wait
    in the rendezvous and the round lost one or more members (``dropped``: their keep-alive
    lapsed). The views are exchanged as for a failure; rule 6 of :mod:`launcher.decision.culprit`
    names a dropped node that sent none as the root, the ranks here collateral.

    Args:
        workers: Global rank -> (local rank, pid) of this node's workers.
        dropped: Group ranks of the round's nodes that torch no longer counts as alive.
        cycle: The cycle they belong to.
        now: When this node noticed (epoch seconds).
        evidence: Progress and the other nodes' views, as for :func:`failure_records`.
        exchange: As for :func:`failure_records`.

    Returns:
        One collateral record per worker, the root named (the dropped node, or what the other
        nodes' views name: a node that left on request, a crash); empty when no root was found
        (the store could not be read, or a dropped node had published a view of still-running
        ranks), so the caller records a plain restart.
    """
    evidence = evidence or Evidence()
    records, states = [], []
    for global_rank, (local_rank, pid) in sorted(workers.items()):
        report = evidence.reports.get(local_rank)
        progress = report.progress if report is not None else None
        records.append(FailureRecord(cycle, global_rank, local_rank, pid, DROPPED_MEMBER_CAUSE, KIND_TERMINATED,
                                     now, progress=progress))
        states.append(RankState(rank=global_rank, local_rank=local_rank, node=evidence.node,
                                group_rank=evidence.group_rank, pid=pid, outcome=culprit.STOPPED,
                                cause=DROPPED_MEMBER_CAUSE, progress=progress))
    records = _judged(records, states, evidence, exchange, dropped)
    return records if records and records[0].root is not None else []


def _judged(records: list[FailureRecord], states: list[RankState], evidence: Evidence,
            exchange: Callable[[list[RankState]], Exchanged] | None,
            dropped: Collection[int] = ()) -> list[FailureRecord]:
    """``records`` with their roles, root and explanations once the root is chosen among this
    node's ``states`` and the other nodes' views; the root first."""
    exchanged = exchange(states) if exchange is not None else Exchanged()
    remote = [*evidence.remote, *exchanged.states]
    everyone = [*states, *(s for s in remote if not any(s.same_rank(mine) for mine in states))]
    root = culprit.choose_root(everyone, exchanged.lost, exchanged.waited, dropped)
    collateral = [s for s in everyone if root is None or not s.same_rank(root)]
    cycle_fingerprint = fingerprint(root) if root is not None else None
    root_step = root.progress.step if root is not None and root.progress is not None else None
    before_first_step = root is not None and failed_before_first_step(root)
    from_outside = root is not None and killed_from_outside(root)
    for record, state in zip(records, states, strict=True):
        _explain(record, state, root, collateral, evidence)
        record.fingerprint, record.root_step = cycle_fingerprint, root_step
        record.root_before_first_step, record.root_from_outside = before_first_step, from_outside
    records.sort(key=lambda r: (r.role != ROOT, r.kind == KIND_TERMINATED, r.kind != KIND_HANG,
                                r.detected_at, r.local_rank))
    return records


def _one(global_rank: int, local_rank: int, failure: ProcessFailureLike, hang: RankHang | None,
         terminated: bool, cycle: int, now: float, evidence: Evidence) -> tuple[FailureRecord, RankState]:
    hang_detail: HangDetail | None = None
    error: str | None = None
    report = evidence.reports.get(local_rank)
    progress = report.progress if report is not None else None
    asked = evidence.stacks.get(local_rank)
    captured: StackSummary | None = asked.stacks if asked is not None else None
    if hang is not None:
        kind, cause, outcome = KIND_HANG, hang.cause, culprit.HANG
        hang_detail = HangDetail(_hang_kind(hang.kind), hang.section, hang.elapsed, hang.timeout, hang.signal)
        detected_at = hang.detected_at
        progress = hang.progress or progress
        captured = hang.stacks if hang.stacks is not None else captured
    else:
        if terminated:
            kind, outcome = KIND_TERMINATED, culprit.STOPPED
            cause = f"stopped after another worker failed ({exit_text(failure.exitcode)})"
        elif failure.exitcode < 0:
            kind, cause, outcome = KIND_SIGNAL, exit_text(failure.exitcode), culprit.CRASH
        else:
            kind, cause, outcome = KIND_EXIT, exit_text(failure.exitcode), culprit.CRASH
        seen = [evidence.exits_seen_at.get(local_rank, now)]
        if report is not None and report.disconnected_at is not None:
            # The monitor saw the rank's socket close when it exited: a precise, per-rank time
            # (the launcher may notice two exits at once).
            seen.append(report.disconnected_at)
        detected_at = min(seen) if outcome == culprit.CRASH else now
        error = worker_error(failure.message) or None
        if not (captured and captured.stack_frames):
            crash_frames = traceback_frames(failure.message)
            if crash_frames:
                captured = StackSummary(stack_frames=crash_frames, stack_method="traceback")
        if error:
            if kind == KIND_EXIT:  # the exception's summary line, e.g. "ValueError: bad lr"
                cause = f"{cause}: {error_summary(error)}"
    captured = captured or StackSummary()
    frames = list(captured.stack_frames)
    record = FailureRecord(cycle, global_rank, local_rank, failure.pid, cause, kind, detected_at,
                           exit_code=failure.exitcode, error=error, hang=hang_detail, progress=progress,
                           stacks=captured if frames or captured.stack_error else None)
    state = RankState(
        rank=global_rank, local_rank=local_rank, node=evidence.node, group_rank=evidence.group_rank,
        pid=failure.pid, outcome=outcome, cause=cause,
        event_at=detected_at if outcome != culprit.STOPPED else None,
        progress=progress, stack_frames=tuple(frames), stack_file=captured.stack_file,
    )
    return record, state


def _explain(record: FailureRecord, state: RankState, root: RankState | None, collateral: list[RankState],
             evidence: Evidence) -> None:
    if root is not None and state.same_rank(root):
        record.role = ROOT
        seen_at = None
        if root.outcome == culprit.STOPPED:
            # Found through another rank's timeout (rule 3 of launcher.decision.culprit): a hang of this
            # rank, not a consequence.
            seen_at = min((s.event_at for s in collateral if s.outcome == culprit.HANG and s.event_at is not None),
                          default=None)
            record.kind = KIND_HANG
            record.cause = "hang: no progress while the other ranks waited for it in a collective"
            record.hang = HangDetail(FOUND_THROUGH_TIMEOUT)
            if seen_at is not None:
                record.detected_at = seen_at
        text = culprit.describe_root(root, record.user_frame, seen_at)
        others = culprit.collateral_text(collateral)
        record.explanation = f"{text}; {others}" if others else text
    else:
        record.role = COLLATERAL
        waiting = culprit.waiting_for(root, evidence.node, evidence.group_rank)
        frames = list(record.stacks.stack_frames) if record.stacks is not None else []
        where = ""
        ending = ending_reason(frames)
        if ending is not None:
            # Its stack was taken while it unwound (printing its traceback, exiting): the
            # innermost frame is not where it waited.
            where = f" (already {ending} when its stack was taken)"
        elif frames:
            # Never a frame of ours as where it waited or as the user's caller.
            blocked = next((f for f in frames if not is_own_frame(f)), None)
            user = caller_frame(frames)
            if blocked is not None:
                where = f", blocked at {blocked}" + (f" (called from {user})" if user and user != blocked else "")
        record.explanation = f"stopped waiting for {waiting}{where}"
        if root is not None:
            # rule 4 of launcher.decision.culprit: a lost root is a node that sent no view; the others it names too
            record.root = RootDetail(root.rank, root.node or None, root.group_rank, root.cause, root.outcome,
                                     tuple(root.lost_nodes) if root.outcome == LOST else None)


def _hang_kind(value: str) -> HangKind | str:
    """The report's hang kind; a kind this launcher does not know (a newer monitor) as sent."""
    try:
        return HangKind(value)
    except ValueError:
        return value


def group_unhealthy_record(cycle: int, now: float) -> FailureRecord:
    """The record for a failed cycle in which torch named no failed worker."""
    return FailureRecord(cycle, None, -1, None, "worker group unhealthy", KIND_UNHEALTHY, now)


def worker_error(message: Any) -> str:
    """The worker's own error message from torch's ``ProcessFailure.message``, or ``""``.

    torch's ``@record`` stores ``{"message": ..., "extraInfo": ...}``; without an error file torch
    fills in a placeholder, which is not the worker's error.
    """
    if isinstance(message, dict):
        message = str(message.get("message", ""))
    if not isinstance(message, str) or message.startswith(_PLACEHOLDER_PREFIXES):
        return ""
    return message[:MAX_ERROR_CHARS]


MAX_SUMMARY_CHARS = 300


_TRACEBACK_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)
MAX_TRACEBACK_FRAMES = 20


def traceback_frames(message: Any) -> list[str]:
    """The frames (``file:line function``, innermost first) of the traceback torch's error file
    holds (``extraInfo.py_callstack``, written by ``@record`` or our front ends); [] without one."""
    if not isinstance(message, dict):
        return []
    extra = message.get("extraInfo")
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    if not isinstance(callstack, str):
        return []
    frames = [f"{path}:{line} {function}" for path, line, function in _TRACEBACK_FRAME.findall(callstack[-20000:])]
    return frames[::-1][:MAX_TRACEBACK_FRAMES]


def error_summary(error: str) -> str:
    """The first non-empty line of a worker's error (``Type: message``), at most 300 characters."""
    line = next((line.strip() for line in error.splitlines() if line.strip()), "")
    return line if len(line) <= MAX_SUMMARY_CHARS else line[:MAX_SUMMARY_CHARS - 3] + "..."


def exit_text(exitcode: int) -> str:
    """``exit code N`` or ``signal SIGNAME`` for a worker's exit code (negative = signal)."""
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
