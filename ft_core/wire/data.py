"""The public data types of ft_core, at the reference's module path ``ft_core.wire.data``.

Timeout values (:class:`HeartbeatTimeouts`, :class:`SectionTimeouts`), section events
(:class:`SectionAction`) and workload control requests (:class:`WorkloadAction`,
:class:`WorkloadControlRequest`). Standard library only: the rank monitor imports it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ft_core.wire.config import parse_seconds
from ft_core.wire.env import (  # noqa: F401  (the reference exports both here)
    FT_LAUNCHER_IPC_SOCKET_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)


class SectionAction(enum.Enum):
    """A section event for :meth:`ft_core.client.timeouts_calc.TimeoutsCalc.update_on_section_event`."""

    OPEN = 1
    CLOSE = 2
    CLOSE_ALL = 3


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
        calculated_sections: Sections whose timeout comes from observed durations (a set; any
            iterable of names given is turned into one).
        is_out_of_section_calculated: True once ``out_of_section`` was calculated.
    """

    section: dict[str, Optional[float]] = field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: set[str] = field(default_factory=set)
    is_out_of_section_calculated: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.calculated_sections, str):  # "step" would otherwise become {s, t, e, p}
            raise TypeError(f"calculated_sections must be a collection of names, got {self.calculated_sections!r}")
        self.calculated_sections = set(self.calculated_sections)

    @property
    def were_calculated(self) -> bool:
        """True when every section timeout and the out-of-section timeout were calculated."""
        return self.is_out_of_section_calculated and self.calculated_sections >= set(self.section)

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


class WorkloadAction(enum.Enum):
    """What the launcher should do about the workload.

    Attributes:
        Continue: Nothing special; restart on failure as usual.
        ExcludeThisNode: Leave this node out of the next rendezvous (its launcher exits).
        ShutdownWorkload: Stop all workers on all nodes and do not restart.
    """

    Continue = "continue"
    ExcludeThisNode = "exclude_this_node"
    ShutdownWorkload = "shutdown_workload"


@dataclass(frozen=True)
class WorkloadControlRequest:
    """A workload action with a human-readable reason.

    Attributes:
        action: The requested :class:`WorkloadAction`.
        description: Why; shown in the launcher's log and event record.
        only_if_replaceable: Ours, for ``ExcludeThisNode``: leave only when the job can go on
            without this node (a spare node waits to take its place, or ``--nnodes`` MIN allows
            one node fewer); otherwise the launcher keeps the node, says once why, and training
            goes on. The straggler detector's ``"replace"`` action sets it: a slow node is worth
            replacing, not worth ending the job for.
    """

    action: WorkloadAction
    description: str = ""
    only_if_replaceable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.action, WorkloadAction):
            raise TypeError(
                f"action must be a WorkloadAction (e.g. WorkloadAction.ShutdownWorkload), "
                f"got {self.action!r}"
            )
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string, got {self.description!r}")
        if not isinstance(self.only_if_replaceable, bool):
            raise TypeError(f"only_if_replaceable must be True or False, got {self.only_if_replaceable!r}")

    def to_dict(self) -> dict[str, Any]:
        # the key only when set: an older launcher reads the plain request it knows
        out: dict[str, Any] = {"action": self.action.value, "description": self.description}
        if self.only_if_replaceable:
            out["only_if_replaceable"] = True
        return out

    @classmethod
    def from_dict(cls, data: Any) -> WorkloadControlRequest:
        """Parse :meth:`to_dict` output.

        Raises:
            ValueError: Unknown action or wrong types.
        """
        if not isinstance(data, dict):
            raise ValueError("a workload control request must be a JSON object")
        try:
            action = WorkloadAction(data.get("action"))
        except ValueError:
            valid = ", ".join(a.value for a in WorkloadAction)
            raise ValueError(
                f"unknown workload action {data.get('action')!r}; valid: {valid}"
            ) from None
        description = data.get("description", "")
        if not isinstance(description, str):
            raise ValueError("workload control description must be a string")
        conditional = data.get("only_if_replaceable", False)
        if not isinstance(conditional, bool):
            raise ValueError("workload control only_if_replaceable must be true or false")
        return cls(action, description[:2000], conditional)


def _require_mapping(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a mapping, got {type(value).__name__}")


def _optional_timeout(name: str, value: Any) -> Optional[float]:
    # A state file holds JSON numbers: a string here means it was not written by state_dict().
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{name} must be a number of seconds or null, got {value!r}")
    return parse_seconds(name, value)  # its ConfigError is a ValueError


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value
