"""Rule 6 of launcher.decision.culprit: a node the rendezvous dropped (its keep-alive lapsed) while
every rank that reported still ran is the root, when torch restarts the survivors for a waiting
spare before any of their timeouts passed (a frozen or cut-off node leaves no error behind)."""

from __future__ import annotations

import io

import pytest

from launcher.decision.culprit import CRASH, HANG, LEFT, LOST, LOST_DROPPED, STOPPED, LostNode, RankState, choose_root
from launcher.decision.failures import (
    DROPPED_MEMBER_CAUSE,
    KIND_TERMINATED,
    Evidence,
    Exchanged,
    dropped_member_records,
)
from launcher.events.log import EventLog
from launcher.events.records import CycleStart

T = 1_700_000_000.0
NODE2 = LostNode(1, "node2")
NODE3 = LostNode(2, "node3")


def rank(number: int, outcome: str, *, node: str = "node1", group: int = 0, at: float | None = None) -> RankState:
    return RankState(rank=number, local_rank=0, node=node, group_rank=group, pid=100 + number, outcome=outcome,
                     cause={STOPPED: DROPPED_MEMBER_CAUSE, HANG: "hang: x", CRASH: "exit code 1: ValueError: x",
                            LEFT: "its node left the job (replace)"}[outcome], event_at=at)


RUNNING = [rank(0, STOPPED), rank(1, STOPPED, node="node2", group=1)]


@pytest.mark.parametrize(("states", "lost", "dropped", "root"), [
    pytest.param(RUNNING, [NODE3], {2}, "node3", id="every-rank-ran-and-the-silent-node-was-dropped"),
    pytest.param(RUNNING[:1], [NODE2, NODE3], {2}, "node3", id="the-dropped-one-among-several-silent"),
    # the rendezvous's verdict is needed: a node merely late with its view is not blamed
    pytest.param(RUNNING, [NODE3], set(), None, id="silent-but-not-dropped"),
    # nothing known of the others (this node could not read the store): nobody is blamed
    pytest.param(RUNNING, [], {2}, None, id="store-unreadable"),
    # a failure reported by a rank explains it better
    pytest.param([*RUNNING, rank(2, CRASH, node="node4", group=3, at=T)], [NODE3], {2}, 2, id="a-crash-elsewhere"),
    pytest.param([rank(0, STOPPED), rank(1, HANG, node="node2", group=1, at=T)], [], {2}, 1, id="a-hang-elsewhere"),
    # a node that left on request published its ranks as left: rule 0
    pytest.param([rank(0, STOPPED), rank(2, LEFT, node="node3", group=2, at=T)], [], {2}, 2, id="left-on-request"),
])
def test_a_dropped_node_that_sent_no_view_is_the_root_when_every_rank_ran(states, lost, dropped, root):
    found = choose_root(states, lost, waited=2.0, dropped=dropped)
    named = None if found is None else found.node if found.outcome == LOST else found.rank
    assert named == root
    if found is not None and found.outcome == LOST:
        assert found.cause.endswith(LOST_DROPPED)
        assert [n.host for n in found.lost_nodes][0] == "node3"


def test_the_survivors_records_and_line_name_the_dropped_node():
    published = []

    def exchange(states):
        published.extend(states)
        return Exchanged([rank(1, STOPPED, node="node2", group=1)], [NODE3], 2.0)

    records = dropped_member_records({0: (0, 1000)}, dropped={2}, cycle=4, now=T, evidence=Evidence(
        node="node1", group_rank=0), exchange=exchange)
    assert [(s.rank, s.outcome) for s in published] == [(0, STOPPED)], "this node's ranks were published as running"
    (record,) = records
    assert (record.role, record.kind, record.cause, record.detected_at) == (
        "collateral", KIND_TERMINATED, DROPPED_MEMBER_CAUSE, T)
    assert (record.root.outcome, record.root.node, record.root.group_rank) == (LOST, "node3", 2)
    assert record.explanation == "stopped waiting for node node3 (group rank 2), which sent no report (lost or cut off)"
    stream = io.StringIO()
    log = EventLog(None, node="node1", stream=stream)
    log.record_event(CycleStart(cycle=4))
    log.failure(record, "restarting the worker group with the node(s) waiting in the rendezvous")
    line = stream.getvalue().splitlines()[0]
    assert line.startswith("[ft_launcher] cycle 4: rank 0 (local rank 0, pid 1000) on node node1 stopped waiting "
                           "for node node3 (group rank 2), which sent no report (lost or cut off)"), line
    assert log.records[-1]["root_outcome"] == "lost" and log.records[-1]["root_group_rank"] == 2
    assert log.lost_root_nodes() == ["node3"], "the auto-resume policy counts the node"


def test_no_root_found_leaves_no_records():
    assert dropped_member_records({0: (0, 1000)}, dropped={2}, cycle=0, now=T,
                                  exchange=lambda states: Exchanged()) == []
