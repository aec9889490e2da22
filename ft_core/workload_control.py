"""Requests a rank can send to its launcher to steer the restart loop."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


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
    """

    action: WorkloadAction
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.action, WorkloadAction):
            raise TypeError(
                f"action must be a WorkloadAction (e.g. WorkloadAction.ShutdownWorkload), "
                f"got {self.action!r}"
            )
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string, got {self.description!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "description": self.description}

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
        return cls(action, description[:2000])
