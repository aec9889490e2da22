"""A straggler report as a rank sends it to its node's ``ft_launcher`` (one message per report
interval and node), and its checks.

The launcher writes one ``straggler`` event record per entry. The message is untrusted input from
a worker: every field is type-checked, strings and lists are bounded, and a score must be a finite
number, so a buggy or hostile sender gets an error reply instead of odd records.

Standard library only: the launcher reads it without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SCOPE_RANK = "rank"
SCOPE_NODE = "node"
SCOPES = (SCOPE_RANK, SCOPE_NODE)
ACTIONS = ("report", "stop", "replace")
"""What the detector does about a flagged entry: only report it, stop the job gracefully
(``stop_if_detected``), or have the node leave the job at the next checkpoint."""
MAX_ENTRIES = 256
"""Entries in one message: one node's ranks and the node itself, with room to spare."""
MAX_NAME = 255
"""Longest host name (as ``HOST_NAME_MAX``)."""


@dataclass(frozen=True)
class StragglerEntry:
    """One flagged rank or node of a report.

    Attributes:
        scope: ``rank`` or ``node``.
        rank: The global rank (None for a node entry).
        node: Host name of the rank or node.
        relative: Relative score against the other ranks (1.0 = as fast as the reference the
            detector compares with, lower = slower), or None when not computed.
        individual: Individual score against the rank's (or node's) own best, or None.
        consecutive: Reports in a row (this one included) that flagged it.
        action: One of :data:`ACTIONS`.
    """

    scope: str
    rank: int | None
    node: str
    relative: float | None
    individual: float | None
    consecutive: int = 1
    action: str = "report"

    def to_dict(self) -> dict[str, Any]:
        """The entry as a JSON object (the wire form, read back by :meth:`from_dict`)."""
        return {"scope": self.scope, "rank": self.rank, "node": self.node, "relative": self.relative,
                "individual": self.individual, "consecutive": self.consecutive, "action": self.action}

    @classmethod
    def from_dict(cls, data: Any) -> StragglerEntry:
        """Check and parse one entry.

        Raises:
            ValueError: A field is missing, of the wrong type or out of range (the message says which).
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a straggler entry must be a JSON object, got {type(data).__name__}")
        scope = data.get("scope")
        if scope not in SCOPES:
            raise ValueError(f"straggler entry scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        rank = data.get("rank")
        if scope == SCOPE_RANK and not _is_int(rank, minimum=0):
            raise ValueError(f"a rank entry needs a rank (an integer >= 0), got {rank!r}")
        if scope == SCOPE_NODE and rank is not None:
            raise ValueError(f"a node entry has no rank, got {rank!r}")
        node = data.get("node")
        if not isinstance(node, str) or not 0 < len(node) <= MAX_NAME:
            raise ValueError(f"straggler entry node must be a host name of 1 to {MAX_NAME} characters, got {node!r}")
        consecutive = data.get("consecutive", 1)
        if not _is_int(consecutive, minimum=1):
            raise ValueError(f"straggler entry consecutive must be an integer >= 1, got {consecutive!r}")
        action = data.get("action", "report")
        if action not in ACTIONS:
            raise ValueError(f"straggler entry action must be one of {', '.join(ACTIONS)}, got {action!r}")
        return cls(scope=scope, rank=rank, node=node, relative=_score("relative", data.get("relative")),
                   individual=_score("individual", data.get("individual")), consecutive=consecutive,
                   action=action)


def parse_report(message: Mapping[str, Any]) -> tuple[float, list[StragglerEntry]]:
    """The report interval (seconds) and entries of a straggler report message.

    Raises:
        ValueError: The interval is not a positive finite number, there is no entry list or more
            than :data:`MAX_ENTRIES` entries, or an entry is invalid.
    """
    interval = message.get("interval_s")
    if not _is_number(interval) or not interval > 0:
        raise ValueError(f"straggler report interval_s must be a positive number of seconds, got {interval!r}")
    entries = message.get("entries")
    if not isinstance(entries, list) or not entries:
        raise ValueError("a straggler report needs a non-empty list of entries")
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"a straggler report holds at most {MAX_ENTRIES} entries, got {len(entries)}")
    return float(interval), [StragglerEntry.from_dict(entry) for entry in entries]


def report_message(entries: Sequence[Mapping[str, Any] | StragglerEntry], interval_s: float) -> dict[str, Any]:
    """The message body (without ``type``) for ``entries``, checked as the launcher will check it.

    Raises:
        ValueError: As :func:`parse_report`.
    """
    wire = [entry.to_dict() if isinstance(entry, StragglerEntry) else dict(entry) for entry in entries]
    body = {"interval_s": interval_s, "entries": wire}
    parse_report(body)
    return body


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_number(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # a JSON integer beyond float range
        return False


def _score(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or value < 0:
        raise ValueError(f"straggler entry {name} score must be a finite number >= 0 or null, got {value!r}")
    return float(value)
