"""``TimeoutsCalc``: timeouts derived from the intervals a rank observed.

Pure arithmetic plus one collective. Feed it events as they happen
(:meth:`TimeoutsCalc.update_on_heartbeat`, :meth:`TimeoutsCalc.update_on_section_event`); it
keeps the longest interval seen for each kind of timeout. A timeout is ``safety_factor`` times
that longest interval:

- initial heartbeat timeout: from ``start_time`` to the first heartbeat;
- subsequent heartbeat timeout: the longest gap between two heartbeats;
- a section's timeout: its longest open -> close;
- out-of-section timeout: the longest time with no section open, counted from ``start_time``.

:meth:`TimeoutsCalc.synchronize_all` replaces each longest interval by its maximum over all
ranks. ``get_*_timeouts(current=...)`` merge the new values with the timeouts in use. The
calculator applies no lower or upper bound: bounds belong to whoever applies the timeouts (the
client does).

Times are seconds from any monotonic origin; ``None`` means ``time.monotonic()`` now. No torch
here: the collective goes through :mod:`ft_core.client.collectives`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from typing import Optional

from ft_core.client.collectives import Collectives, default_collectives
from ft_core.wire.data import HeartbeatTimeouts, SectionAction, SectionTimeouts
from ft_core.wire.errors import TimeoutsCalcError  # noqa: F401  (the reference's module exports it)

EMA_ALPHA = 0.5
"""Weight of the newest value when a timeout calculated before is merged with a new one: a
slower run raises a timeout quickly, a faster one lowers it gradually."""

UNOBSERVED = -1.0
"""The longest interval of something never observed. Any observation is >= 0, so a MAX over
ranks keeps every rank's observation and stays UNOBSERVED only if no rank observed anything."""

_OPEN = SectionAction.OPEN
_CLOSE = SectionAction.CLOSE
_CLOSE_ALL = SectionAction.CLOSE_ALL
_monotonic = time.monotonic


def _ema(current: float, new: float) -> float:
    return EMA_ALPHA * new + (1.0 - EMA_ALPHA) * current


def _observed(longest: float) -> bool:
    # A zero interval (two events at the same clock reading) would give a zero timeout.
    return longest > 0


class TimeoutsCalc:
    """Observes one rank's heartbeats and sections; calculates timeouts from them.

    Heartbeat timeouts need at least two heartbeats (one initial and one subsequent interval);
    a section's timeout needs one completed open -> close of it; the out-of-section timeout
    needs one interval with no section open that ended (a section opened after it, or
    :meth:`maybe_bump_oos_time` was called while none was open).

    Attributes (the observations, in seconds; :data:`UNOBSERVED` until observed):
        start_time: Where the initial heartbeat interval and the first out-of-section interval
            start.
        safety_factor: Multiplies the longest observed interval.
        initial_max_time: Start to first heartbeat.
        subsequent_max_time: Longest gap between heartbeats.
        section_to_max_time: Section name to its longest open -> close.
        out_of_section_max_time: Longest time with no section open.
        open_sections: Open section name to its open time.
        count: Heartbeats observed.

    Args:
        sections: The section names that may be opened.
        start_time: Defaults to now.
        safety_factor: Timeout = ``safety_factor`` x longest observed interval.
    """

    def __init__(
        self,
        sections: Optional[Iterable[str]] = None,
        start_time: Optional[float] = None,
        safety_factor: float = 5.0,
    ) -> None:
        self.start_time = _monotonic() if start_time is None else start_time
        self.safety_factor = safety_factor
        self.count = 0
        self.prev_hb_time: Optional[float] = None
        self.initial_max_time = UNOBSERVED
        self.subsequent_max_time = UNOBSERVED
        # Sorted: synchronize_all reduces the values in this order on every rank.
        self.section_to_max_time: dict[str, float] = dict.fromkeys(sorted(sections or ()), UNOBSERVED)
        self.out_of_section_max_time = UNOBSERVED
        self.open_sections: dict[str, float] = {}
        self.last_section_close_time = self.start_time

    def reset_start_time(self) -> None:
        """Start the initial heartbeat interval now (as in the reference, sections unaffected)."""
        self.start_time = _monotonic()

    # ------------------------------------------------------------------ observations

    def update_on_heartbeat(self, hb_time: Optional[float] = None) -> None:
        """Record a heartbeat at ``hb_time`` (default: now)."""
        if hb_time is None:
            hb_time = _monotonic()
        prev = self.prev_hb_time
        if prev is None:
            elapsed = hb_time - self.start_time
            if elapsed > self.initial_max_time:
                self.initial_max_time = elapsed
        else:
            elapsed = hb_time - prev
            if elapsed > self.subsequent_max_time:
                self.subsequent_max_time = elapsed
        self.prev_hb_time = hb_time
        self.count += 1

    def update_on_section_event(
        self, section: Optional[str], action: SectionAction, event_time: Optional[float] = None
    ) -> None:
        """Record a section event at ``event_time`` (default: now).

        Sections may nest or overlap; out-of-section time runs only while none is open.

        Args:
            section: The section; ``None`` with ``SectionAction.CLOSE_ALL``.
            action: ``OPEN``, ``CLOSE``, or ``CLOSE_ALL`` (closes every open section).
            event_time: When it happened.

        Raises:
            TimeoutsCalcError: Unknown section, opening an open section, closing one that is
                not open, or no section given to ``OPEN``/``CLOSE``.
        """
        if event_time is None:
            event_time = _monotonic()
        open_sections = self.open_sections
        if action is _OPEN:
            if section not in self.section_to_max_time:
                raise self._unknown_section(section)
            if section in open_sections:
                raise TimeoutsCalcError(
                    f"section {section!r} is already open; close it before opening it again"
                )
            if not open_sections:  # maybe_bump_oos_time, inlined: this runs every step
                elapsed = event_time - self.last_section_close_time
                if elapsed > self.out_of_section_max_time:
                    self.out_of_section_max_time = elapsed
            open_sections[section] = event_time
        elif action is _CLOSE:
            opened = open_sections.pop(section, None)  # type: ignore[arg-type]
            if opened is None:
                raise self._cannot_close(section)
            elapsed = event_time - opened
            section_to_max_time = self.section_to_max_time
            if elapsed > section_to_max_time[section]:  # type: ignore[index]
                section_to_max_time[section] = elapsed  # type: ignore[index]
            if not open_sections:
                self.last_section_close_time = event_time
        elif action is _CLOSE_ALL:
            if section is not None and section not in self.section_to_max_time:
                raise self._unknown_section(section)
            if open_sections:
                section_to_max_time = self.section_to_max_time
                for name, opened in open_sections.items():
                    elapsed = event_time - opened
                    if elapsed > section_to_max_time[name]:
                        section_to_max_time[name] = elapsed
                open_sections.clear()
                self.last_section_close_time = event_time
        else:
            raise TimeoutsCalcError(f"unknown section action {action!r}; use a SectionAction")

    def maybe_bump_oos_time(self, curr_time: Optional[float] = None) -> None:
        """If no section is open, count the running out-of-section interval as if it ended at
        ``curr_time`` (default: now). The interval keeps running.

        Useful before calculating: the last interval (e.g. after the last section of a run)
        may be the longest.
        """
        if not self.open_sections:
            if curr_time is None:
                curr_time = _monotonic()
            elapsed = curr_time - self.last_section_close_time
            if elapsed > self.out_of_section_max_time:
                self.out_of_section_max_time = elapsed

    def _cannot_close(self, section: Optional[str]) -> TimeoutsCalcError:
        if section not in self.section_to_max_time:
            return self._unknown_section(section)
        return TimeoutsCalcError(f"section {section!r} is not open; it cannot be closed")

    def _unknown_section(self, section: Optional[str]) -> TimeoutsCalcError:
        known = ", ".join(self.section_to_max_time) or "none"
        return TimeoutsCalcError(f"unknown section {section!r} (known sections: {known})")

    # ------------------------------------------------------------------ all ranks

    def synchronize_all(self, collectives: Optional[Collectives] = None) -> None:
        """Replace every longest interval by its maximum over all ranks.

        A collective: every rank must call it (with the same sections). A rank that observed
        nothing ends with the others' observations; what no rank observed stays unobserved.
        Without a process group (the default collectives) nothing changes.

        Args:
            collectives: How to reach the other ranks; default
                :func:`ft_core.client.collectives.default_collectives`.
        """
        if collectives is None:
            collectives = default_collectives()
        names = list(self.section_to_max_time)
        values = [self.initial_max_time, self.subsequent_max_time, self.out_of_section_max_time]
        values += [self.section_to_max_time[name] for name in names]
        reduced = collectives.all_max(values)
        self.initial_max_time, self.subsequent_max_time, self.out_of_section_max_time = reduced[:3]
        for name, value in zip(names, reduced[3:], strict=True):
            self.section_to_max_time[name] = value

    # ------------------------------------------------------------------ heartbeat timeouts

    def can_get_hb_timeouts(self) -> bool:
        """True once an initial and a subsequent heartbeat interval were observed."""
        return _observed(self.initial_max_time) and _observed(self.subsequent_max_time)

    def get_hb_timeouts(self, current: Optional[HeartbeatTimeouts] = None) -> HeartbeatTimeouts:
        """The calculated heartbeat timeouts, merged with ``current``.

        A ``current`` value that was calculated is averaged with the new one (EMA, alpha 0.5);
        otherwise the new value replaces it.

        Raises:
            TimeoutsCalcError: Fewer than two heartbeats were observed.
        """
        if not self.can_get_hb_timeouts():
            raise TimeoutsCalcError(
                "not enough data to calculate heartbeat timeouts: at least two heartbeats are needed"
            )
        initial = self.safety_factor * self.initial_max_time
        subsequent = self.safety_factor * self.subsequent_max_time
        if current is not None and current.were_calculated:
            if current.initial is not None:
                initial = _ema(current.initial, initial)
            if current.subsequent is not None:
                subsequent = _ema(current.subsequent, subsequent)
        return HeartbeatTimeouts(initial=initial, subsequent=subsequent, were_calculated=True)

    # ------------------------------------------------------------------ section timeouts

    def _selected(self, selected_sections: Optional[Collection[str]]) -> list[str]:
        if selected_sections is None:
            return list(self.section_to_max_time)
        if isinstance(selected_sections, str):  # "step" would otherwise mean s, t, e, p
            raise TimeoutsCalcError(
                f"selected_sections must be a collection of names, got the string {selected_sections!r}"
            )
        selected = list(selected_sections)
        for name in selected:
            if name not in self.section_to_max_time:
                raise self._unknown_section(name)
        return selected

    def _missing(self, selected: list[str], calc_out_of_section: bool) -> list[str]:
        missing = [name for name in selected if not _observed(self.section_to_max_time[name])]
        if calc_out_of_section and not _observed(self.out_of_section_max_time):
            missing.append("out-of-section")
        return missing

    def can_get_section_timeouts(
        self, selected_sections: Optional[Collection[str]] = None, calc_out_of_section: bool = True
    ) -> bool:
        """True if every selected section (default: all) and, with ``calc_out_of_section``, the
        out-of-section time were observed.

        Raises:
            TimeoutsCalcError: A selected section is unknown.
        """
        return not self._missing(self._selected(selected_sections), calc_out_of_section)

    def get_section_timeouts(
        self,
        selected_sections: Optional[Collection[str]] = None,
        calc_out_of_section: bool = True,
        current: Optional[SectionTimeouts] = None,
    ) -> SectionTimeouts:
        """The calculated section timeouts, merged with ``current``.

        Calculates the selected sections (default: all) and, with ``calc_out_of_section``, the
        out-of-section timeout. Every other value is ``current``'s (``None`` without
        ``current``). A value calculated now and in ``current`` is their mean (EMA, alpha 0.5);
        one calculated now replaces a ``current`` value that was not calculated; a ``current``
        value that was calculated and is not recalculated now is kept (still calculated).

        Raises:
            TimeoutsCalcError: A selected section is unknown, or a selected value was never
                observed (the message names them).
        """
        selected = self._selected(selected_sections)
        missing = self._missing(selected, calc_out_of_section)
        if missing:
            raise TimeoutsCalcError(
                "not enough data to calculate timeouts for: " + ", ".join(missing) +
                " (each must be observed at least once)"
            )
        if current is None:
            current = SectionTimeouts()
        calculated_before = current.calculated_sections
        factor = self.safety_factor
        section: dict[str, Optional[float]] = {
            name: current.section.get(name) for name in self.section_to_max_time
        }
        calculated = {name for name in calculated_before if name in section}
        for name in selected:
            value = factor * self.section_to_max_time[name]
            previous = section[name]
            if name in calculated_before and previous is not None:
                value = _ema(previous, value)
            section[name] = value
            calculated.add(name)
        out_of_section = current.out_of_section
        oos_calculated = current.is_out_of_section_calculated
        if calc_out_of_section:
            value = factor * self.out_of_section_max_time
            if oos_calculated and out_of_section is not None:
                value = _ema(out_of_section, value)
            out_of_section = value
            oos_calculated = True
        return SectionTimeouts(
            section=section,
            out_of_section=out_of_section,
            calculated_sections=calculated,
            is_out_of_section_calculated=oos_calculated,
        )
