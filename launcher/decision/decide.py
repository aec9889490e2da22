"""The launcher's decision at a failure, a workload control request or a min-healthy re-check.

:func:`decide` is the one place that says what happens: a pure function of
:class:`~launcher.decision.facts.CycleFacts` that returns a :class:`Decision` (the action, the
exit code when the run ends, the one-line reason every failure record and stop line carries).
The rules, first match wins:

1. ``ShutdownWorkload`` requested (here or on another node): stop every node, exit 64.
2. ``ExcludeThisNode`` requested here: this node leaves the job, exit 65. A replace request
   (``only_if_replaceable``, the straggler detector's replace action) leaves only when the job
   can go on without this node (:meth:`RestartPolicy.can_lose_a_node`: a spare waits, or
   ``--nnodes`` MIN allows one node fewer, as for rule 5); otherwise the node stays and its
   workers go on (KEEP, the reason says why).
3. min-healthy re-check while this node waits: restart once fewer nodes than the minimum are
   healthy, else keep waiting.
4. The same failure repeats without progress (:mod:`launcher.decision.crash_loop`): stop, exit
   ``no_restart_exit_code`` (66).
5. The repeat had every root on this node and the job can go on without it: this node leaves,
   exit 65 (the other nodes get rule 6, their reason prefixed with the guard's sentence).
6. The restart policy (:mod:`launcher.decision.restart_policy`): min-healthy waits while enough
   nodes are healthy; otherwise restart while ``--max-restarts`` allows, else stop (exit 1).

The agent carries a decision out (``FaultTolerantAgent._steer_torch``); ``launch.py`` takes the
exit code and the result's outcome of a run this node ended itself from :attr:`Decision.outcome`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from launcher import exit_codes
from launcher.decision.facts import CycleFacts, WorkloadRequest
from launcher.decision.restart_policy import RestartPolicy

OUTCOME_SHUTDOWN = "shutdown_requested"
"""The result's outcome: a rank (on any node) requested ``ShutdownWorkload``."""
OUTCOME_EXCLUDED = "node_excluded"
"""The result's outcome: this node left the job (``ExcludeThisNode`` or a repeat on this node)."""
OUTCOME_REPEATED = "repeated_failure"
"""The result's outcome: the same failure ended ``max_no_progress_cycles`` cycles without progress."""
OUTCOME_FAILED = "failed"
"""The result's outcome: the workers failed and no restart was left."""


class Action(enum.Enum):
    """What the launcher does after a decision point."""

    RESTART = "restart"
    """torch's loop restarts the worker group (through the rendezvous, every node)."""
    WAIT = "wait"
    """min-healthy: this node's workers stay stopped; it waits while enough nodes are healthy."""
    STOP = "stop"
    """No restart left: torch's loop stops the workers; exit 1."""
    LEAVE = "leave"
    """This node leaves the job (its workers killed, the rendezvous left open); exit 65."""
    REPEATED = "repeated"
    """The failure repeats without progress: stop, no restart; exit ``no_restart_exit_code``."""
    SHUTDOWN = "shutdown"
    """ShutdownWorkload: every node stops, no restart; exit 64."""
    KEEP = "keep"
    """A replace request refused: the job cannot go on without this node; its workers go on."""

    @property
    def overrides_restarts(self) -> bool:
        """The run ends whatever restarts torch's counter still allows."""
        return self in (Action.LEAVE, Action.REPEATED, Action.SHUTDOWN)


_OUTCOMES = {Action.STOP: OUTCOME_FAILED, Action.LEAVE: OUTCOME_EXCLUDED, Action.REPEATED: OUTCOME_REPEATED,
             Action.SHUTDOWN: OUTCOME_SHUTDOWN}


@dataclass(frozen=True)
class Decision:
    """What to do, and why.

    Attributes:
        action: What the launcher does.
        reason: The one line every failure record of the cycle carries (or the stop line of a
            request that met running workers).
        exit_code: The launcher's exit code when the action ends the run, None while it goes on.
        cause: For a request or a node that leaves: who asked, or what made it leave (the stop
            line and the view this node publishes as it leaves); empty otherwise.
    """

    action: Action
    reason: str
    exit_code: int | None = None
    cause: str = ""

    @property
    def outcome(self) -> str | None:
        """The outcome the result record and the result file get when this ends the run, else None."""
        return _OUTCOMES.get(self.action)


SHUTDOWN_REASON = "ShutdownWorkload requested: stopping all workers, no restart"
EXCLUDE_REASON = "ExcludeThisNode requested: stopping this node's workers and leaving the job"
KEPT_SUFFIX = "training goes on"
"""The end of a refused replace request's reason."""


def decide(facts: CycleFacts) -> Decision:
    """The decision for ``facts`` (see the module docstring for the rules, in order)."""
    if facts.request is WorkloadRequest.SHUTDOWN:
        return Decision(Action.SHUTDOWN, SHUTDOWN_REASON, exit_codes.EXIT_SHUTDOWN_REQUESTED, facts.request_cause)
    if facts.request is WorkloadRequest.EXCLUDE:
        return Decision(Action.LEAVE, EXCLUDE_REASON, exit_codes.EXIT_NODE_EXCLUDED, facts.request_cause)
    if facts.request is WorkloadRequest.REPLACE:
        return _replace(facts)
    policy = facts.policy
    if facts.waiting:
        return _recheck(policy, facts.healthy_nodes)
    verdict = facts.crash_loop
    if verdict is not None and verdict.stop:
        # Every node chose the same root from the same views, so every node stops here too.
        return Decision(Action.REPEATED, verdict.text, facts.no_restart_exit_code)
    prefix = ""
    if verdict is not None and verdict.exclude is not None:
        if facts.root_is_here:
            # Every node reached this verdict alike; this node is the one it names.
            return Decision(Action.LEAVE, f"{verdict.text}: this node leaves the job (exit "
                            f"{exit_codes.EXIT_NODE_EXCLUDED}, as for ExcludeThisNode)",
                            exit_codes.EXIT_NODE_EXCLUDED, verdict.text)
        prefix = f"{verdict.text}; "
    return _by_policy(facts, prefix)


def _replace(facts: CycleFacts) -> Decision:
    """Rule 2, a replace request: leave when the job can go on without this node, else keep it."""
    policy, nodes, spares = facts.policy, facts.group_world_size or 1, facts.spares_waiting
    if policy.can_lose_a_node(nodes, spares):
        why = (f"{spares} spare node(s) wait to take its place" if spares else
               f"--nnodes MIN {policy.min_nodes} allows one node fewer than this round's {nodes}")
        return Decision(Action.LEAVE, f"{EXCLUDE_REASON} ({why})", exit_codes.EXIT_NODE_EXCLUDED,
                        facts.request_cause)
    no_spare = "no spare node waits" if spares is not None else "no spare node is known to wait"
    return Decision(Action.KEEP, f"{facts.request_cause}: not replaced: {no_spare} and --nnodes allows no fewer "
                                 f"than this job's {nodes} node(s) (MIN {policy.min_nodes}); {KEPT_SUFFIX}",
                    cause=facts.request_cause)


def _recheck(policy: RestartPolicy, healthy: int | None) -> Decision:
    """Rule 3: while this node waits under min-healthy."""
    if policy.restart_while_waiting(healthy):
        return Decision(Action.RESTART, f"min-healthy: only {healthy} healthy node(s) left (< {policy.min_nodes}); "
                                        "restarting the workload")
    # An unknown count (the store cannot be read) keeps waiting; the next check decides.
    return Decision(Action.WAIT, f"min-healthy: still waiting ({healthy} healthy node(s), minimum {policy.min_nodes})")


def _by_policy(facts: CycleFacts, prefix: str) -> Decision:
    """Rule 6: the restart policy and torch's restart counter."""
    policy, healthy = facts.policy, facts.healthy_nodes
    if policy.waits_with(healthy):
        return Decision(Action.WAIT, f"{prefix}min-healthy: {healthy} healthy node(s) >= minimum "
                                     f"{policy.min_nodes}; this node's workers are not restarted for now")
    if facts.remaining_restarts > 0:
        done = facts.max_restarts - facts.remaining_restarts + 1
        return Decision(Action.RESTART, f"{prefix}restarting the worker group (restart {done}/{facts.max_restarts})")
    return Decision(Action.STOP, f"{prefix}no restarts left (--max-restarts={facts.max_restarts}); stopping",
                    exit_codes.EXIT_FAILURE)
