"""A value nested too deeply for json's decoder, in the launchers' store keys, is ignored like
any other unreadable value (a RecursionError used to escape from the launcher's loop)."""

from __future__ import annotations

import datetime

import torch.distributed as dist

from launcher.rendezvous.store_channel import SHUTDOWN_KEY, StoreChannel

NESTED = b"[" * 100_000 + b"]" * 50_000  # fits MAX_VIEW_BYTES, deeper than the decoder can go


def _tcp_store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=5))


def test_a_deeply_nested_view_is_ignored():
    store = _tcp_store()
    store.set("ft_launcher/failure_view/0", NESTED)
    assert StoreChannel(store).gather_views(2, 1, timeout=1).states == []


def test_a_deeply_nested_shutdown_payload_still_means_shutdown():
    store = _tcp_store()
    store.set(SHUTDOWN_KEY, NESTED)
    notice = StoreChannel(store, check_interval=0).poll_shutdown()
    assert notice is not None and (notice.node, notice.rank, notice.description) == (None, None, "")
