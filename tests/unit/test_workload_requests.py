"""The launcher's workload control requests: a replace request (the straggler detector's) is
judged once per cycle; an unconditional ExcludeThisNode and ShutdownWorkload win over it."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest

from ft_core.wire.data import WorkloadAction, WorkloadControlRequest
from launcher.decision.facts import WorkloadRequest
from launcher.events.records import ReplaceRefused
from launcher.node.control_server import ReceivedRequest
from launcher.node.workload_requests import WorkloadRequests

REPLACE = WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "straggler: node b", only_if_replaceable=True)
EXCLUDE = WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "bad GPU")


def requests_of(*sent: WorkloadControlRequest) -> tuple[WorkloadRequests, SimpleNamespace]:
    control = SimpleNamespace(requests=queue.Queue())
    for rank, request in enumerate(sent):
        control.requests.put(ReceivedRequest(request, 100 + rank, rank))
    events = SimpleNamespace(node="b", records=[])
    events.record_event = events.records.append
    channel = SimpleNamespace(publish_shutdown=lambda *a: None, poll_shutdown=lambda force=False: None)
    return WorkloadRequests(control, channel, events), control  # type: ignore[arg-type]


def requests_events(requests: WorkloadRequests) -> list:
    return requests._events.records  # type: ignore[attr-defined]


def test_the_replace_flag_travels_and_a_plain_request_stays_as_the_reference_sends_it():
    assert WorkloadControlRequest.from_dict(REPLACE.to_dict()) == REPLACE
    assert EXCLUDE.to_dict() == {"action": "exclude_this_node", "description": "bad GPU"}
    with pytest.raises(ValueError, match="only_if_replaceable"):
        WorkloadControlRequest.from_dict({"action": "exclude_this_node", "only_if_replaceable": "yes"})
    with pytest.raises(TypeError, match="only_if_replaceable"):
        WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "x", only_if_replaceable=1)  # type: ignore[arg-type]


def test_a_refused_replace_request_refuses_the_other_ranks_of_the_cycle_without_a_new_decision():
    requests, control = requests_of(REPLACE)
    requests.drain(0)
    assert requests.current is WorkloadRequest.REPLACE and "rank 0 (pid 100)" in requests.cause
    refusal = ReplaceRefused(cycle=0, reason="not replaced: no spare", nodes=2, min_nodes=2, spares_waiting=0)
    requests.refuse(0, refusal)
    assert (requests.current, requests.cause) == (None, "")
    assert [r for r in requests_events(requests) if isinstance(r, ReplaceRefused)] == [refusal]  # its one record
    control.requests.put(ReceivedRequest(REPLACE, 101, 1))  # rank 1 asks a moment later
    requests.drain(0)
    assert requests.current is None
    control.requests.put(ReceivedRequest(REPLACE, 102, 0))  # a later cycle's ranks: judged again
    requests.drain(1)
    assert requests.current is WorkloadRequest.REPLACE


def test_an_unconditional_exclude_wins_over_a_replace_request():
    requests, _ = requests_of(REPLACE, EXCLUDE, REPLACE)
    requests.drain(0)
    assert requests.current is WorkloadRequest.EXCLUDE and "bad GPU" in requests.cause
    requests, _ = requests_of(EXCLUDE, REPLACE)
    requests.drain(0)
    assert requests.current is WorkloadRequest.EXCLUDE
    requests.refuse(0, ReplaceRefused(cycle=0, reason="x", nodes=2, min_nodes=2, spares_waiting=0))
    # refusing applies to a replace request only
    assert requests.current is WorkloadRequest.EXCLUDE
