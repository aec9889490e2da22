"""launcher/rendezvous/round_failure.py over a real TCPStore: torch's rank assignment after a round
whose member never took part is bounded by the keep-alive rule and becomes RoundFailed."""

from __future__ import annotations

import datetime
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from launcher.rendezvous.round_failure import MIN_EXCHANGE_WAIT, RoundFailed, assign_ranks, exchange_wait

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                           timeout=datetime.timedelta(seconds=60))
    yield dist.PrefixStore("round/", dist.TCPStore("127.0.0.1", server.port, is_master=False,
                                                   timeout=datetime.timedelta(seconds=60)))


def _torchs_exchange(store, group_rank, world):
    """What torch's rank assignment does with the store (its role-info keys), for rank 0."""
    store.set(f"torchelastic/role_info/{group_rank}", b"x")
    return store.multi_get([f"torchelastic/role_info/{i}" for i in range(world)])


def test_the_wait_is_the_keep_alive_expiry_with_a_floor_and_never_over_the_stores_timeout():
    barrier = SimpleNamespace(keep_alive_interval=5.0, keep_alive_max_attempt=3)
    c10d = SimpleNamespace(_settings=SimpleNamespace(keep_alive_interval=datetime.timedelta(seconds=1),
                                                     keep_alive_max_attempt=3))
    assert exchange_wait(barrier, 60) == 15
    assert exchange_wait(c10d, 60) == MIN_EXCHANGE_WAIT
    assert exchange_wait(barrier, 12) == 12
    assert exchange_wait(object(), 60) == 60  # unknown backend: the store's own timeout


def test_a_member_that_never_writes_its_role_info_fails_the_round_within_the_bound(store):
    handler = SimpleNamespace(keep_alive_interval=1.0, keep_alive_max_attempt=3)  # 3 s: the 10 s floor
    store.set("torchelastic/role_info/2", b"x")  # rank 2 took part, rank 1 never did
    started = time.monotonic()
    with pytest.raises(RoundFailed) as failed:
        assign_ranks(lambda: _torchs_exchange(store, 0, 3), store, 0, 3, handler)
    waited = time.monotonic() - started
    assert MIN_EXCHANGE_WAIT - 0.5 <= waited < MIN_EXCHANGE_WAIT + 5  # was: the store's 60 s
    assert failed.value.missing == [1] and failed.value.world == 3
    assert "rank 1 of its 3 node(s)" in str(failed.value) and "DistStoreError" in failed.value.what
    assert store.timeout == datetime.timedelta(seconds=60)  # restored for everything else


def test_a_complete_exchange_returns_torchs_result(store):
    handler = SimpleNamespace(keep_alive_interval=1.0, keep_alive_max_attempt=3)
    assert assign_ranks(lambda: _torchs_exchange(store, 0, 1), store, 0, 1, handler) == [b"x"]
    assert store.timeout == datetime.timedelta(seconds=60)
