"""The restart policy's decisions, table-driven (no agent, no store)."""

from __future__ import annotations

import pytest

from launcher.decision.restart_policy import (
    ANY_FAILED,
    MIN_HEALTHY,
    OUTCOME_EXCLUDED,
    OUTCOME_SHUTDOWN,
    RESTART,
    STOP,
    WAIT,
    RestartPolicy,
    outcome_decision,
)


@pytest.mark.parametrize(
    ("policy", "min_nodes", "remaining", "maximum", "healthy", "action", "text"),
    [
        (ANY_FAILED, 1, 3, 3, None, RESTART, "restarting the worker group (restart 1/3)"),
        (ANY_FAILED, 1, 1, 3, None, RESTART, "restart 3/3"),
        (ANY_FAILED, 1, 0, 3, None, STOP, "no restarts left (--max-restarts=3); stopping"),
        # any-failed ignores node health even when it is known
        (ANY_FAILED, 1, 2, 2, 5, RESTART, "restart 1/2"),
        # min-healthy: enough healthy nodes -> wait, even without restarts left
        (MIN_HEALTHY, 2, 0, 3, 2, WAIT, "min-healthy: 2 healthy node(s) >= minimum 2"),
        (MIN_HEALTHY, 2, 3, 3, 3, WAIT, "this node's workers are not restarted for now"),
        # too few healthy nodes, or unknown: as any-failed
        (MIN_HEALTHY, 2, 3, 3, 1, RESTART, "restart 1/3"),
        (MIN_HEALTHY, 2, 3, 3, None, RESTART, "restart 1/3"),
        (MIN_HEALTHY, 2, 0, 3, 1, STOP, "no restarts left"),
    ],
)
def test_decision_after_a_failure(policy, min_nodes, remaining, maximum, healthy, action, text):
    decision = RestartPolicy(policy, min_nodes).on_failure(
        remaining_restarts=remaining, max_restarts=maximum, healthy_nodes=healthy)
    assert decision.action == action
    assert text in decision.text


@pytest.mark.parametrize(
    ("policy", "world", "expected"),
    [(ANY_FAILED, 4, False), (MIN_HEALTHY, 1, False), (MIN_HEALTHY, None, False), (MIN_HEALTHY, 2, True)],
)
def test_node_health_is_checked_only_by_min_healthy_on_several_nodes(policy, world, expected):
    assert RestartPolicy(policy, 1).checks_node_health(world) is expected


@pytest.mark.parametrize(("healthy", "restart"), [(3, False), (2, False), (1, True), (0, True), (None, False)])
def test_while_waiting_restart_once_too_few_nodes_are_healthy(healthy, restart):
    assert RestartPolicy(MIN_HEALTHY, 2).restart_while_waiting(healthy) is restart


def test_invalid_policies_are_refused():
    with pytest.raises(ValueError, match="'never'"):
        RestartPolicy("never")
    with pytest.raises(ValueError, match="min_nodes"):
        RestartPolicy(MIN_HEALTHY, 0)


def test_outcome_decisions():
    assert "no restart" in outcome_decision(OUTCOME_SHUTDOWN)
    assert "leaving the job" in outcome_decision(OUTCOME_EXCLUDED)
    with pytest.raises(ValueError):
        outcome_decision("other")
