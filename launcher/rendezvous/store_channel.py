"""The launchers' channel to each other: keys in the rendezvous store.

Nodes share nothing but torch's rendezvous store. Through it:

- a ``ShutdownWorkload`` requested on one node is published (:meth:`StoreChannel.publish_shutdown`);
  every other node sees it (:meth:`StoreChannel.poll_shutdown`, at most every
  :data:`CHECK_INTERVAL` seconds unless forced) and acknowledges it, and the requesting node
  keeps the store up until all did (:meth:`StoreChannel.wait_for_acks`, bounded);
- with the ``min-healthy`` policy a node whose worker failed marks itself unhealthy
  (:meth:`StoreChannel.mark_unhealthy`) and nodes count the healthy ones
  (:meth:`StoreChannel.healthy_nodes`);
- when a cycle fails, each node publishes its view of its ranks (what happened to each, its last
  progress, its stack's innermost frames: :meth:`StoreChannel.publish_view`) and reads the other
  nodes' views within a bound (:meth:`StoreChannel.gather_views`), so every node names the same
  root rank. The store is the round's (torch prefixes its keys with the rendezvous round), so a
  view belongs to one cycle;
- a node whose workers all succeeded says so (:meth:`StoreChannel.publish_training_ended`): a node
  still waiting for its own ranks to exit then does not restart them for a node that joins late
  (:meth:`StoreChannel.training_ended_on`);
- right after each rendezvous every node writes its host name under its group rank
  (:meth:`StoreChannel.publish_member`), so a node that sent no view can still be named
  (the missing nodes come back with their host names).

The store is the one torch's latest rendezvous round gave the agent (:meth:`StoreChannel.attach`).
It lives in the launcher of the node hosting the c10d endpoint and may be gone with that node,
so no operation here raises a store error: each one reports failure in its return value.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

STORE_PREFIX = "ft_launcher/"
SHUTDOWN_KEY = STORE_PREFIX + "shutdown"
SHUTDOWN_ACK_KEY = STORE_PREFIX + "shutdown_ack"
UNHEALTHY_PREFIX = STORE_PREFIX + "unhealthy/"
VIEW_PREFIX = STORE_PREFIX + "failure_view/"
VIEW_COUNT_KEY = VIEW_PREFIX + "count"
"""Counts the views published in this round: a node polls this one key, not every node's."""
MEMBER_PREFIX = STORE_PREFIX + "member/"
TRAINING_ENDED_KEY = STORE_PREFIX + "training_ended"
"""Set by a node whose workers all succeeded: the round's training is over."""
MAX_HOST_CHARS = 255
"""Longest host name written or read back (a DNS name is at most 253 characters)."""
VIEW_WAIT = 2.0
"""Longest a node waits for the other nodes' views of a failed cycle."""
VIEW_POLL_INTERVAL = 0.05
MAX_VIEW_BYTES = 256 * 1024
CHECK_INTERVAL = 0.5
ACK_POLL_INTERVAL = 0.1

STORE_ERRORS = (RuntimeError, OSError)
"""What a torch store operation raises when the store is unreachable or slow: c10d's
``DistNetworkError``/``DistStoreError`` (timeouts included) are ``RuntimeError`` subclasses
(``tests/unit/test_torch_hooks.py`` checks), socket-level failures ``OSError``."""


@dataclass(frozen=True)
class GatheredViews:
    """The other nodes' views of a failed cycle, and who sent none.

    Attributes:
        states: Every state the other nodes published (JSON dicts, unchecked).
        missing: Group rank -> host name (None if unreadable) of each node that published no view
            within the wait. Empty when the store failed meanwhile: nothing is known about them then.
        waited: The wait, in seconds.
    """

    states: list[dict[str, Any]]
    missing: dict[int, str | None]
    waited: float


@dataclass(frozen=True)
class ShutdownNotice:
    """A ``ShutdownWorkload`` published by another node."""

    node: str | None
    rank: int | None
    description: str


class StoreChannel:
    """Cross-node signals over the rendezvous store; see the module docstring.

    Args:
        store: The store (a ``torch.distributed.Store``); None until :meth:`attach`.
        check_interval: Least time between two store reads of :meth:`poll_shutdown`.
    """

    def __init__(self, store: Any = None, check_interval: float = CHECK_INTERVAL) -> None:
        self._store = store
        self._check_interval = check_interval
        self._next_check = 0.0

    def attach(self, store: Any) -> None:
        """Use the store of the latest rendezvous round."""
        self._store = store

    @property
    def attached(self) -> bool:
        return self._store is not None

    def _set(self, key: str, value: str, what: str) -> bool:
        """Write ``key``; False (and a warning naming ``what``) when there is no store or it fails
        (the store may be gone with its host node)."""
        if self._store is None:
            return False
        try:
            self._store.set(key, value)
        except STORE_ERRORS as err:
            logger.warning("could not publish %s in the rendezvous store: %s", what, err)
            return False
        return True

    # ------------------------------------------------------------------ ShutdownWorkload

    def publish_shutdown(self, node: str, rank: int | None, description: str) -> bool:
        """Tell every node that a rank here requested ``ShutdownWorkload``; False if it could not."""
        return self._set(SHUTDOWN_KEY, json.dumps({"node": node, "rank": rank, "description": description}),
                         "the shutdown request")

    def poll_shutdown(self, force: bool = False) -> ShutdownNotice | None:
        """A ``ShutdownWorkload`` published by another node, acknowledged here; else None.

        Reads the store at most every ``check_interval`` seconds unless ``force``.
        """
        now = time.monotonic()
        if self._store is None or (not force and now < self._next_check):
            return None
        self._next_check = now + self._check_interval
        try:
            if not self._store.check([SHUTDOWN_KEY]):
                return None
            raw = self._store.get(SHUTDOWN_KEY)
        except STORE_ERRORS as err:
            logger.debug("store check failed: %s", err)
            return None
        try:
            info = json.loads(raw)
        except (ValueError, RecursionError):  # only launchers write the key: its presence is the request
            info = {}
        if not isinstance(info, dict):
            info = {}
        try:
            self._store.add(SHUTDOWN_ACK_KEY, 1)
        except STORE_ERRORS as err:
            logger.debug("could not acknowledge the shutdown request: %s", err)
        rank = info.get("rank")
        return ShutdownNotice(node=info.get("node"), rank=rank if isinstance(rank, int) else None,
                              description=str(info.get("description") or ""))

    def wait_for_acks(self, expected: int, timeout: float) -> bool:
        """Wait until ``expected`` other nodes acknowledged the shutdown (bounded by ``timeout``).

        Returns:
            True if they all did; False on timeout or when the store cannot be read.
        """
        if self._store is None:
            return False
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._store.add(SHUTDOWN_ACK_KEY, 0) >= expected:
                    return True
            except STORE_ERRORS as err:
                logger.debug("cannot read shutdown acknowledgements: %s", err)
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(ACK_POLL_INTERVAL)

    # ------------------------------------------------------------------ min-healthy

    def mark_unhealthy(self, group_rank: int, cycle: int) -> bool:
        """Mark this node (``group_rank``) unhealthy; False if the store cannot be written."""
        return self._set(UNHEALTHY_PREFIX + str(group_rank), str(cycle), "this node's health")

    def healthy_nodes(self, group_world_size: int, live_ranks: Collection[int] | None = None) -> int | None:
        """Nodes of the group not marked unhealthy; None if the store cannot be read.

        Args:
            group_world_size: Nodes in the round.
            live_ranks: When known, the nodes of the round whose launcher is still alive: a node
                whose launcher is gone marked nothing, but is not healthy either.
        """
        if self._store is None:
            return None
        ranks = [r for r in range(group_world_size) if live_ranks is None or r in live_ranks]
        try:
            unhealthy = sum(1 for r in ranks if self._store.check([UNHEALTHY_PREFIX + str(r)]))
        except STORE_ERRORS as err:
            logger.warning("cannot read node health from the store: %s", err)
            return None
        return len(ranks) - unhealthy

    # ------------------------------------------------------------------ end of training

    def publish_training_ended(self, host: str) -> bool:
        """Tell every node that this node's workers all succeeded in this round; False if the
        store cannot be written."""
        return self._set(TRAINING_ENDED_KEY, host[:MAX_HOST_CHARS], "the end of the training")

    def training_ended_on(self) -> str | None:
        """The host of a node whose workers all succeeded in this round ("" if it gave no
        printable name); None if none did or the store cannot be read."""
        return self._read_host(TRAINING_ENDED_KEY, "whether the training ended")

    # ------------------------------------------------------------------ members

    def publish_member(self, group_rank: int, host: str) -> bool:
        """Write this node's host name under its group rank in this round's store (once per round)."""
        return self._set(MEMBER_PREFIX + str(group_rank), host[:MAX_HOST_CHARS], "this node's name")

    def member_host(self, group_rank: int) -> str | None:
        """The host name node ``group_rank`` published for this round; None if none can be read."""
        return self._read_host(MEMBER_PREFIX + str(group_rank), f"node {group_rank}'s name") or None

    def _read_host(self, key: str, what: str) -> str | None:
        """The host name stored under ``key`` ("" when it is empty or not printable); None when
        the key is not set or the store cannot be read (``what`` names it in the debug line)."""
        if self._store is None:
            return None
        try:
            if not self._store.check([key]):
                return None
            raw = self._store.get(key)
        except STORE_ERRORS as err:
            logger.debug("cannot read %s: %s", what, err)
            return None
        if isinstance(raw, (bytes, bytearray)):
            raw = bytes(raw[:MAX_HOST_CHARS * 4]).decode("utf-8", "replace")
        text = str(raw)[:MAX_HOST_CHARS].strip()
        return text if text.isprintable() else ""

    # ------------------------------------------------------------------ failure views

    def publish_view(self, group_rank: int, states: Sequence[dict[str, Any]]) -> bool:
        """Publish this node's ranks of a failed cycle (JSON-safe dicts); False if it could not."""
        if not self._set(VIEW_PREFIX + str(group_rank), json.dumps(list(states), default=str),
                         "this node's view of the failure"):
            return False
        try:
            self._store.add(VIEW_COUNT_KEY, 1)  # after the view: a count never runs ahead of the views
        except STORE_ERRORS as err:
            logger.warning("could not count this node's view of the failure in the rendezvous store: %s", err)
            return False
        return True

    def gather_views(self, group_world_size: int, group_rank: int, timeout: float = VIEW_WAIT,
                     expected: int | None = None) -> GatheredViews:
        """The other nodes' published views, waiting up to ``timeout`` s for the missing ones (or
        until ``expected`` nodes, this one included, published: the nodes still alive when some
        are known gone), and which nodes sent nothing, with their host names.

        The states may come from fewer nodes than exist: a node that saw no failure, or is gone,
        publishes nothing. A node counts as missing only when the store answered every read until
        the wait ended: when this node cannot reach the store, the others may be fine.
        """
        if self._store is None or group_world_size <= 1:
            return GatheredViews([], {}, timeout)
        others = [r for r in range(group_world_size) if r != group_rank]
        # While waiting, one read per poll of one counter: polling every node's key cost each node
        # O(N) reads per poll, O(N^2) for the job (bench/scale.py measured it).
        deadline = time.monotonic() + timeout
        try:
            wanted = group_world_size if expected is None else min(expected, group_world_size)
            while self._store.add(VIEW_COUNT_KEY, 0) < wanted and time.monotonic() < deadline:
                time.sleep(VIEW_POLL_INTERVAL)
            keys = [VIEW_PREFIX + str(node) for node in others]
            if self._store.check(keys):  # the usual case: every node published; one read for all
                return GatheredViews([s for raw in self._store.multi_get(keys) for s in _parse_view(raw)], {},
                                     timeout)
        except STORE_ERRORS as err:
            logger.debug("cannot read the other nodes' views of the failure: %s", err)
            return GatheredViews([], {}, timeout)
        # Some node published nothing (it saw no failure, or is gone): read the views one by one.
        missing: set[int] = set()
        found: list[dict[str, Any]] = []
        for node in others:
            key = VIEW_PREFIX + str(node)
            try:
                if not self._store.check([key]):
                    missing.add(node)
                    continue
                raw = self._store.get(key)
            except STORE_ERRORS as err:
                logger.debug("cannot read node %s's view of the failure: %s", node, err)
                return GatheredViews(found, {}, timeout)
            found.extend(_parse_view(raw))
        return GatheredViews(found, {node: self.member_host(node) for node in sorted(missing)}, timeout)


def _parse_view(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) > MAX_VIEW_BYTES:
            return []
        raw = raw.decode("utf-8", "replace")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # json's decoder recurses once per level of nesting
        return []
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []
