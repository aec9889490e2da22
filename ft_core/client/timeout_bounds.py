"""How a calculated timeout is bounded before a monitor enforces it, and how timeouts read in logs.

A calculated timeout is ``safety_factor`` times the longest interval any rank observed, merged
with the previous calculated value (:mod:`ft_core.client.timeouts_calc`, pure arithmetic). Before the
client sends it to its monitor it is raised to the minimum of its kind, a config field each
(``min_calculated_initial_heartbeat_timeout``, ``min_calculated_heartbeat_timeout``,
``min_calculated_section_timeout``, ``min_calculated_out_of_section_timeout``), and capped at
:data:`~ft_core.wire.config.MAX_SECONDS`. The same bounds apply to calculated timeouts restored from a
state file, which an earlier version or a run with other minimums may have written. Configured
timeouts are never changed by the bounds; but, as in the reference, a calculated timeout replaces
the configured one it was calculated for (also one typed on the command line): log lines then
name the configured value it replaces (:func:`describe_heartbeat_timeouts`), and the line that
lists the timeouts restored from a state file names the file and how to run with the configured
values instead (:func:`restored_hint`).

Our monitor acts at the deadline (the reference looks every few seconds), so a tight calculated
timeout really fires: a 2 ms step gives a 10 ms ``step`` timeout with ``safety_factor`` 5, which a
garbage collection pause crosses. The minimums keep a healthy rank alive through GC pauses, a
slow first step after a resume, a data-loader stall, or an evaluation or checkpoint of unusual
length on a busy node; their defaults are :data:`~ft_core.wire.config.MIN_CALCULATED_DEFAULTS`.

For logs: :func:`describe_heartbeat_timeouts` and :func:`describe_section_timeouts` state each
timeout in force and where it comes from: ``configured``, ``calculated``, or, for one calculated
just now (a :class:`Derivation`), what was observed, what was calculated and what applies, e.g.
``step 60.0 s (calculated: longest observed 0.028 s x safety factor 5 = 0.14 s, averaged with the
previous 60.0 s = 30.1 s, raised to the minimum 60.0 s of min_calculated_section_timeout)``, so
that a user sees why a hang took a minute to catch. :func:`significant_change` says when a change
deserves an INFO line, so that the timeouts are logged when they change, not after every
checkpoint.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ft_core.wire.config import MAX_SECONDS, MIN_CALCULATED_DEFAULTS
from ft_core.wire.data import HeartbeatTimeouts, SectionTimeouts

OUT_OF_SECTION = "out-of-section"
"""How logs name the out-of-section timeout."""

SIGNIFICANT_CHANGE = 0.10
"""A timeout that moved by less than this fraction of its value is not worth an INFO line (the
merge of old and new values moves calculated timeouts a little after every checkpoint)."""

Snapshot = dict[str, tuple[Optional[float], bool]]
"""Timeout name -> (seconds or None for no limit, calculated?): what a monitor enforces."""

Configured = Mapping[str, Optional[float]]
"""Timeout name (as in a :data:`Snapshot`) -> the configured value (None: no limit)."""


MINIMUM_FIELDS = {
    "initial_heartbeat": "min_calculated_initial_heartbeat_timeout",
    "heartbeat": "min_calculated_heartbeat_timeout",
    "section": "min_calculated_section_timeout",
    "out_of_section": "min_calculated_out_of_section_timeout",
}
"""The config field that sets each minimum (log lines name it: that is what a user changes)."""


@dataclass(frozen=True)
class Derivation:
    """How one timeout was just calculated, for the log line (before it was bounded).

    Attributes:
        observed: The longest interval any rank observed, in seconds.
        safety_factor: The config's factor; ``observed * safety_factor`` is the new estimate.
        previous: The earlier calculated value the estimate was averaged with (see
            :mod:`ft_core.client.timeouts_calc`), or None when it replaced a configured one.
        merged: The value after averaging (the estimate itself without ``previous``).
    """

    observed: float
    safety_factor: float
    previous: Optional[float]
    merged: float

    def text(self) -> str:
        """``longest observed 0.028 s x safety factor 5 = 0.14 s[, averaged with the previous 60.0 s = 30.1 s]``."""
        words = (f"longest observed {seconds_text(self.observed)} x safety factor {self.safety_factor:g} = "
                 f"{seconds_text(self.observed * self.safety_factor)}")
        if self.previous is not None:
            words += f", averaged with the previous {seconds_text(self.previous)} = {seconds_text(self.merged)}"
        return words


@dataclass(frozen=True)
class CalculatedMinimums:
    """The smallest calculated timeout of each kind that the client applies, in seconds."""

    initial_heartbeat: float = MIN_CALCULATED_DEFAULTS["initial_heartbeat"]
    heartbeat: float = MIN_CALCULATED_DEFAULTS["heartbeat"]
    section: float = MIN_CALCULATED_DEFAULTS["section"]
    out_of_section: float = MIN_CALCULATED_DEFAULTS["out_of_section"]

    @classmethod
    def from_config(cls, cfg: Any) -> CalculatedMinimums:
        """The minimums of a config; a field that is None or missing keeps its default."""
        values = {
            "initial_heartbeat": getattr(cfg, "min_calculated_initial_heartbeat_timeout", None),
            "heartbeat": getattr(cfg, "min_calculated_heartbeat_timeout", None),
            "section": getattr(cfg, "min_calculated_section_timeout", None),
            "out_of_section": getattr(cfg, "min_calculated_out_of_section_timeout", None),
        }
        return cls(**{name: value for name, value in values.items() if value is not None})


def heartbeat_derivations(
    observed: Mapping[str, float], safety_factor: float, current: Optional[HeartbeatTimeouts], new: HeartbeatTimeouts,
) -> dict[str, Derivation]:
    """How ``new`` (from :meth:`~ft_core.client.timeouts_calc.TimeoutsCalc.get_hb_timeouts`, not yet
    bounded) was calculated.

    Args:
        observed: ``"initial"`` / ``"subsequent"`` -> the longest interval (all ranks).
        current: The timeouts the calculation merged with (it averages calculated ones only).
    """
    merged_with = current if current is not None and current.were_calculated else None
    derivations = {}
    for name, longest in observed.items():
        value = getattr(new, name)
        if value is not None:
            previous = getattr(merged_with, name) if merged_with is not None else None
            derivations[name] = Derivation(longest, safety_factor, previous, value)
    return derivations


def section_derivations(
    observed: Mapping[str, float], safety_factor: float, current: Optional[SectionTimeouts], new: SectionTimeouts,
) -> dict[str, Derivation]:
    """How the values of ``new`` (from
    :meth:`~ft_core.client.timeouts_calc.TimeoutsCalc.get_section_timeouts`, not yet bounded) named
    in ``observed`` were calculated.

    Args:
        observed: Section name or :data:`OUT_OF_SECTION` -> the longest interval (all ranks),
            for the values calculated now.
        current: The timeouts the calculation merged with (it averages calculated ones only).
    """
    derivations = {}
    for name, longest in observed.items():
        previous: Optional[float] = None
        if name == OUT_OF_SECTION:
            value = new.out_of_section
            if current is not None and current.is_out_of_section_calculated:
                previous = current.out_of_section
        else:
            value = new.section.get(name)
            if current is not None and name in current.calculated_sections:
                previous = current.section.get(name)
        if value is not None:
            derivations[name] = Derivation(longest, safety_factor, previous, value)
    return derivations


def bound_calculated_timeout(seconds: float, minimum: float) -> float:
    """A calculated timeout as a monitor may enforce it: at least ``minimum``, at most
    :data:`~ft_core.wire.config.MAX_SECONDS` (the largest timeout a config or state file accepts)."""
    return min(max(seconds, minimum), MAX_SECONDS)


def bound_heartbeat_timeouts(hb: HeartbeatTimeouts, minimums: CalculatedMinimums) -> dict[str, float]:
    """Bound calculated heartbeat timeouts in place.

    Returns:
        ``{"initial" | "subsequent": value before}`` for each value that was raised or capped.
    """
    changed: dict[str, float] = {}
    if not hb.were_calculated:
        return changed
    for name, minimum in (("initial", minimums.initial_heartbeat), ("subsequent", minimums.heartbeat)):
        value = getattr(hb, name)
        if value is None:
            continue
        bounded = bound_calculated_timeout(value, minimum)
        if bounded != value:
            changed[name] = value
            setattr(hb, name, bounded)
    return changed


def bound_section_timeouts(
    timeouts: SectionTimeouts, minimums: CalculatedMinimums, names: Optional[Iterable[str]] = None,
    out_of_section: Optional[bool] = None,
) -> dict[str, float]:
    """Bound calculated section timeouts in place.

    Args:
        timeouts: Bounded where calculated (``calculated_sections``, ``is_out_of_section_calculated``).
        names: The sections to bound (default: every calculated one).
        out_of_section: Bound the out-of-section timeout (default: when it was calculated).

    Returns:
        Timeout name (a section, or :data:`OUT_OF_SECTION`) -> value before, for each value that
        was raised or capped.
    """
    changed: dict[str, float] = {}
    selected = timeouts.calculated_sections if names is None else names
    for name in selected:
        value = timeouts.section.get(name)
        if value is None or name not in timeouts.calculated_sections:
            continue
        bounded = bound_calculated_timeout(value, minimums.section)
        if bounded != value:
            changed[name] = value
            timeouts.section[name] = bounded
    if out_of_section is None:
        out_of_section = timeouts.is_out_of_section_calculated
    value = timeouts.out_of_section
    if out_of_section and timeouts.is_out_of_section_calculated and value is not None:
        bounded = bound_calculated_timeout(value, minimums.out_of_section)
        if bounded != value:
            changed[OUT_OF_SECTION] = value
            timeouts.out_of_section = bounded
    return changed


# ---------------------------------------------------------------------- log words


def seconds_text(seconds: Optional[float]) -> str:
    """``"600 s"``, ``"12.5 s"``, ``"0.31 s"``; ``"no limit"`` for None."""
    if seconds is None:
        return "no limit"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.2g} s" if seconds < 0.01 else f"{seconds:.2f} s"


def heartbeat_snapshot(hb: HeartbeatTimeouts) -> Snapshot:
    """What a monitor enforces for heartbeats."""
    return {"initial": (hb.initial, hb.were_calculated), "subsequent": (hb.subsequent, hb.were_calculated)}


def section_snapshot(timeouts: SectionTimeouts) -> Snapshot:
    """What a monitor enforces for sections and the out-of-section time."""
    snapshot: Snapshot = {
        name: (value, name in timeouts.calculated_sections) for name, value in sorted(timeouts.section.items())
    }
    snapshot[OUT_OF_SECTION] = (timeouts.out_of_section, timeouts.is_out_of_section_calculated)
    return snapshot


def configured_heartbeat_timeouts(cfg: Any) -> dict[str, Optional[float]]:
    """The heartbeat timeouts of a config, by the names :func:`heartbeat_snapshot` uses."""
    return {"initial": cfg.initial_rank_heartbeat_timeout, "subsequent": cfg.rank_heartbeat_timeout}


def configured_section_timeouts(cfg: Any) -> dict[str, Optional[float]]:
    """The section and out-of-section timeouts of a config, by the names :func:`section_snapshot` uses."""
    configured: dict[str, Optional[float]] = dict(cfg.rank_section_timeouts)
    configured[OUT_OF_SECTION] = cfg.rank_out_of_section_timeout
    return configured


def restored_hint(source: str) -> str:
    """What a user reads after calculated timeouts were restored from ``source`` at set-up.

    Calculated timeouts replace configured ones, even those typed on the command line (the
    reference's rule); the words say where they came from and how to run with the configured
    values instead.
    """
    return (f"calculated timeouts restored from {source} replace the configured ones "
            "(calculate_timeouts=True); to run with the configured values, set calculate_timeouts=False "
            "(deleting the file brings them back only until the next calculation)")


def _origin(
    calculated: bool, name: str, raised: Mapping[str, float], minimum: Optional[float], minimum_field: str,
    derivations: Mapping[str, Derivation], value: Optional[float] = None, configured: Configured = {},  # noqa: B006
) -> str:
    if not calculated:
        return "configured"
    words = _calculated_origin(name, raised, minimum, minimum_field, derivations)
    if name in configured and configured[name] != value:
        # The configured value may have been typed on the command line: say that it is not in force.
        before = configured[name]
        words += f"; replaces the configured {'null (no limit)' if before is None else seconds_text(before)}"
    return words


def _calculated_origin(
    name: str, raised: Mapping[str, float], minimum: Optional[float], minimum_field: str,
    derivations: Mapping[str, Derivation],
) -> str:
    derivation = derivations.get(name)
    if name in raised:
        before = raised[name]
        if minimum is not None and before < minimum:
            bound = f"raised to the minimum {seconds_text(minimum)} of {minimum_field}"
        else:
            bound = "capped"
        if derivation is not None:
            return f"calculated: {derivation.text()}, {bound}"
        return f"calculated {seconds_text(before)}, {bound}"
    if derivation is not None:
        return f"calculated: {derivation.text()}"
    return "calculated"


def describe_heartbeat_timeouts(
    hb: HeartbeatTimeouts, minimums: Optional[CalculatedMinimums] = None, raised: Mapping[str, float] = {},  # noqa: B006  (read only)
    derivations: Mapping[str, Derivation] = {},  # noqa: B006  (read only)
    configured: Configured = {},  # noqa: B006  (read only)
) -> str:
    """The heartbeat timeouts in force, e.g. ``"initial 600 s (configured), between heartbeats
    120 s (calculated 0.05 s, raised to the minimum 120 s of min_calculated_heartbeat_timeout)"``.

    Args:
        raised: What :func:`bound_heartbeat_timeouts` returned, to say which values were raised.
        derivations: ``"initial"`` / ``"subsequent"`` -> how the value was just calculated
            (then the words say what was observed and what was calculated).
        configured: ``"initial"`` / ``"subsequent"`` -> the configured value (see
            :func:`configured_heartbeat_timeouts`): a calculated value that differs says which
            configured value it replaces (``"...; replaces the configured 5.00 s"``).
    """
    if hb.initial is None and hb.subsequent is None:
        return "none (heartbeat checks off)"
    mins = minimums or CalculatedMinimums()
    parts = []
    for name, label, minimum, kind in (("initial", "initial", mins.initial_heartbeat, "initial_heartbeat"),
                                       ("subsequent", "between heartbeats", mins.heartbeat, "heartbeat")):
        value = getattr(hb, name)
        origin = "configured" if value is None else _origin(
            hb.were_calculated, name, raised, minimum, MINIMUM_FIELDS[kind], derivations, value, configured)
        parts.append(f"{label} {seconds_text(value)} ({origin})")
    return ", ".join(parts)


def describe_section_timeouts(
    timeouts: SectionTimeouts, minimums: Optional[CalculatedMinimums] = None, raised: Mapping[str, float] = {},  # noqa: B006
    derivations: Mapping[str, Derivation] = {},  # noqa: B006  (read only)
    configured: Configured = {},  # noqa: B006  (read only)
) -> str:
    """The section timeouts in force, e.g. ``"setup 600 s (configured), step 60.0 s (calculated:
    longest observed 0.028 s x safety factor 5 = 0.14 s, raised to the minimum 60.0 s of
    min_calculated_section_timeout), out-of-section 300 s (configured)"``.

    Args:
        raised: What :func:`bound_section_timeouts` returned.
        derivations: Section name or :data:`OUT_OF_SECTION` -> how the value was just calculated.
        configured: Section name or :data:`OUT_OF_SECTION` -> the configured value (see
            :func:`configured_section_timeouts`), named where a calculated value replaces it.
    """
    mins = minimums or CalculatedMinimums()
    if not timeouts.section and timeouts.out_of_section is None:
        return "none (no sections configured)"
    parts = []
    for name, (value, calculated) in section_snapshot(timeouts).items():
        kind = "out_of_section" if name == OUT_OF_SECTION else "section"
        minimum = mins.out_of_section if name == OUT_OF_SECTION else mins.section
        origin = "configured" if value is None else _origin(
            calculated, name, raised, minimum, MINIMUM_FIELDS[kind], derivations, value, configured)
        parts.append(f"{name} {seconds_text(value)} ({origin})")
    return ", ".join(parts)


def significant_change(before: Optional[Snapshot], after: Snapshot) -> bool:
    """True when ``after`` differs from ``before`` enough for an INFO line.

    A timeout appeared, disappeared, became or stopped being calculated, turned infinite or
    finite, or moved by at least :data:`SIGNIFICANT_CHANGE` of its value.
    """
    if before is None or before.keys() != after.keys():
        return True
    for name, (new, new_calculated) in after.items():
        old, old_calculated = before[name]
        if old_calculated != new_calculated or (old is None) != (new is None):
            return True
        if old is not None and new is not None and abs(new - old) >= SIGNIFICANT_CHANGE * max(old, new):
            return True
    return False


class InForceLog:
    """Logs the timeouts a monitor enforces when they change significantly (else at DEBUG).

    One per client. The INFO line goes out on rank 0 only (the timeouts are the same on every
    rank after a calculation); the other ranks log it at DEBUG.

    Args:
        log: A :class:`~ft_core.client.ranklog.RankLoggerAdapter` (its ``rank_zero_info`` is used).
        minimums: For the "raised to the minimum" words.
        configured: ``"heartbeat"`` / ``"section"`` -> the configured timeouts of that kind (see
            :func:`configured_heartbeat_timeouts`), for the "replaces the configured" words.
    """

    def __init__(self, log: Any, minimums: CalculatedMinimums,
                 configured: Mapping[str, Configured] = {}) -> None:  # noqa: B006  (read only)
        self._log = log
        self._minimums = minimums
        self._configured = configured
        self._logged: dict[str, Snapshot] = {}

    def baseline(self, hb: HeartbeatTimeouts, sections: SectionTimeouts) -> None:
        """The timeouts already reported (e.g. in the connect line): later lines compare to them."""
        self._logged = {"heartbeat": heartbeat_snapshot(hb), "section": section_snapshot(sections)}

    def heartbeats(self, hb: HeartbeatTimeouts, raised: Mapping[str, float], why: str,
                   derivations: Mapping[str, Derivation] = {}) -> None:  # noqa: B006  (read only)
        """Report the heartbeat timeouts in force after ``why`` (e.g. ``"calculated"``)."""
        self._report("heartbeat", heartbeat_snapshot(hb), why,
                     describe_heartbeat_timeouts(hb, self._minimums, raised, derivations,
                                                 self._configured.get("heartbeat", {})))

    def sections(self, timeouts: SectionTimeouts, raised: Mapping[str, float], why: str,
                 derivations: Mapping[str, Derivation] = {}) -> None:  # noqa: B006  (read only)
        """Report the section timeouts in force after ``why``."""
        self._report("section", section_snapshot(timeouts), why,
                     describe_section_timeouts(timeouts, self._minimums, raised, derivations,
                                               self._configured.get("section", {})))

    def _report(self, kind: str, snapshot: Snapshot, why: str, text: str) -> None:
        if significant_change(self._logged.get(kind), snapshot):
            self._logged[kind] = snapshot
            self._log.rank_zero_info("%s timeouts in force (%s): %s", kind, why, text)
        else:
            # short: it comes at every checkpoint on every rank that logs DEBUG
            self._log.debug("%s timeouts %s: no significant change since the last 'in force' line", kind, why)
