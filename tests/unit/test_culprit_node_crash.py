"""Rule 5 of launcher.decision.culprit: a node that crashed is the root of its peers' broken
collectives (issue 31 item 8), not the first survivor whose collective failed."""

from __future__ import annotations

import io
import socket
import threading
import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from launcher.decision import gather
from launcher.decision.crash_loop import fingerprint
from launcher.decision.culprit import CRASH, HANG, LEFT, LOST, STOPPED, LostNode, RankState, choose_root
from launcher.decision.failures import Evidence, Exchanged, failure_records
from launcher.events.log import EventLog
from launcher.events.records import CycleStart

T = 1_700_000_000.0
GLOO_RESET = ("exit code 1: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
              "Read error [198.51.100.13]:38592: Connection reset by peer. This is typically caused by a remote "
              "worker hanging or bugs in the application.")
GLOO_CLOSED = ("exit code 1: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed "
               "by peer [198.51.100.13]:11475")
OWN_BUG = "exit code 1: ValueError: bad learning rate"
ALL_REDUCE = ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252 all_reduce",
              "/job/train.py:69 main")
DDP_BACKWARD = ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py:979 _engine_run_backward",
                "/job/train.py:178 main")
OWN_CODE = ("/job/train.py:31 sleep_here", "/job/train.py:72 main")
NODE2 = LostNode(1, "node2", ("198.51.100.12",))
NODE3 = LostNode(2, "node3", ("198.51.100.13",))


def rank(number: int, outcome: str, cause: str = "", *, at: float | None = None, node: str = "node1",
         group: int = 0, frames: tuple[str, ...] = (), stopped: bool = False) -> RankState:
    progress = {"last_progress_at": T - 0.1, "step": 20, "stopped": stopped, "open_section": None,
                "section_since": None, "heartbeats": 3}
    return RankState(rank=number, local_rank=0, node=node, group_rank=group, pid=100 + number, outcome=outcome,
                     cause=cause or ("hang: x" if outcome == HANG else "exit code 1"), event_at=at, progress=progress,
                     stack_frames=frames)


@pytest.mark.parametrize(("states", "lost", "root"), [
    # the issue's case: both survivors' collectives broke when node3 crashed; node3 sent nothing
    pytest.param([rank(0, CRASH, GLOO_RESET, at=T + 0.01, frames=DDP_BACKWARD),
                  rank(1, CRASH, GLOO_RESET, at=T, node="node2", group=1, frames=DDP_BACKWARD)],
                 [NODE3], "node3", id="both-survivors-crashed-in-the-collective"),
    pytest.param([rank(0, CRASH, GLOO_CLOSED, at=T), rank(1, STOPPED, node="node2", group=1)],
                 [NODE3], "node3", id="one-crashed-one-stopped"),
    # the error text is not known, but the traceback ends in a torch.distributed collective
    pytest.param([rank(0, CRASH, "exit code 1: RuntimeError: something", at=T, frames=ALL_REDUCE)],
                 [NODE3], "node3", id="traceback-in-a-collective"),
    # a survivor timed out in the collective, the other's broke
    pytest.param([rank(0, HANG, at=T + 3, frames=ALL_REDUCE), rank(1, CRASH, GLOO_RESET, at=T, node="node2", group=1)],
                 [NODE3], "node3", id="a-hang-in-a-collective-and-a-broken-one"),
    # rule 1 stands: the crash is the rank's own bug, or a signal, or no node is missing
    pytest.param([rank(0, CRASH, OWN_BUG, at=T, frames=OWN_CODE)], [NODE3], 0, id="own-bug"),
    pytest.param([rank(0, CRASH, OWN_BUG, at=T, frames=OWN_CODE),
                  rank(1, CRASH, GLOO_RESET, at=T + 0.1, node="node2", group=1)], [NODE3], 0,
                 id="own-bug-and-a-broken-collective"),
    pytest.param([rank(0, CRASH, "signal SIGKILL", at=T)], [NODE3], 0, id="killed"),
    pytest.param([rank(0, CRASH, GLOO_RESET, at=T), rank(1, CRASH, GLOO_RESET, at=T + 0.1, node="node2", group=1)],
                 [], 0, id="no-node-missing"),
    # a stopped process, or a hung rank in its own code, explains the failure better
    pytest.param([rank(0, CRASH, GLOO_RESET, at=T), rank(1, HANG, at=T - 1, node="node2", group=1, stopped=True)],
                 [NODE3], 1, id="a-stopped-process"),
    pytest.param([rank(0, CRASH, GLOO_RESET, at=T + 1), rank(1, HANG, at=T, node="node2", group=1, frames=OWN_CODE)],
                 [NODE3], 1, id="a-hang-in-own-code"),
    # rule 0 comes first: a node that left on request
    pytest.param([rank(0, CRASH, GLOO_RESET, at=T + 0.05), rank(1, LEFT, at=T, node="node2", group=1)],
                 [NODE3], 1, id="a-node-left-on-request"),
])
def test_a_crashed_node_is_the_root_of_its_peers_broken_collectives(states, lost, root):
    found = choose_root(states, lost, waited=2.0)
    assert (found.node if found.outcome == LOST else found.rank) == root
    assert choose_root(list(reversed(states)), lost, waited=2.0).same_rank(found)


def test_the_node_whose_address_the_errors_name_is_the_root_among_several_missing():
    states = [rank(0, CRASH, GLOO_RESET, at=T, frames=DDP_BACKWARD)]
    root = choose_root(states, [NODE2, NODE3], waited=2.0)
    assert (root.outcome, root.node, root.group_rank) == (LOST, "node3", 2)
    assert [n.host for n in root.lost_nodes] == ["node3", "node2"]
    assert root.cause.startswith("nodes node3 (group rank 2), node2 (group rank 1) each sent no report")
    # without addresses: the first by group rank, as rule 4
    unresolved = [LostNode(1, "node2"), LostNode(2, "node3")]
    assert choose_root(states, unresolved, waited=2.0).node == "node2"


def test_records_line_and_fingerprint_name_the_crashed_node():
    message = {"message": GLOO_RESET.removeprefix("exit code 1: "), "extraInfo": {"py_callstack": (
        'Traceback (most recent call last):\n  File "/job/train.py", line 178, in main\n'
        '  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979, in _engine_run_backward\n')}}
    failure = ProcessFailure(local_rank=0, pid=1000, exitcode=1, error_file="<N/A>")
    failure.message = message
    records = failure_records(
        {0: failure}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=0, now=T + 1,
        evidence=Evidence(node="node1", group_rank=0, exits_seen_at={0: T}),
        exchange=lambda states: Exchanged([rank(1, CRASH, GLOO_RESET, at=T, node="node2", group=1)], [NODE3], 2.0))
    record = records[0]
    assert record.role == "collateral"
    assert record.explanation.startswith("stopped waiting for node node3 (group rank 2), which sent no report "
                                         "(lost or cut off)")
    assert (record.root.outcome, record.root.node, record.root.group_rank) == (LOST, "node3", 2)
    assert record.root.cause == ("node node3 (group rank 2) sent no report within 2.0 s: lost or cut off from the "
                                 "rendezvous store; the collectives of every rank that failed broke with it "
                                 "(a peer's connection lost)")
    # the crash-loop guard counts the lost node, not this node's rank
    assert record.fingerprint == fingerprint(choose_root([rank(0, CRASH, GLOO_RESET, at=T)], [NODE3], 2.0))
    assert (record.fingerprint.kind, record.fingerprint.where) == (LOST, "node3")
    stream = io.StringIO()
    log = EventLog(None, node="node1", stream=stream)
    log.record_event(CycleStart(cycle=0))
    log.failure(record, "restarting the worker group (restart 1/3)")
    line = stream.getvalue().splitlines()[0]
    assert line.startswith("[ft_launcher] cycle 0: rank 0 (local rank 0, pid 1000) on node node1 stopped waiting "
                           "for node node3 (group rank 2), which sent no report (lost or cut off)"), line
    assert "(collateral: exit code 1: RuntimeError:" in line
    assert log.records[-1]["role"] == "collateral" and log.records[-1]["root_node"] == "node3"
    assert log.last_cycle_root_nodes() == ["node3"]


def test_lost_nodes_get_their_addresses_within_a_bound(monkeypatch):
    found = gather.with_addresses([LostNode(1, "localhost"), LostNode(2, None)])
    assert "127.0.0.1" in found[0].addresses or "::1" in found[0].addresses
    assert found[1].addresses == ()
    release = threading.Event()

    def stuck(*args, **kwargs):  # a DNS server that does not answer
        release.wait(10)
        raise socket.gaierror("timeout")

    monkeypatch.setattr(gather.socket, "getaddrinfo", stuck)
    start = time.monotonic()
    assert gather.with_addresses([LostNode(1, "node2")], timeout=0.2) == [LostNode(1, "node2")]
    assert time.monotonic() - start < 2.0
    release.set()
