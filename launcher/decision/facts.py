"""What the launcher knows when it decides after a cycle: :class:`CycleFacts`, one typed value.

The agent gathers the facts (torch's failures and restart counter, the monitors' reports, the
views the nodes exchanged, the healthy nodes, the crash-loop guard's verdict, the workload
control requests) and :func:`launcher.decision.decide.decide` turns them into one
:class:`~launcher.decision.decide.Decision`. Nothing here reads a clock, a socket or a store.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.decision.crash_loop import CrashLoopVerdict
from launcher.decision.culprit import ROOT
from launcher.decision.failures import FailureRecord
from launcher.decision.restart_policy import RestartPolicy


class WorkloadRequest(enum.Enum):
    """A workload control request that decides how this node's run ends."""

    SHUTDOWN = "shutdown"
    """``ShutdownWorkload``, from a rank of this node or learnt from another node."""
    EXCLUDE = "exclude"
    """``ExcludeThisNode`` from a rank of this node."""
    REPLACE = "replace"
    """``ExcludeThisNode`` only if the job can go on without this node (``only_if_replaceable``:
    the straggler detector's replace action)."""


@dataclass(frozen=True)
class CycleFacts:
    """The facts of one decision point of a cycle.

    Attributes:
        policy: The node's restart policy (its name and the minimum of ``--nnodes``).
        remaining_restarts: Restarts ``--max-restarts`` still allows (torch's counter).
        max_restarts: ``--max-restarts``.
        no_restart_exit_code: The exit code for a failure that repeats (``--ft-no-restart-exit-code``).
        request: A workload control request that decided the run, None without one.
        request_cause: Who asked for ``request`` and why (the stop line says it).
        waiting: This node already waits under min-healthy (no new failure: the re-check of the
            healthy nodes).
        records: This node's failure records of the cycle, the root first (made from torch's
            failures, the monitors' reports and the views every node exchanged); empty at a
            request or a re-check.
        healthy_nodes: Under min-healthy on several nodes, the nodes still healthy (this one
            counted as unhealthy once its cycle failed); None when not counted or unknown.
        crash_loop: The crash-loop guard's verdict on this cycle (from its history of failed
            cycles); None when the cycle has no root.
        group_world_size: At a replace request: the nodes of this round; None otherwise.
        spares_waiting: At a replace request: the nodes waiting in the rendezvous that are not
            members of this round (spares); None when not read or not known.
    """

    policy: RestartPolicy
    remaining_restarts: int
    max_restarts: int
    no_restart_exit_code: int
    request: WorkloadRequest | None = None
    request_cause: str = ""
    waiting: bool = False
    records: Sequence[FailureRecord] = ()
    healthy_nodes: int | None = None
    crash_loop: CrashLoopVerdict | None = None
    group_world_size: int | None = None
    spares_waiting: int | None = None

    @property
    def root_is_here(self) -> bool:
        """The cycle's root failure was one of this node's ranks."""
        return bool(self.records) and self.records[0].role == ROOT
