"""launcher.decision.decide: the launcher's decision after a failure, table by table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ft_core.wire.restart_policies import RestartPolicyName
from launcher import exit_codes
from launcher.decision.crash_loop import CrashLoopVerdict, CycleFailure, Fingerprint
from launcher.decision.culprit import COLLATERAL, ROOT
from launcher.decision.decide import (
    EXCLUDE_REASON,
    OUTCOME_EXCLUDED,
    OUTCOME_FAILED,
    OUTCOME_REPEATED,
    OUTCOME_SHUTDOWN,
    SHUTDOWN_REASON,
    Action,
    Decision,
    decide,
)
from launcher.decision.facts import CycleFacts, WorkloadRequest
from launcher.decision.failures import KIND_EXIT, FailureRecord
from launcher.decision.restart_policy import RestartPolicy

REPO = Path(__file__).resolve().parents[2]
ANY = RestartPolicy(RestartPolicyName.ANY_FAILED, 1)
MIN2 = RestartPolicy(RestartPolicyName.MIN_HEALTHY, 2)
FP = Fingerprint("crash", "exit code 1: ValueError: bad shard", "train.py step")
RUN = (CycleFailure(0, FP, 5, "node2 (group rank 1)"), CycleFailure(1, FP, 5, "node2 (group rank 1)"))
STOP_TEXT = "the same failure (...) ended cycles 0, 1 at step 5 without progress: not restarting"
LEAVE_TEXT = "the same failure (...) ended cycles 0, 1, each time with its root on node node2 (group rank 1)"
REPEAT_STOP = CrashLoopVerdict(True, RUN, STOP_TEXT)
REPEAT_LEAVE = CrashLoopVerdict(False, RUN, LEAVE_TEXT, exclude="node2 (group rank 1)")
NO_REPEAT = CrashLoopVerdict(False, RUN[-1:])


def record(role: str) -> FailureRecord:
    return FailureRecord(cycle=1, rank=0, local_rank=0, pid=11, cause="exit code 1", kind=KIND_EXIT,
                         detected_at=1.0, role=role, fingerprint=FP, root_step=5)


SLOW = "rank 1 (pid 9) requested ExcludeThisNode: straggler: node b flagged in 2 straggler reports in a row"
ROOT_HERE = (record(ROOT),)
ROOT_ELSEWHERE = (record(COLLATERAL),)


def facts(policy: RestartPolicy = ANY, remaining: int = 3, maximum: int = 3, code: int = 66,
          **more: object) -> CycleFacts:
    return CycleFacts(policy=policy, remaining_restarts=remaining, max_restarts=maximum, no_restart_exit_code=code,
                      **more)  # type: ignore[arg-type]


# (name, facts) -> (action, exit code, reason, cause)
DECIDE_ROWS = [
    ("shutdown requested, beats a repeat",
     facts(request=WorkloadRequest.SHUTDOWN, request_cause="rank 1 (pid 7) requested ShutdownWorkload: done",
           records=ROOT_HERE, crash_loop=REPEAT_STOP),
     (Action.SHUTDOWN, 64, SHUTDOWN_REASON, "rank 1 (pid 7) requested ShutdownWorkload: done")),
    ("shutdown requested, no restarts left", facts(remaining=0, request=WorkloadRequest.SHUTDOWN, request_cause="x"),
     (Action.SHUTDOWN, 64, SHUTDOWN_REASON, "x")),
    ("exclude requested",
     facts(request=WorkloadRequest.EXCLUDE, request_cause="rank 3 (pid 9) requested ExcludeThisNode: bad GPU"),
     (Action.LEAVE, 65, EXCLUDE_REASON, "rank 3 (pid 9) requested ExcludeThisNode: bad GPU")),
    # issue 31 item 2: the straggler detector's replace request leaves only when the job can go on
    ("replace: a spare waits at --nnodes MIN",
     facts(MIN2, request=WorkloadRequest.REPLACE, request_cause=SLOW, group_world_size=2, spares_waiting=1),
     (Action.LEAVE, 65, f"{EXCLUDE_REASON} (1 spare node(s) wait to take its place)", SLOW)),
    ("replace: MIN allows one node fewer", facts(request=WorkloadRequest.REPLACE, request_cause=SLOW,
                                                 group_world_size=2, spares_waiting=0),
     (Action.LEAVE, 65, f"{EXCLUDE_REASON} (--nnodes MIN 1 allows one node fewer than this round's 2)", SLOW)),
    ("replace: no spare, MIN is the round's size: kept",
     facts(MIN2, request=WorkloadRequest.REPLACE, request_cause=SLOW, group_world_size=2, spares_waiting=0),
     (Action.KEEP, None, f"{SLOW}: not replaced: no spare node waits and --nnodes allows no fewer than this job's "
      f"2 node(s) (MIN 2); training goes on", SLOW)),
    ("replace: spares not known, a single node: kept",
     facts(request=WorkloadRequest.REPLACE, request_cause=SLOW, group_world_size=1),
     (Action.KEEP, None, f"{SLOW}: not replaced: no spare node is known to wait and --nnodes allows no fewer than "
      f"this job's 1 node(s) (MIN 1); training goes on", SLOW)),
    ("min-healthy re-check: too few healthy nodes", facts(MIN2, waiting=True, healthy_nodes=1),
     (Action.RESTART, None, "min-healthy: only 1 healthy node(s) left (< 2); restarting the workload", "")),
    ("min-healthy re-check: none healthy, no restarts left", facts(MIN2, remaining=0, waiting=True, healthy_nodes=0),
     (Action.RESTART, None, "min-healthy: only 0 healthy node(s) left (< 2); restarting the workload", "")),
    ("min-healthy re-check: enough healthy nodes", facts(MIN2, waiting=True, healthy_nodes=2),
     (Action.WAIT, None, "min-healthy: still waiting (2 healthy node(s), minimum 2)", "")),
    ("min-healthy re-check: count unknown keeps waiting", facts(MIN2, waiting=True, healthy_nodes=None),
     (Action.WAIT, None, "min-healthy: still waiting (None healthy node(s), minimum 2)", "")),
    ("repeated failure stops, restarts left or not", facts(records=ROOT_HERE, crash_loop=REPEAT_STOP),
     (Action.REPEATED, 66, STOP_TEXT, "")),
    ("repeated failure: --ft-no-restart-exit-code", facts(code=42, records=ROOT_ELSEWHERE, crash_loop=REPEAT_STOP),
     (Action.REPEATED, 42, STOP_TEXT, "")),
    ("repeated failure beats min-healthy's wait",
     facts(MIN2, records=ROOT_HERE, healthy_nodes=3, crash_loop=REPEAT_STOP),
     (Action.REPEATED, 66, STOP_TEXT, "")),
    ("crash-loop exclusion: this node is the root, it leaves", facts(records=ROOT_HERE, crash_loop=REPEAT_LEAVE),
     (Action.LEAVE, 65, f"{LEAVE_TEXT}: this node leaves the job (exit 65, as for ExcludeThisNode)", LEAVE_TEXT)),
    ("crash-loop exclusion: another node leaves, this one restarts",
     facts(remaining=2, records=ROOT_ELSEWHERE, crash_loop=REPEAT_LEAVE),
     (Action.RESTART, None, f"{LEAVE_TEXT}; restarting the worker group (restart 2/3)", "")),
    ("crash-loop exclusion: another node leaves, none left here",
     facts(remaining=0, records=ROOT_ELSEWHERE, crash_loop=REPEAT_LEAVE),
     (Action.STOP, 1, f"{LEAVE_TEXT}; no restarts left (--max-restarts=3); stopping", "")),
    ("min-healthy: enough healthy nodes, wait", facts(MIN2, records=ROOT_HERE, healthy_nodes=2, crash_loop=NO_REPEAT),
     (Action.WAIT, None, "min-healthy: 2 healthy node(s) >= minimum 2; this node's workers are not restarted "
      "for now", "")),
    ("min-healthy: waits even without restarts left", facts(MIN2, remaining=0, records=ROOT_HERE, healthy_nodes=3),
     (Action.WAIT, None, "min-healthy: 3 healthy node(s) >= minimum 2; this node's workers are not restarted "
      "for now", "")),
    ("min-healthy: too few healthy nodes, restart", facts(MIN2, records=ROOT_HERE, healthy_nodes=1),
     (Action.RESTART, None, "restarting the worker group (restart 1/3)", "")),
    ("min-healthy: count unknown, restart", facts(MIN2, records=ROOT_HERE, healthy_nodes=None),
     (Action.RESTART, None, "restarting the worker group (restart 1/3)", "")),
    ("any-failed ignores the healthy nodes", facts(ANY, remaining=1, records=ROOT_HERE, healthy_nodes=5),
     (Action.RESTART, None, "restarting the worker group (restart 3/3)", "")),
    ("restart with restarts left", facts(remaining=2, records=ROOT_HERE, crash_loop=NO_REPEAT),
     (Action.RESTART, None, "restarting the worker group (restart 2/3)", "")),
    ("stop with none left", facts(remaining=0, records=ROOT_HERE, crash_loop=NO_REPEAT),
     (Action.STOP, 1, "no restarts left (--max-restarts=3); stopping", "")),
    ("no root (worker group unhealthy): the policy decides", facts(remaining=0, maximum=0),
     (Action.STOP, 1, "no restarts left (--max-restarts=0); stopping", "")),
]


@pytest.mark.parametrize(("name", "cycle_facts", "expected"), DECIDE_ROWS, ids=[row[0] for row in DECIDE_ROWS])
def test_decide(name, cycle_facts, expected):
    decision = decide(cycle_facts)
    assert (decision.action, decision.exit_code, decision.reason, decision.cause) == expected
    assert decide(cycle_facts) == decision  # pure: the same facts, the same decision


@pytest.mark.parametrize(
    ("action", "outcome", "overrides"),
    [(Action.RESTART, None, False), (Action.WAIT, None, False), (Action.STOP, OUTCOME_FAILED, False),
     (Action.LEAVE, OUTCOME_EXCLUDED, True), (Action.REPEATED, OUTCOME_REPEATED, True),
     (Action.SHUTDOWN, OUTCOME_SHUTDOWN, True), (Action.KEEP, None, False)],
)
def test_the_result_outcome_of_each_action(action, outcome, overrides):
    assert Decision(action, "why").outcome == outcome
    assert action.overrides_restarts is overrides


def test_a_stop_agrees_with_torchs_counter():
    # RESTART and STOP reach torch alike (a failed cycle); torch restarts while its counter
    # allows. decide must say STOP exactly when the counter is at 0, or the lines would lie.
    for remaining in range(4):
        action = decide(facts(remaining=remaining, records=ROOT_HERE)).action
        assert action is (Action.STOP if remaining == 0 else Action.RESTART)


def test_exit_codes_are_the_launchers():
    assert decide(facts(request=WorkloadRequest.SHUTDOWN)).exit_code == exit_codes.EXIT_SHUTDOWN_REQUESTED
    assert decide(facts(request=WorkloadRequest.EXCLUDE)).exit_code == exit_codes.EXIT_NODE_EXCLUDED
    assert decide(facts(remaining=0)).exit_code == exit_codes.EXIT_FAILURE


# ---------------------------------------------------------------------------- the agent acts in one place


def _agent_methods() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((REPO / "launcher" / "agent.py").read_text(encoding="utf-8"))
    agent = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FaultTolerantAgent")
    return {n.name: n for n in agent.body if isinstance(n, ast.FunctionDef)}


def test_only_one_method_of_the_agent_steers_torchs_restart_counter():
    # torch's loop stops instead of restarting when _remaining_restarts is 0: the agent sets it
    # in one place, the translation of a Decision (it was set in three places).
    writers = {name for name, method in _agent_methods().items() for node in ast.walk(method)
               if isinstance(node, (ast.Assign, ast.AugAssign))
               and any(isinstance(t, ast.Attribute) and t.attr == "_remaining_restarts"
                       for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))}
    assert writers == {"_steer_torch"}


def test_no_decision_is_made_outside_decide():
    # The agent reads no crash-loop verdict and asks the restart policy nothing: decide does.
    source = (REPO / "launcher" / "agent.py").read_text(encoding="utf-8")
    for leftover in (".on_failure(", "verdict", "restart_while_waiting", "outcome_decision"):
        assert leftover not in source, leftover


# Issue 31 item 5: torch's failures of two cycles -> records -> the crash-loop guard -> decide.
def _cycle_decision(guard, cycle: int, exitcode: int, step: int, remaining: int) -> Decision:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ft_core.wire.messages import Progress, ProgressReport
    from launcher.decision.failures import Evidence, failure_records

    failures = {1: ProcessFailure(local_rank=1, pid=700 + cycle, exitcode=exitcode, error_file="<N/A>"),
                0: ProcessFailure(local_rank=0, pid=600 + cycle, exitcode=-15, error_file="<N/A>")}
    report = ProgressReport(progress=Progress(last_progress_at=1.0, step=step))
    records = failure_records(failures, local_ranks={0: 0, 1: 1}, hangs={}, stopped_by_us={600 + cycle}, cycle=cycle,
                              now=10.0 + cycle, evidence=Evidence(node="n1", group_rank=0, reports={1: report}))
    first = records[0]
    verdict = guard.on_failure(CycleFailure(cycle, first.fingerprint, first.root_step, "n1",
                                            first.root_before_first_step, first.root_from_outside))
    return decide(facts(remaining=remaining, maximum=5, records=tuple(records), crash_loop=verdict))


@pytest.mark.parametrize(("exitcode", "expected"), [  # torch's exit code: -N for signal N
    # SIGKILL from outside at steps 25 and 23 with 4 restarts left: restarted, bounded by --max-restarts
    (-9, [(Action.RESTART, None), (Action.RESTART, None)]),
    (-15, [(Action.RESTART, None), (Action.RESTART, None)]),
    (137, [(Action.RESTART, None), (Action.RESTART, None)]),
    # the rank's own fault signal at the same place is a repeat: stop, exit 66
    (-11, [(Action.RESTART, None), (Action.REPEATED, 66)]),
])
def test_kills_from_outside_are_restarted_not_stopped_as_a_repeat(exitcode, expected):
    from launcher.decision.crash_loop import CrashLoopGuard

    guard = CrashLoopGuard(2, 1)
    got = [_cycle_decision(guard, 0, exitcode, 25, remaining=5), _cycle_decision(guard, 1, exitcode, 23, remaining=4)]
    assert [(d.action, d.exit_code) for d in got] == expected, [d.reason for d in got]


@pytest.mark.parametrize(("nodes", "min_nodes", "spares", "expected"), [
    (2, 2, 0, False), (2, 2, None, False), (2, 2, 1, True), (2, 1, 0, True), (3, 2, None, True), (1, 1, 0, False),
    (None, 1, 0, False), (1, 1, 2, True),
])
def test_one_test_says_whether_the_job_can_go_on_without_a_node(nodes, min_nodes, spares, expected):
    # the crash-loop guard (launcher/decision/gather.py) and the replace request (rule 2) ask the same
    assert RestartPolicy(RestartPolicyName.ANY_FAILED, min_nodes).can_lose_a_node(nodes, spares) is expected
    gather = (REPO / "launcher" / "decision" / "gather.py").read_text(encoding="utf-8")
    assert "self.policy.can_lose_a_node(" in gather and "min_nodes" not in gather
