"""The agent's phase (launcher.agent_phase): the transitions it may make are checked in one place."""

from __future__ import annotations

import pytest

from launcher.agent_phase import AgentPhase, PhaseError

P = AgentPhase

# The runs torch's loop can drive the agent through (see the docstring of launcher.agent_phase).
ALLOWED_PATHS = [
    [P.IDLE, P.STARTING, P.RUNNING, P.SUCCEEDED],
    [P.IDLE, P.STARTING, P.SUCCEEDED],  # workers that end before they connect
    [P.IDLE, P.STARTING, P.RUNNING, P.FAILED, P.STARTING, P.RUNNING, P.FAILED],  # no restart left
    [P.IDLE, P.STARTING, P.FAILED, P.STARTING],  # a failure before every worker connected
    [P.IDLE, P.STARTING, P.RUNNING, P.STARTING, P.RUNNING],  # another node joined: torch restarts
    [P.IDLE, P.STARTING, P.RUNNING, P.WAITING, P.FAILED, P.STARTING],  # min-healthy: too few healthy
    [P.IDLE, P.STARTING, P.RUNNING, P.WAITING, P.STARTING],  # min-healthy: nodes joined
    [P.IDLE, P.STARTING, P.RUNNING, P.SHUTDOWN],
    [P.IDLE, P.STARTING, P.SHUTDOWN],
    [P.IDLE, P.STARTING, P.RUNNING, P.EXCLUDED, P.SHUTDOWN],  # both requests in one batch
]


@pytest.mark.parametrize("path", ALLOWED_PATHS, ids=lambda p: "-".join(x.name for x in p))
def test_the_paths_torchs_loop_takes_are_allowed(path):
    phase = path[0]
    for new in path[1:]:
        phase = phase.check(new)
    assert phase is path[-1]


@pytest.mark.parametrize(("old", "new"), [
    (P.IDLE, P.RUNNING),  # nothing started yet
    (P.IDLE, P.SHUTDOWN),  # requests come from workers
    (P.SUCCEEDED, P.STARTING),  # the end
    (P.SHUTDOWN, P.STARTING),  # a shutdown is never restarted
    (P.SHUTDOWN, P.EXCLUDED),  # ShutdownWorkload wins over ExcludeThisNode, not the other way
    (P.EXCLUDED, P.STARTING),
    (P.WAITING, P.SHUTDOWN),  # requests are not read while waiting
    (P.FAILED, P.RUNNING),
    (P.RUNNING, P.RUNNING),
])
def test_other_transitions_are_refused_naming_both_phases(old, new):
    with pytest.raises(PhaseError, match=f"from {old.name} to {new.name}"):
        old.check(new)


def test_only_the_control_requests_decide_the_run():
    assert {phase for phase in AgentPhase if phase.requested} == {P.SHUTDOWN, P.EXCLUDED}
