"""The restart policy's questions, table-driven (no agent, no store); decide's rules are
tests/unit/test_decide.py."""

from __future__ import annotations

import pytest

from ft_core.wire.config import RESTART_POLICIES
from ft_core.wire.restart_policies import RestartPolicyName
from launcher.decision.restart_policy import RestartPolicy

ANY_FAILED, MIN_HEALTHY = RestartPolicyName.ANY_FAILED, RestartPolicyName.MIN_HEALTHY


@pytest.mark.parametrize(
    ("policy", "min_nodes", "healthy", "waits"),
    [(ANY_FAILED, 1, None, False), (ANY_FAILED, 1, 5, False),  # any-failed ignores node health
     (MIN_HEALTHY, 2, 2, True), (MIN_HEALTHY, 2, 3, True),
     (MIN_HEALTHY, 2, 1, False), (MIN_HEALTHY, 2, None, False)],  # too few or unknown: as any-failed
)
def test_a_failure_waits_only_under_min_healthy_with_enough_healthy_nodes(policy, min_nodes, healthy, waits):
    assert RestartPolicy(policy, min_nodes).waits_with(healthy) is waits


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
        RestartPolicy("never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_nodes"):
        RestartPolicy(MIN_HEALTHY, 0)


def test_the_config_names_are_the_policies():
    # one definition: the config's accepted names, the launcher's policies
    assert RESTART_POLICIES == ("any-failed", "min-healthy")
    assert RestartPolicy("min-healthy").name is MIN_HEALTHY  # type: ignore[arg-type]


def test_the_policy_names_are_written_once():
    # A new policy is one member of RestartPolicyName and its rule in launcher/decision/: no
    # other module spells a policy's name (they were in four: restart_policy.py, config.py,
    # membership.py and the agent's checks).
    import ast
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    names = {policy.value for policy in RestartPolicyName}
    spelled = sorted(
        str(path.relative_to(repo)) for package in ("ft_core", "launcher", "ptl_resiliency")
        for path in (repo / package).rglob("*.py")
        if any(isinstance(node, ast.Constant) and node.value in names
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert spelled == ["ft_core/wire/restart_policies.py"]
