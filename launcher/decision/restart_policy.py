"""The node's restart policy: its name and the minimum of ``--nnodes``, and what each policy means.

The names are :class:`ft_core.wire.restart_policies.RestartPolicyName` (defined once, for the
config too); the decision after a failure is :func:`launcher.decision.decide.decide`, which asks
the policy the two questions that differ between policies:

- ``any-failed`` (default): any failed worker restarts the worker group on every node, through
  the rendezvous, while ``--max-restarts`` allows.
- ``min-healthy``: on a multi-node job, a node whose worker failed stops its workers and waits
  while at least the minimum of ``--nnodes`` nodes are healthy (counted through
  :class:`launcher.rendezvous.store_channel.StoreChannel`); when fewer are, it restarts.

A workload control request overrides both (``ShutdownWorkload``, ``ExcludeThisNode``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ft_core.wire.restart_policies import POLICY_NAMES, RestartPolicyName


@dataclass(frozen=True)
class RestartPolicy:
    """The node's restart policy.

    Args:
        name: The policy (a :class:`RestartPolicyName` or its name, the ``restart_policy``
            config field; kept as the member).
        min_nodes: The minimum of ``--nnodes``.

    Raises:
        ValueError: Unknown policy name or ``min_nodes`` below 1.
    """

    name: RestartPolicyName = RestartPolicyName.ANY_FAILED
    min_nodes: int = 1

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "name", RestartPolicyName(self.name))
        except ValueError:
            raise ValueError(f"restart policy must be one of {', '.join(POLICY_NAMES)}, got {self.name!r}") from None
        if self.min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {self.min_nodes}")

    def checks_node_health(self, group_world_size: int | None) -> bool:
        """True if a failure here must first be published and the healthy nodes counted."""
        return self.name is RestartPolicyName.MIN_HEALTHY and (group_world_size or 0) > 1

    def waits_with(self, healthy_nodes: int | None) -> bool:
        """After a failure here: True if this node waits instead of restarting, with
        ``healthy_nodes`` still healthy (None: not counted or unknown, no wait)."""
        return (self.name is RestartPolicyName.MIN_HEALTHY and healthy_nodes is not None
                and healthy_nodes >= self.min_nodes)

    def can_lose_a_node(self, group_world_size: int | None, spares_waiting: int | None = None) -> bool:
        """Whether the job can go on without one of its ``group_world_size`` nodes: a spare node
        waits to take its place, or one node fewer still makes a round (``--nnodes`` MIN).

        The one test of "the job can go on without this node": the crash-loop guard asks it
        before it makes a node leave instead of stopping, the launcher before it grants the
        straggler detector's replace request (``None`` spares: not known, counted as none).
        """
        return bool(spares_waiting) or (group_world_size or 1) - 1 >= self.min_nodes

    def restart_while_waiting(self, healthy_nodes: int | None) -> bool:
        """While this node waits (min-healthy): True once too few nodes are healthy.

        An unknown count (the store cannot be read) keeps waiting; the next check decides.
        """
        return healthy_nodes is not None and healthy_nodes < self.min_nodes
