"""A second connection to the rendezvous store, for a thread that must not wait behind another's call.

torch's ``TCPStore`` client serialises its operations on one connection (one lock for the whole
request and reply): a ``get`` or ``multi_get`` that waits for a key holds every other thread's
call on that client for as long, up to the store's timeout. ft-barrier's keep-alive shared the
agent's client, so while the agent waited 60 s in torch's rank assignment for a member that had
died, this node sent no heartbeat either, and a live node could be counted as gone by the
member that watches it. The keep-alive therefore gets its own connection (one more per node for
the job, kept across rounds).
"""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

logger = logging.getLogger(__name__)


def own_connection(store: Any) -> Any:
    """A new client of the same ``TCPStore`` as ``store`` (``store`` itself for any other store, or
    when the new connection cannot be made: then logged, and calls share the one connection)."""
    if not isinstance(store, dist.TCPStore):
        return store
    try:
        if hasattr(store, "clone"):  # torch >= 2.6
            return store.clone()
        return dist.TCPStore(store.host, store.port, is_master=False, timeout=store.timeout,
                             use_libuv=store.libuvBackend)
    except (RuntimeError, OSError) as err:
        logger.warning("rendezvous: no second connection to the store (%s); the keep-alive shares the agent's", err)
        return store
