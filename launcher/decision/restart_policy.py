"""What happens after a failure: restart, stop, or (min-healthy) wait while enough nodes run.

Pure decisions; the agent supplies the facts (restarts left, healthy nodes counted through
:class:`launcher.rendezvous.store_channel.StoreChannel`) and carries the decision out.

- ``any-failed`` (default): any failed worker restarts the worker group on every node, through
  the rendezvous, while ``--max-restarts`` allows.
- ``min-healthy``: on a multi-node job, a node whose worker failed stops its workers and waits
  while at least the minimum of ``--nnodes`` nodes are healthy; when fewer are, it restarts.

A workload control request overrides both: ``ShutdownWorkload`` stops every node for good,
``ExcludeThisNode`` makes this node leave the job (see :func:`outcome_decision`).
"""

from __future__ import annotations

from dataclasses import dataclass

ANY_FAILED = "any-failed"
MIN_HEALTHY = "min-healthy"
POLICIES = (ANY_FAILED, MIN_HEALTHY)

RESTART = "restart"
STOP = "stop"
WAIT = "wait"

OUTCOME_SHUTDOWN = "shutdown_requested"
"""A rank (on any node) requested ``ShutdownWorkload``."""
OUTCOME_EXCLUDED = "node_excluded"
"""A rank on this node requested ``ExcludeThisNode``."""
OUTCOME_REPEATED = "repeated_failure"
"""The same failure ended ``max_no_progress_cycles`` cycles without progress (:mod:`launcher.decision.crash_loop`)."""


@dataclass(frozen=True)
class Decision:
    """What to do after a failure, and the text every failure record of it carries."""

    action: str
    text: str


@dataclass(frozen=True)
class RestartPolicy:
    """The node's restart policy.

    Args:
        name: ``any-failed`` or ``min-healthy`` (the ``restart_policy`` config field).
        min_nodes: The minimum of ``--nnodes``.

    Raises:
        ValueError: Unknown policy name or ``min_nodes`` below 1.
    """

    name: str = ANY_FAILED
    min_nodes: int = 1

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"restart policy must be one of {', '.join(POLICIES)}, got {self.name!r}")
        if self.min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {self.min_nodes}")

    def checks_node_health(self, group_world_size: int | None) -> bool:
        """True if a failure here must first be published and the healthy nodes counted."""
        return self.name == MIN_HEALTHY and (group_world_size or 0) > 1

    def on_failure(self, *, remaining_restarts: int, max_restarts: int,
                   healthy_nodes: int | None = None) -> Decision:
        """The decision after a failure on this node.

        Args:
            remaining_restarts: Restarts ``--max-restarts`` still allows.
            max_restarts: ``--max-restarts``.
            healthy_nodes: With :meth:`checks_node_health`, the nodes still healthy (this one
                already counted as unhealthy); None when not counted or unknown.
        """
        if self.name == MIN_HEALTHY and healthy_nodes is not None and healthy_nodes >= self.min_nodes:
            return Decision(WAIT, f"min-healthy: {healthy_nodes} healthy node(s) >= minimum {self.min_nodes}; "
                                  "this node's workers are not restarted for now")
        if remaining_restarts > 0:
            done = max_restarts - remaining_restarts + 1
            return Decision(RESTART, f"restarting the worker group (restart {done}/{max_restarts})")
        return Decision(STOP, f"no restarts left (--max-restarts={max_restarts}); stopping")

    def restart_while_waiting(self, healthy_nodes: int | None) -> bool:
        """While this node waits (min-healthy): True once too few nodes are healthy.

        An unknown count (the store cannot be read) keeps waiting; the next check decides.
        """
        return healthy_nodes is not None and healthy_nodes < self.min_nodes


def outcome_decision(outcome: str) -> str:
    """The decision text for a workload control outcome (:data:`OUTCOME_SHUTDOWN` or
    :data:`OUTCOME_EXCLUDED`)."""
    if outcome == OUTCOME_SHUTDOWN:
        return "ShutdownWorkload requested: stopping all workers, no restart"
    if outcome == OUTCOME_EXCLUDED:
        return "ExcludeThisNode requested: stopping this node's workers and leaving the job"
    raise ValueError(f"unknown outcome {outcome!r}")
