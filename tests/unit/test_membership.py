"""launcher/rendezvous/membership.py: which waiting nodes count, on a stand-in for torch's handler's state."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from launcher.rendezvous.membership import MembershipHandler


class FakeHandler:
    """Just the parts of torch's DynamicRendezvousHandler that the proxy reads."""

    def __init__(self, participants: set[str], max_nodes: int, min_nodes: int = 1) -> None:
        self._state_holder = SimpleNamespace(state=SimpleNamespace(participants=dict.fromkeys(participants, 0),
                                                                   wait_list=set(), redundancy_list=set()))
        self._settings = SimpleNamespace(min_nodes=min_nodes, max_nodes=max_nodes)
        self._heartbeat_lock = threading.Lock()
        self.closed = False

    def next_rendezvous(self) -> str:
        return "info"

    def num_nodes_waiting(self) -> int:
        return len(self._state_holder.state.wait_list)

    def set_closed(self) -> None:
        self.closed = True


def joined(participants: set[str], max_nodes: int, policy: str,
           min_nodes: int = 1) -> tuple[FakeHandler, MembershipHandler]:
    fake = FakeHandler(participants, max_nodes, min_nodes)
    proxy = MembershipHandler(fake, policy)
    assert proxy.next_rendezvous() == "info"
    return fake, proxy


def test_new_nodes_count_under_any_failed_only_while_the_round_has_a_free_slot():
    fake, proxy = joined({"a"}, 2, "any-failed")
    fake._state_holder.state.wait_list = {"b", "c"}
    assert proxy.num_nodes_waiting() == 2  # one fits: restart to take it in
    fake, proxy = joined({"a", "b"}, 2, "any-failed")
    fake._state_holder.state.wait_list = {"c"}
    assert proxy.num_nodes_waiting() == 0  # the round is full: c is a spare (torch said 1)


def test_under_min_healthy_new_nodes_never_count_but_restarting_members_do():
    fake, proxy = joined({"a", "b"}, 3, "min-healthy")
    fake._state_holder.state.wait_list = {"c", "d"}
    assert proxy.num_nodes_waiting() == 0
    fake._state_holder.state.wait_list = {"b", "c"}  # b left the round to restart
    assert proxy.num_nodes_waiting() == 1


def test_under_any_failed_a_member_that_left_frees_its_slot_for_a_new_node():
    # the reference's ExcludeThisNode scenario: a member's launcher exited (excluded), torch dropped
    # it from the round once its keep-alive expired, and a spare moved up to the wait list
    fake, proxy = joined({"a", "b"}, 2, "any-failed")
    fake._state_holder.state.wait_list = {"c", "d"}
    assert proxy.num_nodes_waiting() == 0
    del fake._state_holder.state.participants["b"]
    assert proxy.num_nodes_waiting() == 2


def test_under_min_healthy_new_nodes_count_once_the_round_falls_below_the_minimum(caplog):
    # the reference's min-healthy scenario at --nnodes 2:3: nodes that leave while 2 remain
    # restart nothing (spares wait, one line per change of the spares); below 2 they count
    fake, proxy = joined({"a", "b", "c"}, 3, "min-healthy", min_nodes=2)
    state = fake._state_holder.state
    with caplog.at_level(logging.INFO, logger="launcher.rendezvous.membership"):
        del state.participants["b"]
        state.wait_list = {"d"}
        assert proxy.num_nodes_waiting() == 0
        assert proxy.num_nodes_waiting() == 0
        state.wait_list = {"d", "e"}
        assert proxy.num_nodes_waiting() == 0
        del state.participants["c"]
        assert proxy.num_nodes_waiting() == 2
    lines = [r.getMessage() for r in caplog.records if "wait as spares" in r.getMessage()]
    assert len(lines) == 2 and "2 node(s) in the round, --nnodes MIN 2" in lines[0], lines


@pytest.mark.parametrize("policy", ["any-failed", "min-healthy"])
def test_a_restarting_member_counts_in_a_full_round(policy):
    fake, proxy = joined({"a", "b"}, 2, policy)
    fake._state_holder.state.wait_list = {"b", "x"}
    assert proxy.num_nodes_waiting() == 1


def test_an_unreadable_state_falls_back_to_torchs_count_with_one_warning(caplog):
    class Plain:
        def next_rendezvous(self) -> str:
            return "info"

        def num_nodes_waiting(self) -> int:
            return 2

    proxy = MembershipHandler(Plain(), "min-healthy")
    with caplog.at_level(logging.WARNING, logger="launcher.rendezvous.membership"):
        proxy.next_rendezvous()
        assert proxy.num_nodes_waiting() == 2
        assert proxy.num_nodes_waiting() == 2
    assert len([r for r in caplog.records if "cannot read the rendezvous state" in r.getMessage()]) == 1


def test_every_other_attribute_is_the_real_handlers():
    fake, proxy = joined({"a"}, 2, "any-failed")
    proxy.set_closed()
    assert fake.closed and proxy.wrapped is fake
    proxy._cache_note = 1  # a setting made through the proxy reaches torch's handler
    assert fake._cache_note == 1


def test_the_live_ranks_are_those_of_the_participants_still_in_the_round():
    fake, proxy = joined({"a", "b", "c"}, 3, "min-healthy", min_nodes=2)
    fake._state_holder.state.participants = {"a": 0, "b": 1, "c": 2}
    assert proxy.live_group_ranks() == {0, 1, 2}
    del fake._state_holder.state.participants["b"]  # b's launcher is gone: torch dropped it
    assert proxy.live_group_ranks() == {0, 2}
    del fake._state_holder.state.participants  # a torch whose state this cannot read
    assert proxy.live_group_ranks() is None


def test_spares_are_the_waiting_nodes_that_are_not_members_of_the_round():
    # the straggler replace request asks it (issue 31 item 2): a spare takes the leaving node's place
    fake, proxy = joined({"a", "b"}, 2, "any-failed", min_nodes=2)
    assert proxy.spares_waiting() == 0
    fake._state_holder.state.redundancy_list = {"c"}  # came while the round was full
    assert proxy.spares_waiting() == 1
    fake._state_holder.state.wait_list = {"b", "d"}  # b: a member restarting, not a spare
    assert proxy.spares_waiting() == 2


def test_spares_are_not_known_before_a_round_or_without_the_state():
    proxy = MembershipHandler(FakeHandler({"a"}, 2), "any-failed")
    assert proxy.spares_waiting() is None  # no round joined yet
    fake, proxy = joined({"a"}, 2, "any-failed")
    del fake._state_holder
    assert proxy.spares_waiting() is None


def test_spares_of_a_handler_with_its_own_view_are_its_new_nodes():
    from launcher.rendezvous.barrier import MembershipView

    view = MembershipView(waiting_members=1, waiting_new=2, participants=2, live_ranks=frozenset({0, 1}),
                          min_nodes=2, max_nodes=2)
    handler = SimpleNamespace(membership_view=lambda: view, next_rendezvous=lambda: "info")
    assert MembershipHandler(handler, "any-failed").spares_waiting() == 2
    handler.membership_view = lambda: None
    assert MembershipHandler(handler, "any-failed").spares_waiting() is None


def _round_of(names: list[str], scripted_syncs: list | None = None) -> tuple[FakeHandler, MembershipHandler]:
    """A round of ``names`` (group ranks in order) whose state torch keeps alive; each sync of the
    state (``num_nodes_waiting``) first applies the next of ``scripted_syncs``."""
    fake, proxy = FakeHandler(set(names), len(names)), None
    state = fake._state_holder.state
    state.participants = {name: rank for rank, name in enumerate(names)}
    state.last_heartbeats = dict.fromkeys(names, 0.0)
    syncs = list(scripted_syncs or [])

    def num_nodes_waiting() -> int:
        if syncs:
            syncs.pop(0)(state)
        return len(state.wait_list)

    fake.num_nodes_waiting = num_nodes_waiting
    proxy = MembershipHandler(fake, "any-failed")
    proxy.next_rendezvous()
    return fake, proxy


def _drop(state, name: str) -> None:  # what torch's sanitizer does once a node's keep-alive lapsed
    del state.participants[name]
    del state.last_heartbeats[name]


def test_a_member_whose_keep_alive_lapsed_is_dead_after_the_confirmation():
    fake, proxy = _round_of(["a", "b", "c"])
    assert proxy.dead_group_ranks() == frozenset()
    _drop(fake._state_holder.state, "b")
    assert proxy.dead_group_ranks(confirm=0.3) == {1}


def test_a_member_that_restarts_is_not_dead_though_it_was_nowhere_for_a_moment():
    def rejoins(state) -> None:  # torch's join op after its exit op: b waits for the next round
        state.wait_list.add("b")
        state.last_heartbeats["b"] = 1.0

    fake, proxy = _round_of(["a", "b", "c"], [rejoins])
    _drop(fake._state_holder.state, "b")  # its exit op: out of the round and the keep-alive table
    assert proxy.dead_group_ranks() == {1}, "without confirmation the moment between looks like a loss"
    assert proxy.dead_group_ranks(confirm=5) == frozenset()


def test_dead_members_are_unknown_without_torchs_state():
    fake, proxy = _round_of(["a", "b"])
    del fake._state_holder.state.last_heartbeats  # a torch whose state this cannot read
    assert proxy.dead_group_ranks(confirm=0.2) is None
    assert MembershipHandler(FakeHandler({"a"}, 1), "any-failed").dead_group_ranks() is None  # no round yet
    barrier = MembershipHandler(SimpleNamespace(membership_view=lambda: None, next_rendezvous=lambda: "info"),
                                "any-failed")
    barrier.next_rendezvous()
    assert barrier.dead_group_ranks() is None  # ft-barrier: its view has no such table
