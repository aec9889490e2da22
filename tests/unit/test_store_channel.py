"""The launchers' channel over a real torch store: two channels play two nodes."""

from __future__ import annotations

import datetime
import time

import pytest
import torch.distributed as dist

from launcher.rendezvous.store_channel import SHUTDOWN_KEY, StoreChannel


@pytest.fixture
def tcp_store():
    """A real TCPStore server and a client connected to it, as a launcher holds them."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    yield server, client


@pytest.fixture(params=["hash", "tcp", "prefix"])
def two_nodes(request, tcp_store):
    server, client = tcp_store
    if request.param == "hash":
        store = dist.HashStore()
        return StoreChannel(store, check_interval=0), StoreChannel(store, check_interval=0)
    if request.param == "prefix":  # what torch's rendezvous hands the agent
        return (StoreChannel(dist.PrefixStore("rdzv/", server), check_interval=0),
                StoreChannel(dist.PrefixStore("rdzv/", client), check_interval=0))
    return StoreChannel(server, check_interval=0), StoreChannel(client, check_interval=0)


def test_shutdown_is_seen_and_acknowledged_by_the_other_node(two_nodes):
    a, b = two_nodes
    assert b.poll_shutdown() is None
    assert not a.wait_for_acks(1, timeout=0)  # nobody has acknowledged anything yet
    assert a.publish_shutdown("node-a", 3, "loss is NaN")
    notice = b.poll_shutdown()
    assert (notice.node, notice.rank, notice.description) == ("node-a", 3, "loss is NaN")
    assert a.wait_for_acks(1, timeout=5)
    assert not a.wait_for_acks(2, timeout=0.2)  # a second node never acknowledged


def test_poll_is_rate_limited_unless_forced():
    store = dist.HashStore()
    a, b = StoreChannel(store), StoreChannel(store, check_interval=3600)
    assert b.poll_shutdown() is None  # reads the store, finds nothing, waits an hour for the next read
    a.publish_shutdown("node-a", 0, "")
    assert b.poll_shutdown() is None
    assert b.poll_shutdown(force=True) is not None


def test_an_unreadable_payload_still_means_shutdown():
    store = dist.HashStore()
    store.set(SHUTDOWN_KEY, b"\xff not json")
    notice = StoreChannel(store, check_interval=0).poll_shutdown()
    assert notice is not None and (notice.node, notice.rank, notice.description) == (None, None, "")


def test_a_node_whose_launcher_is_gone_is_not_healthy(two_nodes):
    # min-healthy: node 1's launcher died without marking itself; node 2 marked its failure
    a, b = two_nodes
    assert b.mark_unhealthy(2, cycle=0)
    deadline = time.monotonic() + 5
    while a.healthy_nodes(3) != 2:  # a TCPStore client's set reaches another connection shortly after
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert a.healthy_nodes(3, live_ranks={0, 2}) == 1
    assert a.healthy_nodes(3, live_ranks={0, 1, 2}) == 2


def test_healthy_nodes_counts_the_unmarked_ones(two_nodes):
    a, b = two_nodes
    assert a.healthy_nodes(3) == 3
    assert b.mark_unhealthy(1, cycle=0)
    assert a.healthy_nodes(3) == 2
    assert a.mark_unhealthy(0, cycle=2)
    assert b.healthy_nodes(3) == 1


def test_without_a_store_nothing_happens():
    channel = StoreChannel()
    assert not channel.attached
    assert not channel.publish_shutdown("n", 0, "")
    assert channel.poll_shutdown(force=True) is None
    assert not channel.wait_for_acks(1, timeout=0)
    assert not channel.mark_unhealthy(0, 0)
    assert channel.healthy_nodes(2) is None
    channel.attach(dist.HashStore())
    assert channel.attached and channel.healthy_nodes(2) == 2


def test_a_store_gone_with_its_host_is_reported_not_raised():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    channel = StoreChannel(client, check_interval=0)
    assert channel.healthy_nodes(2) == 2
    del server  # the host node's launcher is gone: the client's operations fail with c10d's errors
    deadline = time.monotonic() + 10
    while channel.healthy_nodes(2) is not None:
        assert time.monotonic() < deadline, "the store still answers"
        time.sleep(0.05)
    assert channel.poll_shutdown(force=True) is None
    assert not channel.wait_for_acks(1, timeout=1)
    assert channel.healthy_nodes(2) is None


def test_failure_views_are_exchanged_with_a_bound(two_nodes):
    a, b = two_nodes
    started = time.monotonic()
    assert b.gather_views(2, 1, timeout=0.3).states == []  # node 0 published nothing: b waits, bounded
    assert 0.25 <= time.monotonic() - started < 5
    assert a.publish_view(0, [{"rank": 0, "outcome": "hang"}])
    assert b.publish_view(1, [{"rank": 1, "outcome": "stopped"}, "not a state"])
    assert b.gather_views(2, 1, timeout=5).states == [{"rank": 0, "outcome": "hang"}]
    assert a.gather_views(2, 0, timeout=5).states == [{"rank": 1, "outcome": "stopped"}]
    assert a.gather_views(1, 0).states == []  # a single node has nobody to ask


def test_a_view_that_is_not_json_is_ignored():
    store = dist.HashStore()
    store.set("ft_launcher/failure_view/0", b"\xff not json")
    assert StoreChannel(store).gather_views(2, 1, timeout=1).states == []


def test_a_node_that_sent_no_view_is_named_by_the_host_it_published(two_nodes):
    a, b = two_nodes
    assert a.publish_member(0, "node-a") and b.publish_member(1, "node-b")
    # a TCPStore client's set is not acknowledged: another connection sees it shortly after
    deadline = time.monotonic() + 5
    while a.member_host(1) is None:
        assert time.monotonic() < deadline, "node b's name never arrived"
        time.sleep(0.01)
    assert a.member_host(1) == "node-b" and a.member_host(2) is None
    assert b.publish_view(1, [{"rank": 1, "outcome": "hang"}])
    started = time.monotonic()
    views = a.gather_views(3, 0, timeout=0.3)  # node 2 never published anything, not even its name
    assert 0.25 <= time.monotonic() - started < 5
    assert views.states == [{"rank": 1, "outcome": "hang"}]
    assert views.missing == {2: None} and views.waited == 0.3
    a.publish_view(0, [])
    assert b.gather_views(2, 1, timeout=5).missing == {}


def test_member_names_are_bounded_and_garbage_reads_as_unknown():
    store = dist.HashStore()
    channel = StoreChannel(store)
    assert channel.publish_member(0, "x" * 1000)
    assert channel.member_host(0) == "x" * 255
    store.set("ft_launcher/member/1", b"bad\x00name")
    assert channel.member_host(1) is None
    assert not StoreChannel().publish_member(0, "n") and StoreChannel().member_host(0) is None


def test_the_end_of_training_is_seen_by_the_other_node_even_without_a_usable_name(two_nodes):
    a, b = two_nodes
    assert b.training_ended_on() is None  # nobody said so: a waiting node may still join
    assert a.publish_training_ended("node-a")
    # a TCPStore client's set is not acknowledged: another connection sees it shortly after
    deadline = time.monotonic() + 5
    while b.training_ended_on() is None:
        assert time.monotonic() < deadline, "node a's end of training never arrived"
        time.sleep(0.01)
    assert b.training_ended_on() == "node-a"
    store = dist.HashStore()
    store.set("ft_launcher/training_ended", b"bad\x00name")
    assert StoreChannel(store).training_ended_on() == ""  # ended, on a node whose name is garbage
    assert not StoreChannel().publish_training_ended("n") and StoreChannel().training_ended_on() is None


def test_when_the_store_fails_nobody_is_called_missing():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=2))
    channel = StoreChannel(client, check_interval=0)
    assert channel.gather_views(2, 0, timeout=0.1).missing == {1: None}
    del server  # this node can no longer reach the store: the other node may be fine
    deadline = time.monotonic() + 10
    while channel.healthy_nodes(2) is not None:
        assert time.monotonic() < deadline, "the store still answers"
        time.sleep(0.05)
    views = channel.gather_views(2, 0, timeout=0.1)
    assert views.missing == {} and views.states == []


@pytest.mark.parametrize("nodes", [4, 32])
def test_gathering_every_view_costs_a_node_a_few_reads_whatever_the_number_of_nodes(tcp_store, nodes):
    # Polling each node's key cost every node O(N) reads per poll, O(N^2) for the job (issue 25).
    from launcher.rendezvous.store_counter import StoreCounts, counting_store, totals

    server, client = tcp_store
    for node in range(1, nodes):
        assert StoreChannel(dist.PrefixStore("rdzv/", server)).publish_view(node, [{"rank": node, "outcome": "x"}])
    counts = StoreCounts()
    counted = counting_store(client, counts)  # held here: torch calls its Python methods through this object
    gatherer = StoreChannel(dist.PrefixStore("rdzv/", counted))
    assert gatherer.publish_view(0, [{"rank": 0, "outcome": "hang"}])
    views = gatherer.gather_views(nodes, 0, timeout=5)
    assert sorted(s["rank"] for s in views.states) == list(range(1, nodes)) and views.missing == {}
    operations = sum(row[0] for row in totals(counts.snapshot()).values())
    assert operations <= 5, counts.snapshot()  # set + add to publish; the count, a check, one multi_get


def test_views_of_the_live_nodes_end_the_wait_when_others_are_known_gone(two_nodes):
    a, b = two_nodes  # a third node (group rank 2) is gone and never publishes
    assert a.publish_view(0, [{"rank": 0, "outcome": "stopped"}])
    assert b.publish_view(1, [{"rank": 1, "outcome": "stopped"}])
    started = time.monotonic()
    views = b.gather_views(3, 1, timeout=30, expected=2)
    assert time.monotonic() - started < 10, "waited for the gone node's view"
    assert views.states == [{"rank": 0, "outcome": "stopped"}]
    assert list(views.missing) == [2]
