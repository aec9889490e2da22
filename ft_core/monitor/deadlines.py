"""When is a watched rank hung? The rank monitor's deadline logic, as pure functions.

A rank reports progress into its shared-memory slot (:mod:`ft_core.wire.progress_slot`); the monitor
reads the slot (a :class:`SlotReading`) and, with the timeouts it enforces on that rank
(:class:`RankTimeouts`), asks :func:`check` whether a deadline has passed and, if not, when to
look again. Nothing here reads a clock, a socket or the slot itself, so every rule is unit-tested
with plain values (``tests/unit/test_deadlines.py``).

The deadlines a slot implies:

- before the first heartbeat: connection time + the initial heartbeat timeout;
- after it: the last heartbeat + the heartbeat timeout. Heartbeats and sections are independent
 : opening or closing a section is not a heartbeat. A sections-only rank under finite
  heartbeat timeouts is therefore stopped once the initial heartbeat timeout has passed; the
  front ends refuse that configuration up front (:func:`ft_core.client.sections_policy.sections_config_error`),
  the client warns about it (``RankMonitorClient``), and the hang's description says so;
- each open section: its start + its timeout;
- with no section open: the time the last one closed (or the connection) + the out-of-section
  timeout.

A timeout update restarts the clocks it affects at the moment of the update (the rank that sent
it was alive then; a shorter timeout must not be applied to an interval that began before it).

A suspension of the monitor itself restarts every clock when it resumes
(:meth:`RankTimeouts.restart_clocks`): ``scontrol suspend`` and SLURM's PreemptMode=SUSPEND stop
every process of the job, the monitor with its rank, and the monotonic clock runs on while they
are stopped. A rank that could not run is not hung; a monitor that could not run cannot tell
whether its rank could, so it gives the rank its full timeouts again from the moment it resumed.
A rank stopped alone (its monitor running) is a hang as before. :func:`was_suspended` is the
rule that tells a monitor it was stopped.

The look-again rule: the slot can also *create* a deadline earlier than the earliest one known
(the first heartbeat switches to the shorter subsequent timeout; a section opens; the last
section closes). Any such deadline lies at least the smallest of those timeouts after the event
that created it, so looking again no later than that smallest timeout from now catches it before
it is due: detection stays exact without any message from the rank.

Standard library only: the rank monitor imports it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import EllipsisType
from typing import Optional

MIN_LOOK_AGAIN = 0.001
"""Shortest look-again interval in seconds, however small a timeout: the monitor never spins."""

SUSPENSION_MIN_GAP = 2.0
"""Seconds a monitor must wake up late, with no SIGCONT, to count as suspended.

A SIGSTOP always ends with a SIGCONT, which the monitor sees; a freeze that sends no signal (a
cgroup freezer, a paused VM) is seen only as a sleep that lasted much longer than asked. A busy
host delays a wake-up by milliseconds, not seconds.
"""

LATE_SUSPENSION_INTERVAL = 60.0
"""Seconds within which a second late wake-up (no SIGCONT) does not count as a suspension again:
a host so overloaded that the monitor always wakes seconds late must not postpone detection
forever (it is postponed once, by at most one timeout)."""


class HangKind(str, enum.Enum):
    """What a hung rank failed to do in time.

    The ``.value`` strings are the ``kind`` of the monitor's ``rank_hang`` messages and the
    ``hang_kind`` of the launcher's failure records.
    """

    INITIAL_HEARTBEAT = "initial_heartbeat"
    HEARTBEAT = "heartbeat"
    SECTION = "section"
    OUT_OF_SECTION = "out_of_section"


@dataclass(frozen=True)
class Deadline:
    """The moment a rank counts as hung unless it makes progress first.

    Attributes:
        when: ``started + timeout`` (monotonic seconds).
        kind: What must happen before then.
        started: When the interval being timed began.
        timeout: The timeout that applies, in seconds.
        section: The section's name for :attr:`HangKind.SECTION`, else None.
        note: What the description adds, e.g. :data:`SECTIONS_ARE_NOT_HEARTBEATS`.
    """

    when: float
    kind: HangKind
    started: float
    timeout: float
    section: Optional[str] = None
    note: Optional[str] = None

    def describe(self, now: float) -> str:
        """The hang this deadline means when it has passed at ``now`` (see :func:`describe_hang`)."""
        text = describe_hang(self.kind, now - self.started, self.timeout, self.section)
        return text if self.note is None else f"{text} ({self.note})"


SECTIONS_ARE_NOT_HEARTBEATS = (
    "the rank opened or closed sections, which are not heartbeats; for a workload that uses "
    "sections only, set initial_rank_heartbeat_timeout and rank_heartbeat_timeout to null"
)
"""The note of an initial-heartbeat hang of a rank that used sections."""


@dataclass(frozen=True)
class SlotReading:
    """One read of a rank's progress slot; times are monotonic seconds, 0.0 means "not set".

    Attributes:
        last_heartbeat: Time of the last heartbeat.
        last_section_activity: Time a section was last opened or closed. Not a heartbeat: it
            only explains an initial-heartbeat hang (:data:`SECTIONS_ARE_NOT_HEARTBEATS`).
        out_of_section_since: When the rank last left every section (0.0 while one is open).
        sections_open_since: Per section, in :attr:`RankTimeouts.section_names` order, when it
            was opened (0.0 while closed).
    """

    last_heartbeat: float = 0.0
    last_section_activity: float = 0.0
    out_of_section_since: float = 0.0
    sections_open_since: tuple[float, ...] = ()


@dataclass
class RankTimeouts:
    """The timeouts a monitor enforces on one rank (``None``: no limit), and when they changed.

    Attributes:
        connected_at: When the rank connected: the initial heartbeat interval starts there.
        initial_heartbeat: Timeout until the first heartbeat.
        heartbeat: Timeout between heartbeats.
        section_names: The configured sections, in slot order.
        sections: Per section (same order), its timeout.
        out_of_section: Timeout with no section open.
        heartbeat_set_at: When the heartbeat timeouts were last changed (0.0: never).
        sections_set_at: When the section timeouts were last changed (0.0: never).
        resumed_at: When the monitor last resumed from a suspension (0.0: never); every clock
            restarts there.
    """

    connected_at: float
    initial_heartbeat: Optional[float]
    heartbeat: Optional[float]
    section_names: tuple[str, ...]
    sections: list[Optional[float]]
    out_of_section: Optional[float]
    heartbeat_set_at: float = 0.0
    sections_set_at: float = 0.0
    resumed_at: float = 0.0

    def set_heartbeat(self, initial: Optional[float], subsequent: Optional[float], now: float) -> None:
        """Replace both heartbeat timeouts; the heartbeat clock restarts at ``now``."""
        self.initial_heartbeat = initial
        self.heartbeat = subsequent
        self.heartbeat_set_at = now

    def set_sections(
        self, updates: Mapping[str, Optional[float]], now: float,
        out_of_section: Optional[float] | EllipsisType = ...,
    ) -> None:
        """Replace the timeouts of the named sections, and the out-of-section one unless ``...``.

        The section clocks (open sections and out-of-section time) restart at ``now``.

        Raises:
            ValueError: A name is not a configured section (nothing is changed then).
        """
        unknown = sorted(set(updates) - set(self.section_names))
        if unknown:
            raise ValueError(
                f"unknown section(s) {', '.join(unknown)}; configured: "
                f"{', '.join(self.section_names) or 'none'}"
            )
        for name, timeout in updates.items():
            self.sections[self.section_names.index(name)] = timeout
        if out_of_section is not ...:
            self.out_of_section = out_of_section
        self.sections_set_at = now

    def restart_clocks(self, now: float) -> None:
        """Restart every clock at ``now``: the monitor resumed from a suspension.

        Each interval (to the first or next heartbeat, in a section, out of any section) counts
        from ``now`` if it began earlier; the timeouts themselves are unchanged.
        """
        self.resumed_at = max(self.resumed_at, now)

    def look_again_after(self) -> Optional[float]:
        """Seconds within which a new earlier deadline may appear (None: none can).

        The smallest timeout an event in the slot can start: the heartbeat timeout (the first
        heartbeat switches to it), each section's and the out-of-section one; never below
        :data:`MIN_LOOK_AGAIN`.
        """
        candidates = [t for t in self.sections if t is not None]
        candidates += [t for t in (self.heartbeat, self.out_of_section) if t is not None]
        return max(min(candidates), MIN_LOOK_AGAIN) if candidates else None


def earliest_deadline(timeouts: RankTimeouts, reading: SlotReading) -> Optional[Deadline]:
    """The earliest deadline that ``reading`` implies under ``timeouts`` (None: no limit applies)."""
    best: Optional[Deadline] = None

    def consider(start: float, timeout: Optional[float], kind: HangKind, section: Optional[str] = None) -> None:
        nonlocal best
        if timeout is None or start <= 0.0:
            return
        when = start + timeout
        if best is None or when < best.when:
            best = Deadline(when, kind, start, timeout, section)

    hb_floor = max(timeouts.heartbeat_set_at, timeouts.resumed_at)
    if reading.last_heartbeat == 0.0:  # section activity is not a heartbeat (see the module docstring)
        consider(max(timeouts.connected_at, hb_floor), timeouts.initial_heartbeat, HangKind.INITIAL_HEARTBEAT)
    else:
        consider(max(reading.last_heartbeat, hb_floor), timeouts.heartbeat, HangKind.HEARTBEAT)
    section_floor = max(timeouts.sections_set_at, timeouts.resumed_at)
    if reading.out_of_section_since > 0.0:
        consider(max(reading.out_of_section_since, section_floor), timeouts.out_of_section,
                 HangKind.OUT_OF_SECTION)
    opened = reading.sections_open_since
    for name, timeout, since in zip(timeouts.section_names, timeouts.sections, opened, strict=True):
        if timeout is not None and since > 0.0:
            consider(max(since, section_floor), timeout, HangKind.SECTION, name)
    if best is not None and best.kind is HangKind.INITIAL_HEARTBEAT and reading.last_section_activity > 0.0:
        best = replace(best, note=SECTIONS_ARE_NOT_HEARTBEATS)
    return best


@dataclass(frozen=True)
class DeadlineCheck:
    """The outcome of :func:`check`: a passed deadline, or when to look again.

    Attributes:
        hang: The deadline that has passed (the rank is hung unless it already exited).
        wake_at: When to read the slot again (None: only a message from the rank can create a
            deadline). None when :attr:`hang` is set.
    """

    hang: Optional[Deadline] = None
    wake_at: Optional[float] = None


def check(timeouts: RankTimeouts, reading: SlotReading, now: float) -> DeadlineCheck:
    """Has a deadline passed at ``now``? If not, when must the slot be read again?

    The answer is the earlier of the earliest deadline and the look-again time (see the module
    docstring): sleeping until then never misses a deadline.
    """
    revisit = timeouts.look_again_after()
    look_again = None if revisit is None else now + revisit
    deadline = earliest_deadline(timeouts, reading)
    if deadline is None:
        return DeadlineCheck(wake_at=look_again)
    if now >= deadline.when:
        return DeadlineCheck(hang=deadline)
    return DeadlineCheck(wake_at=deadline.when if look_again is None else min(deadline.when, look_again))


def was_suspended(planned_wake: float, woke: float, continued: bool,
                  last_late_suspension: Optional[float] = None) -> bool:
    """Was the monitor itself stopped while it waited to wake at ``planned_wake``?

    Args:
        planned_wake: When it asked to wake (monotonic seconds).
        woke: When it ran again.
        continued: It received SIGCONT meanwhile (it had been stopped: SIGSTOP, SIGTSTP).
        last_late_suspension: When a late wake-up last counted as a suspension (None: never).

    Returns:
        True after a SIGCONT, or after a wake-up later than asked by :data:`SUSPENSION_MIN_GAP`
        unless one already counted within :data:`LATE_SUSPENSION_INTERVAL`.
    """
    if continued:
        return True
    if woke - planned_wake < SUSPENSION_MIN_GAP:
        return False
    return last_late_suspension is None or woke - last_late_suspension >= LATE_SUSPENSION_INTERVAL


def describe_hang(kind: HangKind | str, elapsed: float, timeout: float, section: Optional[str] = None) -> str:
    """One-line human description of a detected hang, e.g. for logs and event records."""
    kind = HangKind(kind)
    if kind is HangKind.SECTION:
        what = f"section {section!r} open {elapsed:.2f} s"
    elif kind is HangKind.OUT_OF_SECTION:
        what = f"out of any section for {elapsed:.2f} s"
    elif kind is HangKind.INITIAL_HEARTBEAT:
        what = f"no initial heartbeat for {elapsed:.2f} s"
    else:
        what = f"no heartbeat for {elapsed:.2f} s"
    return f"hang: {what} > timeout {timeout:.2f} s"

