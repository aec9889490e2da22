"""Timeout values and the calculator that derives them from observed intervals.

The calculator runs inside each rank. It records the longest interval seen for each kind of
timeout; a new timeout is ``safety_factor`` times that maximum, taken across all ranks (an
all-reduce MAX when a ``torch.distributed`` process group exists) and blended with timeouts
calculated in earlier runs. torch is imported only inside :meth:`TimeoutsCalc.synchronize_all`,
and only if the program already imported it.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ft_core.errors import TimeoutsCalcError

# Weight of the newest calculation when blending with a previously calculated timeout: a
# slower run raises timeouts quickly, a faster one lowers them gradually.
EMA_WEIGHT_OF_NEW = 0.5

MIN_CALCULATED_TIMEOUT = 1.0
"""Calculated timeouts never go below this many seconds. Intervals of a few milliseconds (tiny
steps) would otherwise give timeouts that a GC pause or a busy host exceeds."""

MIN_CALCULATED_INITIAL_TIMEOUT = 10.0
"""The calculated initial heartbeat timeout never goes below this: it covers start-up (imports,
checkpoint loading, process group setup), which varies far more between runs than a step."""

_UNOBSERVED = -1.0


@dataclass
class HeartbeatTimeouts:
    """Heartbeat timeouts in seconds (``None``: infinite).

    Attributes:
        initial: Allowed time from client initialisation to the first heartbeat.
        subsequent: Allowed time between heartbeats.
        were_calculated: True once the values come from observed intervals.
    """

    initial: Optional[float] = None
    subsequent: Optional[float] = None
    were_calculated: bool = False

    @property
    def are_valid(self) -> bool:
        """True when both timeouts are finite, i.e. heartbeat hang detection is active."""
        return self.initial is not None and self.subsequent is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "initial": self.initial,
            "subsequent": self.subsequent,
            "were_calculated": self.were_calculated,
        }

    @classmethod
    def from_dict(cls, data: Any) -> HeartbeatTimeouts:
        """Parse :meth:`to_dict` output.

        Raises:
            ValueError: Wrong schema or values (names the offending key).
        """
        _require_mapping("hb_timeouts", data)
        return cls(
            initial=_optional_timeout("hb_timeouts.initial", data.get("initial")),
            subsequent=_optional_timeout("hb_timeouts.subsequent", data.get("subsequent")),
            were_calculated=_bool("hb_timeouts.were_calculated", data.get("were_calculated", False)),
        )


@dataclass
class SectionTimeouts:
    """Section timeouts in seconds (``None``: infinite).

    Attributes:
        section: Section name to timeout.
        out_of_section: Allowed time with no section open.
        calculated_sections: Sections whose timeout comes from observed durations.
        is_out_of_section_calculated: True once ``out_of_section`` was calculated.
    """

    section: dict[str, Optional[float]] = field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: list[str] = field(default_factory=list)
    is_out_of_section_calculated: bool = False

    @property
    def are_valid(self) -> bool:
        """True when every section timeout and the out-of-section timeout are finite."""
        return self.out_of_section is not None and all(
            value is not None for value in self.section.values()
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "section": dict(self.section),
            "out_of_section": self.out_of_section,
            "calculated_sections": sorted(self.calculated_sections),
            "is_out_of_section_calculated": self.is_out_of_section_calculated,
        }

    @classmethod
    def from_dict(cls, data: Any) -> SectionTimeouts:
        """Parse :meth:`to_dict` output.

        Raises:
            ValueError: Wrong schema or values (names the offending key).
        """
        _require_mapping("section_timeouts", data)
        sections = data.get("section", {})
        _require_mapping("section_timeouts.section", sections)
        parsed = {
            str(name): _optional_timeout(f"section_timeouts.section[{name}]", value)
            for name, value in sections.items()
        }
        calculated = data.get("calculated_sections", [])
        if not isinstance(calculated, list) or not all(isinstance(s, str) for s in calculated):
            raise ValueError("section_timeouts.calculated_sections must be a list of names")
        return cls(
            section=parsed,
            out_of_section=_optional_timeout(
                "section_timeouts.out_of_section", data.get("out_of_section")
            ),
            calculated_sections=list(calculated),
            is_out_of_section_calculated=_bool(
                "section_timeouts.is_out_of_section_calculated",
                data.get("is_out_of_section_calculated", False),
            ),
        )


def blend(
    previous: Optional[float], new: float, previous_was_calculated: bool,
    floor: float = MIN_CALCULATED_TIMEOUT,
) -> float:
    """Merge a newly calculated timeout with the one calculated before (EMA), at least ``floor``."""
    if previous is not None and previous_was_calculated:
        new = EMA_WEIGHT_OF_NEW * new + (1.0 - EMA_WEIGHT_OF_NEW) * previous
    return max(new, floor)


class TimeoutsCalc:
    """Records observed intervals in one rank and turns them into timeouts.

    Call the ``on_*`` methods as events happen (the client does); read timeouts with
    :meth:`heartbeat_timeouts` and :meth:`section_timeouts` after :meth:`synchronize_all`.
    At least one initial and one subsequent heartbeat interval are needed for heartbeat
    timeouts (so two heartbeats), and at least one completed occurrence of each selected section.
    """

    def __init__(
        self,
        section_names: Iterable[str] = (),
        safety_factor: float = 5.0,
        start_time: float | None = None,
    ) -> None:
        self.safety_factor = safety_factor
        self.section_names = tuple(sorted(section_names))
        self.start_time = time.monotonic() if start_time is None else start_time
        self.initial_max = _UNOBSERVED
        self.subsequent_max = _UNOBSERVED
        self.section_max: dict[str, float] = dict.fromkeys(self.section_names, _UNOBSERVED)
        self.out_of_section_max = _UNOBSERVED
        self._prev_heartbeat: float | None = None
        self._out_of_section_since: float | None = self.start_time

    def reset_start_time(self, now: float | None = None) -> None:
        """Restart the clock for the initial heartbeat and the first out-of-section interval."""
        self.start_time = time.monotonic() if now is None else now
        self._prev_heartbeat = None
        self._out_of_section_since = self.start_time

    # Observations -----------------------------------------------------------------

    def on_heartbeat(self, now: float) -> None:
        prev = self._prev_heartbeat
        if prev is None:
            elapsed = now - self.start_time
            if elapsed > self.initial_max:
                self.initial_max = elapsed
        else:
            elapsed = now - prev
            if elapsed > self.subsequent_max:
                self.subsequent_max = elapsed
        self._prev_heartbeat = now

    def on_section_start(self, now: float, first_open: bool) -> None:
        """A section opened; ``first_open`` is True if no other section was open."""
        since = self._out_of_section_since
        if first_open and since is not None:
            elapsed = now - since
            if elapsed > self.out_of_section_max:
                self.out_of_section_max = elapsed
            self._out_of_section_since = None

    def on_section_end(self, name: str, duration: float, now: float, last_closed: bool) -> None:
        """Section ``name`` closed after ``duration``; ``last_closed``: none remain open."""
        if duration > self.section_max[name]:
            self.section_max[name] = duration
        if last_closed:
            self._out_of_section_since = now

    # Results ----------------------------------------------------------------------

    def synchronize_all(self) -> bool:
        """Replace local maxima by the maxima over all ranks, if a process group exists.

        Must be called by every rank of the process group (it is a collective). Does nothing,
        and returns False, when torch was never imported or no process group is initialised.
        """
        if "torch.distributed" not in sys.modules:
            return False
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return False
        values = [self.initial_max, self.subsequent_max, self.out_of_section_max]
        values += [self.section_max[name] for name in self.section_names]
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        reduced = tensor.cpu().tolist()
        self.initial_max, self.subsequent_max, self.out_of_section_max = reduced[:3]
        for name, value in zip(self.section_names, reduced[3:], strict=True):
            self.section_max[name] = value
        return True

    def can_get_hb_timeouts(self) -> bool:
        return self.initial_max > 0 and self.subsequent_max > 0

    def heartbeat_timeouts(self) -> tuple[float, float]:
        """Return ``(initial, subsequent)`` timeouts.

        Raises:
            TimeoutsCalcError: Fewer than two heartbeats were observed.
        """
        if not self.can_get_hb_timeouts():
            raise TimeoutsCalcError(
                "not enough data to calculate heartbeat timeouts: at least two heartbeats must "
                "have been sent since the client was initialised"
            )
        return self.safety_factor * self.initial_max, self.safety_factor * self.subsequent_max

    def missing_sections(self, selected: Iterable[str], calc_out_of_section: bool) -> list[str]:
        """Names (``"out-of-section"`` included) that lack the observations to calculate."""
        missing = [name for name in selected if self.section_max.get(name, _UNOBSERVED) <= 0]
        if calc_out_of_section and self.out_of_section_max <= 0:
            missing.append("out-of-section")
        return missing

    def section_timeouts(
        self, selected: Iterable[str], calc_out_of_section: bool
    ) -> tuple[dict[str, float], Optional[float]]:
        """Return ``({section: timeout}, out_of_section_timeout or None)``.

        Raises:
            TimeoutsCalcError: A selected section (or out-of-section time) was never observed.
        """
        selected = list(selected)
        missing = self.missing_sections(selected, calc_out_of_section)
        if missing:
            raise TimeoutsCalcError(
                "not enough data to calculate timeouts for: " + ", ".join(missing) +
                " (each must have been observed at least once since the client was initialised)"
            )
        sections = {name: self.safety_factor * self.section_max[name] for name in selected}
        oos = self.safety_factor * self.out_of_section_max if calc_out_of_section else None
        return sections, oos


def _require_mapping(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a mapping, got {type(value).__name__}")


def _optional_timeout(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds or null, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float range (JSON has no limit on integers)
        raise ValueError(f"{name} must be a finite number of seconds, got a {value.bit_length()}-bit integer") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return seconds


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
