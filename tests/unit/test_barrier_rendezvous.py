"""The ft-barrier rendezvous (launcher/rendezvous/barrier.py) over a real TCPStore: nodes are threads,
each with its own store connection, as launchers on different machines hold them."""

from __future__ import annotations

import datetime
import threading
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousGracefulExitError,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from launcher.launch_config import (
    RDZV_DEFAULTS,
    create_rendezvous_handler,
    plan_rendezvous,
    replaced,
)
from launcher.rendezvous import membership, store_counter
from launcher.rendezvous import poll as rendezvous_poll
from launcher.rendezvous.barrier import BACKEND, BarrierRendezvousHandler
from launcher.rendezvous.plugin import register
from tests.launcher_util import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=datetime.timedelta(seconds=10))
    yield store


def _client(server):
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10))


def _handler(server, min_nodes, max_nodes, store=None, run_id="job", **kwargs):
    kwargs.setdefault("poll_interval", 0.01)
    kwargs.setdefault("keep_alive_interval", 0.2)
    return BarrierRendezvousHandler(store or _client(server), run_id, min_nodes, max_nodes, local_addr="127.0.0.1",
                                    **kwargs)


def _join_all(handlers, timeout=20.0):
    """``next_rendezvous`` of every handler on its own thread; ``[(rank, world) or the exception]``."""
    results: list = [None] * len(handlers)

    def join(i):
        try:
            info = handlers[i].next_rendezvous()
            results[i] = (info.rank, info.world_size)
        except Exception as err:  # handed to the test
            results[i] = err

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(len(handlers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a node did not leave its rendezvous"
    return results


def _stop(handlers):
    """End the handlers' heartbeat threads before the store server goes (the next test's)."""
    for handler in handlers:
        keep_alive = handler._keep_alive
        handler._stop_keep_alive()
        if keep_alive is not None:
            keep_alive.join(5)


def test_the_round_closes_at_max_at_once_with_unique_ranks(server):
    handlers = [_handler(server, 2, 3, last_call_timeout=30) for _ in range(3)]
    started = time.monotonic()
    results = _join_all(handlers)
    _stop(handlers)
    assert time.monotonic() - started < 10  # not the 30 s last call: the third arrival closed it
    assert sorted(results) == [(0, 3), (1, 3), (2, 3)]


def test_the_round_closes_at_min_after_the_last_call(server):
    handlers = [_handler(server, 2, 4, last_call_timeout=0.5) for _ in range(2)]
    started = time.monotonic()
    results = _join_all(handlers)
    _stop(handlers)
    assert time.monotonic() - started >= 0.5
    assert sorted(results) == [(0, 2), (1, 2)]


def test_the_last_call_counts_from_the_min_th_arrival_not_the_first(server):
    first, second = (_handler(server, 2, 3, last_call_timeout=0.5) for _ in range(2))
    results: list = []
    thread = threading.Thread(target=lambda: results.append(first.next_rendezvous()), daemon=True)
    thread.start()
    time.sleep(0.8)  # the scenario itself: the second node comes after the first's last call would have ended
    arrived = time.monotonic()
    info = second.next_rendezvous()
    thread.join(10)
    _stop([first, second])
    assert time.monotonic() - arrived >= 0.5  # a third node could still have come in that time
    assert sorted([info.rank, results[0].rank]) == [0, 1] and info.world_size == 2


def test_a_late_node_waits_is_counted_and_joins_the_next_round(server):
    members = [_handler(server, 2, 3, last_call_timeout=0.2) for _ in range(2)]
    assert sorted(_join_all(members)) == [(0, 2), (1, 2)]
    assert [m.num_nodes_waiting() for m in members] == [0, 0]
    late = _handler(server, 2, 3, last_call_timeout=0.2)
    late_result: list = []
    thread = threading.Thread(target=lambda: late_result.append(late.next_rendezvous()), daemon=True)
    thread.start()
    wait_for(lambda: members[0].num_nodes_waiting() == 1, 10, "the late node counted as waiting")
    view = members[0].membership_view()
    assert (view.waiting_new, view.waiting_members, view.participants) == (1, 0, 2)
    # the members restart (a failure): with the late node that makes MAX, the round closes at once
    results = _join_all(members)
    thread.join(10)
    _stop([*members, late])
    assert sorted([*results, (late_result[0].rank, late_result[0].world_size)]) == [(0, 3), (1, 3), (2, 3)]
    assert late_result[0].rank == 2  # the returning members first, then the new nodes


def test_set_closed_ends_a_waiting_spare(server):
    members = [_handler(server, 1, 1)]
    assert _join_all(members) == [(0, 1)]
    spare = _handler(server, 1, 1)
    outcome: list = []

    def wait_as_spare():
        try:
            spare.next_rendezvous()
        except Exception as err:  # handed to the test
            outcome.append(err)

    thread = threading.Thread(target=wait_as_spare, daemon=True)
    thread.start()
    wait_for(lambda: members[0].num_nodes_waiting() == 1, 10, "the spare counted as waiting")
    assert not members[0].is_closed()
    assert members[0].shutdown()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome[0], RendezvousGracefulExitError)
    assert spare.is_closed()


def test_a_round_that_never_fills_times_out(server):
    handler = _handler(server, 2, 2, join_timeout=0.3)
    with pytest.raises(RendezvousTimeoutError, match="join_timeout"):
        handler.next_rendezvous()


def test_a_member_without_heartbeats_is_counted_gone(server):
    handlers = [_handler(server, 3, 3, keep_alive_interval=0.05, keep_alive_max_attempt=2) for _ in range(3)]
    results = _join_all(handlers)
    silent = next(h for h, r in zip(handlers, results, strict=True) if r[0] == 1)
    silent._stop_keep_alive()  # as a launcher that is gone
    watcher = next(h for h, r in zip(handlers, results, strict=True) if r[0] == 0)

    def gone():
        watcher._view = None  # no cached answer
        return watcher.membership_view().participants == 2

    wait_for(gone, 10, "rank 1 counted gone")
    assert watcher.membership_view().live_ranks == frozenset({0, 2})
    _stop(handlers)


def test_membership_counts_restarting_members_but_not_spares_of_a_full_round(server):
    members = [membership.wrap(_handler(server, 2, 2), "any-failed") for _ in range(2)]
    assert sorted(_join_all(members)) == [(0, 2), (1, 2)]
    spare = _handler(server, 2, 2)
    waiting = threading.Thread(target=lambda: _ignore_errors(spare.next_rendezvous), daemon=True)
    waiting.start()
    wait_for(lambda: members[0].wrapped.num_nodes_waiting() == 1, 10, "the spare waiting")
    assert members[0].num_nodes_waiting() == 0  # the round is full: a spare restarts nothing
    assert members[0].live_group_ranks() == frozenset({0, 1})
    restarting = threading.Thread(target=lambda: _ignore_errors(members[1].next_rendezvous), daemon=True)
    restarting.start()

    def counted():
        members[0].wrapped._view = None
        return members[0].num_nodes_waiting() == 1

    wait_for(counted, 10, "the restarting member counted")  # a member restarting always counts
    members[0].shutdown()
    restarting.join(10)
    waiting.join(10)
    _stop([*(m.wrapped for m in members), spare])


def _ignore_errors(call):
    try:
        call()
    except Exception:  # the rendezvous closed under it at the test's end
        pass


def _ops_per_node(server, nodes: int) -> dict[str, float]:
    """Store operations per node, by operation, of a first round and a restart of ``nodes`` nodes."""
    counts = store_counter.StoreCounts()
    handlers = [_handler(server, nodes, nodes, store=store_counter.counting_store(_client(server), counts),
                         run_id=f"ops{nodes}", keep_alive_interval=60, poll_interval=0.05)
                for _ in range(nodes)]
    started = time.monotonic()
    assert sorted(_join_all(handlers)) == [(r, nodes) for r in range(nodes)]
    assert sorted(_join_all(handlers)) == [(r, nodes) for r in range(nodes)]
    elapsed = time.monotonic() - started
    _stop(handlers)
    totals: dict[str, float] = {}
    for ops in counts.snapshot().values():
        for op, row in ops.items():
            totals[op] = totals.get(op, 0) + row[0] / nodes
    return {**totals, "polls_bound": 2 + 2 * elapsed / 0.05}


def test_store_operations_per_node_do_not_grow_with_the_node_count(server):
    small = _ops_per_node(server, 4)
    large = _ops_per_node(server, 16)
    polls_small, polls_large = small.pop("check", 0), large.pop("check", 0)
    bound_small, bound_large = small.pop("polls_bound"), large.pop("polls_bound")
    # every operation but the polls: a fixed number per node and round (c10d's grow with N)
    for op, per_node in large.items():
        assert per_node <= small.get(op, 0) + 1, (op, small, large)
    assert sum(large.values()) <= 16, large  # two rounds: about 7 per round (arrive, close, bootstrap, heartbeat)
    # the polls: one check per poll interval while a node waits, whatever N
    assert polls_small <= bound_small and polls_large <= bound_large, (polls_small, polls_large)


def test_the_backend_is_registered_in_torchs_registry(server):
    register()
    register()  # again: no error
    params = RendezvousParameters(backend=BACKEND, endpoint=f"127.0.0.1:{server.port}", run_id="reg",
                                  min_nodes=1, max_nodes=1, is_host="false", last_call_timeout="1")
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, BarrierRendezvousHandler) and handler.get_backend() == BACKEND
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info.master_port > 0
    assert handler.shutdown() and handler.is_closed()


def test_ft_launchers_rendezvous_code_builds_it_with_its_defaults(server):
    # the LaunchConfig fields launch_config reads (bench/scale.py builds its nodes the same way)
    config = SimpleNamespace(min_nodes=1, max_nodes=2, rdzv_backend=BACKEND, rdzv_endpoint=f"127.0.0.1:{server.port}",
                             run_id="cfg", local_addr=None, rdzv_configs={"is_host": "false"})
    plan = plan_rendezvous(config)
    assert sorted(plan.defaulted) == sorted(RDZV_DEFAULTS)
    assert plan.poll_interval is None  # the handler's own default unless given
    plan = plan_rendezvous(replaced(config, rdzv_configs={**config.rdzv_configs,
                                                          rendezvous_poll.POLL_INTERVAL_KEY: "0.05"}))
    assert plan.poll_interval == 0.05
    handler = create_rendezvous_handler(plan.config)
    assert (handler.keep_alive_interval, handler.keep_alive_max_attempt, handler.last_call_timeout) == (1, 3, 2)
    assert rendezvous_poll.apply_to_handler(handler, 0.05) and handler.poll_interval == 0.05


def test_a_store_call_that_waits_does_not_starve_the_nodes_keep_alive(server):
    # torch's rank assignment waits in the agent's store client for a member that died; the keep-alive
    # shared that client (one lock per request): this node sent no heartbeat meanwhile, and the
    # member watching it counted it gone (issue 31, item 4). It has its own connection now.
    handlers = [_handler(server, 2, 2, keep_alive_interval=0.1, keep_alive_max_attempt=5) for _ in range(2)]
    results = _join_all(handlers)
    blocked = next(h for h, r in zip(handlers, results, strict=True) if r[0] == 0)
    watcher = next(h for h, r in zip(handlers, results, strict=True) if r[0] == 1)
    blocked._store.set_timeout(datetime.timedelta(seconds=3))
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        blocked._store.get("a key no member writes")  # waits 3 s, over the 0.5 s keep-alive expiry
    assert time.monotonic() - started >= 2.9
    watcher._view = None
    view = watcher.membership_view()
    _stop(handlers)
    assert view.live_ranks == frozenset({0, 1}), "rank 0 was counted gone while it waited in the store"


def test_members_counted_gone_after_a_failed_round_let_the_next_round_close_at_once(server):
    # a member that died as the round closed: the survivors count it gone (launcher.rendezvous.round_failure),
    # so the next round closes when they are back, not after the 30 s last call
    handlers = [_handler(server, 1, 3, last_call_timeout=30, keep_alive_interval=5) for _ in range(3)]
    results = _join_all(handlers)
    by_rank = {r[0]: h for h, r in zip(handlers, results, strict=True)}
    _stop([by_rank[1]])  # gone: never comes back
    for rank in (0, 2, 0):  # twice from one node (its keep-alive may have claimed it too): counted once
        by_rank[rank].count_as_gone([1])
    started = time.monotonic()
    again = _join_all([by_rank[0], by_rank[2]])
    _stop(handlers)
    assert time.monotonic() - started < 10
    assert sorted(again) == [(0, 2), (1, 2)]
