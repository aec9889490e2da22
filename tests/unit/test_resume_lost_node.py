"""The node an elastic job lost reaches node_history.tsv, also when the job finishes without it
(issue 31 item 8): the launchers' result files name it (``lost_nodes=``), the loop records it."""

from __future__ import annotations

import io

from launcher.attempt_result import write_result
from launcher.events.log import EventLog
from launcher.events.records import CycleStart, Failure, lost_root_nodes
from launcher.resume import __main__ as cli
from launcher.resume import policy, repeats
from launcher.resume.policy import NodeReport

LOST_CAUSE = "node node3 (group rank 2) sent no report within 2.0 s: lost or cut off"


def survivors_log() -> EventLog:
    """A launcher that lost node3 in cycle 0 and trained on (cycle 1 without failure)."""
    log = EventLog(None, node="node1", stream=io.StringIO())
    log.record_event(CycleStart(cycle=0))
    log.record_event(Failure(cycle=0, cause="exit code 1: RuntimeError: Connection reset by peer",
                             cause_kind="exit", role="collateral", root_node="node3", root_outcome="lost",
                             root_cause=LOST_CAUSE))
    log.record_event(CycleStart(cycle=1))
    return log


def test_the_launchers_records_name_the_lost_node_of_any_cycle(tmp_path):
    log = survivors_log()
    assert log.last_cycle_root_nodes() == []  # recovered from: not the root of how the run ended
    assert log.lost_root_nodes() == lost_root_nodes(log.history) == ["node3"]
    path = tmp_path / "result"
    assert write_result(str(path), 0, "succeeded", [], lost_nodes=log.lost_root_nodes() + ["bad;name"])
    assert "\nlost_nodes=node3\n" in path.read_text()
    assert repeats.parse_launcher_result(path.read_text()).lost == ("node3",)


def _report(node: str, code: int = 0, lost: tuple[str, ...] = ()) -> NodeReport:
    return NodeReport(node, code, host=node, lost=lost)


def test_a_finished_elastic_attempt_records_the_node_it_lost():
    # node3 crashed: its task never reported; node1 and node2 finished the job
    out = policy.nodes_outcome([_report("node1", lost=("node3",)), _report("node2", lost=("node3",)), None],
                               ["node1", "node2", "node3"], 0)
    assert out.lost == ["node3"] and out.bad_nodes == ["node3"] and out.roots == []
    events = cli.attempt_events(1, False, False, out)
    assert [(e.node, e.kind) for e in events] == [("-", repeats.CLEAN), ("node3", repeats.BAD)]
    assert events[1].detail == "lost (its launcher never reported)"


def test_a_lost_node_whose_task_reported_later_is_its_root_not_a_bad_node():
    # node3 was cut off (no report of the failure) but its launcher came back and reported
    out = policy.nodes_outcome([_report("node1", lost=("node3",)), _report("node2"), _report("node3")],
                               ["node1", "node2", "node3"], 0)
    assert out.lost == ["node3"] and out.roots == ["node3"] and out.bad_nodes == []
    events = cli.attempt_events(1, False, False, out)
    assert [(e.node, e.kind, e.detail) for e in events] == [("-", repeats.CLEAN, "-"),
                                                           ("node3", repeats.ROOT, policy.LOST_BY_THE_LAUNCHERS)]
    # a failed attempt: node3 is its root too, never a survivor
    failed = policy.nodes_outcome([_report("node1", 1, ("node3",)), _report("node2", 1), _report("node3", 1)],
                                  ["node1", "node2", "node3"], 1)
    assert [(e.node, e.kind) for e in cli.attempt_events(1, True, False, failed)] == [
        ("-", repeats.FAILED), ("node3", repeats.ROOT)]


def test_a_clean_attempt_without_a_lost_node_is_one_row():
    out = policy.nodes_outcome([_report("node1"), _report("node2")], ["node1", "node2"], 0)
    assert [(e.node, e.kind) for e in cli.attempt_events(1, False, False, out)] == [("-", repeats.CLEAN)]


def test_launchers_that_name_the_lost_node_as_root_agree_with_the_loop():
    # --nnodes 3: the attempt failed; node1 and node2 name node3 (lost) as the root, its task never reported
    reports = [NodeReport("node1", 1, roots=("node3",), host="node1", lost=("node3",)),
               NodeReport("node2", 1, roots=("node3",), host="node2", lost=("node3",)), None]
    out = policy.nodes_outcome(reports, ["node1", "node2", "node3"], 1)
    assert out.bad_nodes == ["node3"] and out.roots == [] and out.lost == ["node3"]
    assert not any(note.startswith("not blaming") for note in out.notes), out.notes
    # a survivor still naming its own rank (an older launcher) is not blamed when a node was lost
    reports[0] = NodeReport("node1", 1, roots=("node1",), host="node1")
    out = policy.nodes_outcome(reports, ["node1", "node2", "node3"], 1)
    assert out.roots == [] and "not blaming node1" in " ".join(out.notes)
