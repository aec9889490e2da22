"""A barrier-style rendezvous (``--rdzv-backend ft-barrier``): O(1) store operations per node per round.

torch's dynamic (c10d) rendezvous keeps one shared state (every participant, waiting node and
heartbeat) in one store key; every node rewrites it whole with ``compare_set`` to join, to leave
and for each keep-alive, and a write that lost to another node's is retried. A simultaneous
restart of N nodes is O(N^2) ``compare_set``\\ s of an O(N) state: at 64 simulated nodes on 2 cores
it never completed (docs/benchmarks.md). This handler, registered in torch's rendezvous handler
registry (an extension point: nothing of torch's rendezvous is copied), replaces that state with
counters and per-node keys under ``ft_barrier/<run id>/`` of the same TCPStore the c10d backend
uses (created by torch's own ``c10d_rendezvous_backend.create_backend``: the endpoint, ``is_host``,
``read_timeout`` and ``store_type`` mean what they mean for c10d).

Round ``r`` (1, 2, ...), per node:

- arrival: one ``add`` to ``r<r>/returning`` for a member of round ``r-1``, else to ``r<r>/new``;
  the result is its arrival index ``i`` among its kind (1-based);
- close: one ``compare_set`` of ``r<r>/closed`` from empty to ``"R,N"`` (the first writer wins,
  every node reads the winner's value): the ``R`` returning members and then the first ``N`` new
  nodes are in, ``R + N <= MAX``, returning members first (a member restarting after a failure
  does not lose its place to a spare that waited longer). It closes at once when the arriving
  member makes every live member of round ``r-1`` back (or MAX full), for the first round when
  the MAX-th node arrives; otherwise a node whose ``last_call_timeout`` since its arrival passed
  closes it with the nodes there, if they are at least MIN. A round after the first closes only
  once a member of the round before is back: spares alone never form a second job while one runs.
  The closer reads the two counters and creates the next round's (``add`` of 0: never overwrites);
- wait: a ``check`` of ``r<r>/closed`` per poll interval, then one ``get`` of it;
- result: in: rank ``i - 1`` (returning) or ``R + i - 1`` (new), world ``R + N``; out: a spare,
  which arrives at round ``r+1`` as a new node and waits there. ``num_nodes_waiting`` of a member
  of round ``r`` is round ``r+1``'s two counters: one ``multi_get``, cached.

Liveness: each member of a round increments its own key ``r<r>/hb/<rank>`` every
``keep_alive_interval`` and reads the key of the next member in rank order (its successor, the
ring skipping members known dead); a successor whose counter did not move for
``keep_alive_interval`` x ``keep_alive_max_attempt`` is claimed dead (a ``compare_set`` on
``r<r>/dead_claim/<rank>``; the winner appends it to a list: an ``add`` to ``r<r>/dead_count`` and a
``set`` of ``r<r>/dead/<n>``), and the watcher moves on to the next one. So 2 operations per node
per interval, whatever N; nobody rewrites shared state. Members alive = ``M`` - dead. The
keep-alive has its own store connection (:mod:`launcher.rendezvous.own_connection`): a call of the
agent's that waits in the store must not hold this node's heartbeats.

``set_closed`` sets ``shutdown`` and closes the round that waiting nodes are in (``r<r>/closed`` =
``shutdown``): they end with ``RendezvousClosedError`` (``RendezvousGracefulExitError`` for a
spare), as with c10d. ``is_closed`` is one ``check``.

What it does not do that c10d does (docs/multinode.md): liveness is watched only while a round
runs, so a node that arrived and then died before its round closed is counted in it (c10d drops
it once its keep-alive expires while the round forms): the rank assignment after that round fails,
a restart (:mod:`launcher.rendezvous.round_failure`, which counts it gone: :meth:`count_as_gone`),
and the next round forms without it; a node that gave up (join timeout) is likewise still
counted. A restart in which a live member does not come back (it died undetected, or is slow)
waits ``last_call_timeout`` before closing without it. A node declared dead is never undeclared
(only :meth:`BarrierRendezvousHandler.membership_view`'s count and live ranks use it). The keys of
past rounds stay in the store (a few per node per round).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

from launcher.rendezvous.own_connection import own_connection
from launcher.rendezvous.poll import parse_poll_interval

logger = logging.getLogger(__name__)

BACKEND = "ft-barrier"
"""The name users pass as ``--rdzv-backend``."""
SHUTDOWN = "shutdown"
"""The value of a round's ``closed`` key when the rendezvous was closed for good."""
DEFAULT_JOIN_TIMEOUT = 600
DEFAULT_LAST_CALL_TIMEOUT = 30
DEFAULT_KEEP_ALIVE_INTERVAL = 5
DEFAULT_KEEP_ALIVE_MAX_ATTEMPT = 3
# torch's defaults of the dynamic rendezvous (RendezvousTimeout, create_handler), so that a plain
# torchrun run behaves alike; ft_launcher's own defaults (launch_config.RDZV_DEFAULTS) apply on top.
RETURNING = "returning"
"""A round's counter of the members of the round before that arrived (their arrival index)."""
NEW = "new"
"""A round's counter of the other nodes that arrived (spares, late or new nodes)."""
DISABLE_SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch: "1" = the workers do not share the agent's store (the same meaning as for c10d)."""


def default_poll_interval(max_nodes: int) -> float:
    """How often a waiting node checks whether its round closed, and how long a member's answer
    to ``num_nodes_waiting`` is reused: ``max_nodes / 2000`` s, from 0.02 s to 0.5 s (each check is a
    few bytes, so the nodes together make at most about 2 000 reads per second up to 1 000 nodes)."""
    return min(0.5, max(0.02, max_nodes / 2000))


@dataclasses.dataclass(frozen=True)
class MembershipView:
    """What :mod:`launcher.rendezvous.membership` needs to know of the rendezvous (see :meth:`membership_view`).

    Attributes:
        waiting_members: Nodes waiting for the next round that were members of this node's round.
        waiting_new: Other nodes waiting for the next round (spares, late or new nodes).
        participants: Members of this node's round not known to be dead.
        live_ranks: Their ranks.
        min_nodes: ``--nnodes`` MIN.
        max_nodes: ``--nnodes`` MAX.
    """

    waiting_members: int
    waiting_new: int
    participants: int
    live_ranks: frozenset[int]
    min_nodes: int
    max_nodes: int


class BarrierRendezvousHandler(RendezvousHandler):
    """torch's ``RendezvousHandler`` with the barrier protocol of the module docstring.

    Args:
        store: The store (torch's c10d backend's TCPStore on the endpoint).
        run_id: The job's ``--rdzv-id``.
        min_nodes: ``--nnodes`` MIN.
        max_nodes: ``--nnodes`` MAX.
        local_addr: This node's address for the workers' bootstrap store (None: its FQDN).
        join_timeout: Seconds a node may wait for its round to close (not a spare: it waits
            until it is let in or the rendezvous closes, as c10d's redundancy list).
        last_call_timeout: Seconds to wait for more nodes once MIN arrived (MIN < MAX).
        keep_alive_interval: Seconds between a member's heartbeats.
        keep_alive_max_attempt: Heartbeats missed before the successor is declared dead.
        poll_interval: See :func:`default_poll_interval` (None: that default).
    """

    def __init__(self, store: Any, run_id: str, min_nodes: int, max_nodes: int, local_addr: str | None = None,
                 join_timeout: float = DEFAULT_JOIN_TIMEOUT, last_call_timeout: float = DEFAULT_LAST_CALL_TIMEOUT,
                 keep_alive_interval: float = DEFAULT_KEEP_ALIVE_INTERVAL,
                 keep_alive_max_attempt: int = DEFAULT_KEEP_ALIVE_MAX_ATTEMPT,
                 poll_interval: float | None = None) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"--nnodes {min_nodes}:{max_nodes}: MIN must be from 1 to MAX")
        self._store = store
        self._run_id = run_id
        self._prefix = f"ft_barrier/{run_id}/"
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self._local_addr = local_addr
        self.join_timeout, self.last_call_timeout = float(join_timeout), float(last_call_timeout)
        self.keep_alive_interval, self.keep_alive_max_attempt = float(keep_alive_interval), int(keep_alive_max_attempt)
        self.poll_interval = poll_interval if poll_interval is not None else default_poll_interval(max_nodes)
        self._round: int | None = None  # the last round this node was a member of
        self._rank = 0
        self._world = 0
        self._keep_alive: _KeepAlive | None = None
        self._keep_alive_store: Any = None  # its own connection (launcher.rendezvous.own_connection)
        self._bootstrap_server: Any = None  # the workers' store server, while this node is (was) rank 0
        self._view: MembershipView | None = None
        self._view_at = float("-inf")
        self._dead: list[int] = []  # the dead members of this node's round, as read so far
        self._lock = threading.Lock()  # the agent's thread and membership's reads share the cached view

    # ------------------------------------------------------------------ keys

    def _key(self, round_: int, name: str) -> str:
        return f"{self._prefix}r{round_}/{name}"

    # ------------------------------------------------------------------ torch's interface

    def get_backend(self) -> str:
        """See torch's ``RendezvousHandler``."""
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        """See torch's ``RendezvousHandler``: the workers share the agent's store unless torch's
        ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` says not (as torch's dynamic rendezvous)."""
        return os.getenv(DISABLE_SHARED_STORE_ENV, "0") != "1"

    def get_run_id(self) -> str:
        """See torch's ``RendezvousHandler``."""
        return self._run_id

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and wait until it closes with this node in it (see the module).

        Raises:
            RendezvousClosedError: The rendezvous was closed (``RendezvousGracefulExitError`` for a
                node that waited as a spare).
            RendezvousTimeoutError: The round did not close within the join timeout.
        """
        self._stop_keep_alive()
        returning = self._round is not None
        round_ = self._round + 1 if returning else int(self._store.add(self._prefix + "last_closed", 0)) + 1
        # A member restarting, or the job's first round, waits at most join_timeout for the round to
        # form; a node arriving while a round runs is a spare until a restart lets it in (c10d too).
        deadline = time.monotonic() + self.join_timeout if returning or round_ == 1 else None
        spare = not returning and round_ > 1
        while True:
            index = int(self._store.add(self._key(round_, RETURNING if returning else NEW), 1))
            closed = self._await_close(round_, returning, index, deadline)
            if closed is None:
                raise (RendezvousGracefulExitError if spare else RendezvousClosedError)(
                    f"the rendezvous {self._run_id!r} is closed (round {round_})")
            kept, admitted = closed
            if index <= (kept if returning else admitted):
                break
            logger.info("rendezvous: round %s closed with %s node(s); this node waits as a spare for round %s",
                        round_, kept + admitted, round_ + 1)
            round_, returning, spare, deadline = round_ + 1, False, True, None
        return self._joined(round_, index - 1 if returning else kept + index - 1, kept + admitted)

    def is_closed(self) -> bool:
        """See torch's ``RendezvousHandler`` (one ``check``)."""
        return bool(self._store.check([self._prefix + SHUTDOWN]))

    def set_closed(self) -> None:
        """Close the rendezvous for good, and the round that nodes wait in (see the module)."""
        self._store.set(self._prefix + SHUTDOWN, "1")
        last_closed = int(self._store.add(self._prefix + "last_closed", 0))
        for round_ in sorted({last_closed + 1, (self._round or 0) + 1}):
            self._store.compare_set(self._key(round_, "closed"), "", SHUTDOWN)

    def num_nodes_waiting(self) -> int:
        """Nodes that arrived at the round after this node's (one read per poll interval at most)."""
        view = self.membership_view()
        return 0 if view is None else view.waiting_members + view.waiting_new

    def shutdown(self) -> bool:
        """Stop this node's heartbeats and close the rendezvous; False (logged) if the store failed."""
        self._stop_keep_alive()
        try:
            self.set_closed()
            return True
        except (RuntimeError, OSError) as err:  # torch's store errors are RuntimeErrors (DistError)
            logger.warning("rendezvous: could not close the rendezvous %r: %s: %s", self._run_id,
                           type(err).__name__, err)
            return False

    # ------------------------------------------------------------------ for launcher.rendezvous.membership

    def membership_view(self) -> MembershipView | None:
        """The nodes waiting for the next round and this round's live members, read at most once per
        poll interval and per ``MAX / 1000`` s (so that the running nodes' reads together stay under
        about 1 000 per second, whatever N): one ``multi_get`` of three counters, plus the new
        entries of the dead list when it grew. None before this node joined a round."""
        with self._lock:
            if self._round is None:
                return None
            now = time.monotonic()
            if self._view is not None and now - self._view_at < max(self.poll_interval, self.max_nodes / 1000):
                return self._view
            round_ = self._round
            new, returning, dead = (int(v) for v in self._store.multi_get(
                [self._key(round_ + 1, NEW), self._key(round_ + 1, RETURNING), self._key(round_, "dead_count")]))
            self._read_dead(round_, dead)
            dead_ranks = frozenset(self._dead)
            self._view = MembershipView(
                waiting_members=returning, waiting_new=new,
                participants=self._world - len(dead_ranks),
                live_ranks=frozenset(range(self._world)) - dead_ranks,
                min_nodes=self.min_nodes, max_nodes=self.max_nodes)
            self._view_at = now
            return self._view

    def count_as_gone(self, ranks: list[int]) -> None:
        """Count members of this node's round as gone, as its keep-alive ring would (see the module):
        they never took part in the rank assignment after the round closed
        (:mod:`launcher.rendezvous.round_failure`), so the next round does not wait for them."""
        if self._round is None:
            return
        for rank in ranks:
            if rank != self._rank and _claim_dead(self._store, self._key, self._round, rank, self._rank):
                logger.warning("rendezvous: rank %s of round %s never took part in the rank assignment; "
                               "counted as gone", rank, self._round)

    def set_poll_interval(self, seconds: float) -> None:
        """Use ``seconds`` as the poll interval (``--rdzv-conf poll_interval``; see
        :mod:`launcher.rendezvous.poll`)."""
        self.poll_interval = float(seconds)

    # ------------------------------------------------------------------ the protocol

    def _await_close(self, round_: int, returning: bool, index: int,
                     deadline: float | None) -> tuple[int, int] | None:
        """Wait until round ``round_`` closes; the members it kept and the new nodes it admitted
        (None: the rendezvous was closed for good).

        Raises:
            RendezvousTimeoutError: ``deadline`` (monotonic) passed first.
        """
        arrived_at = time.monotonic()
        if returning:
            # every live member of the round before is back (or enough to fill MAX): close at once
            live = self._world - int(self._store.add(self._key(round_ - 1, "dead_count"), 0))
            if index >= min(self.max_nodes, live):
                self._close(round_, self._closable(round_))
        elif round_ == 1 and index >= self.max_nodes:
            self._close(round_, self._closable(round_))
        # The last call: once at least MIN nodes are there, wait last_call_timeout for more, then
        # close with those there. This node knows MIN was there when it arrived if its own index
        # says so (the MIN-th node's call ends first); otherwise from its reads of the counters.
        enough_since = arrived_at if index >= self.min_nodes and (returning or round_ == 1) else None
        next_look = arrived_at + self.last_call_timeout
        closed_key = self._key(round_, "closed")
        while not self._store.check([closed_key]):
            now = time.monotonic()
            if now >= next_look:
                counts = self._closable(round_)
                if counts is None:
                    enough_since = None
                elif enough_since is None:
                    enough_since = now
                if counts is not None and now - enough_since >= self.last_call_timeout:
                    self._close(round_, counts)
                    continue
                next_look = now + (self.last_call_timeout if enough_since is None
                                   else enough_since + self.last_call_timeout - now)
            if deadline is not None and now >= deadline:
                raise RendezvousTimeoutError(
                    f"the rendezvous {self._run_id!r} did not complete round {round_} within {self.join_timeout:g} s "
                    f"(join_timeout; --nnodes {self.min_nodes}:{self.max_nodes})")
            time.sleep(self.poll_interval)
        value = self._store.get(closed_key).decode()
        if value == SHUTDOWN:
            return None
        kept, admitted = value.split(",")
        return int(kept), int(admitted)

    def _closable(self, round_: int) -> tuple[int, int] | None:
        """The members round ``round_`` would keep and the new nodes it would admit if it closed
        now (two reads), or None if it may not close: fewer than MIN nodes there, or a round after
        the first with no member of the round before back (spares alone never form a second job
        while one runs: they wait for its members, as on c10d's lists). Returning members first,
        then new nodes in arrival order, up to MAX."""
        kept = int(self._store.add(self._key(round_, RETURNING), 0))
        if round_ > 1 and kept == 0:
            return None
        kept = min(kept, self.max_nodes)
        admitted = min(int(self._store.add(self._key(round_, NEW), 0)), self.max_nodes - kept)
        return (kept, admitted) if kept + admitted >= self.min_nodes else None

    def _close(self, round_: int, counts: tuple[int, int] | None) -> None:
        """Close ``round_`` with ``counts`` (see :meth:`_closable`; None: nothing to do); the first
        writer wins."""
        if counts is None:
            return
        # created before the round can be seen closed, so that a member's multi_get never blocks
        self._store.add(self._key(round_ + 1, NEW), 0)
        self._store.add(self._key(round_ + 1, RETURNING), 0)
        self._store.add(self._key(round_, "dead_count"), 0)
        value = f"{counts[0]},{counts[1]}"
        if self._store.compare_set(self._key(round_, "closed"), "", value).decode() == value:
            self._store.set(self._prefix + "last_closed", str(round_))
            logger.info("rendezvous: round %s closed with %s returning member(s) and %s new node(s) (--nnodes %s:%s)",
                        round_, *counts, self.min_nodes, self.max_nodes)

    def _joined(self, round_: int, rank: int, world: int) -> RendezvousInfo:
        """This node is rank ``rank`` of round ``round_`` (``world`` members): its result for torch."""
        with self._lock:
            self._round, self._rank, self._world = round_, rank, world
            self._view, self._view_at, self._dead = None, float("-inf"), []
        store = dist.PrefixStore(self._key(round_, "store"), self._store)
        logger.info("rendezvous: joined round %s of %r as rank %s of %s", round_, self._run_id, rank, world)
        if world > 1:
            if self._keep_alive_store is None:
                self._keep_alive_store = own_connection(self._store)
            self._keep_alive = _KeepAlive(self._keep_alive_store, self._key, round_, rank, world,
                                          self.keep_alive_interval, self.keep_alive_max_attempt)
            self._keep_alive.start()
        return RendezvousInfo(store, rank, world, self._bootstrap_info(store, rank))

    def _bootstrap_info(self, store: Any, rank: int) -> RendezvousStoreInfo:
        """Where the workers find their store, as torch's dynamic rendezvous tells them: rank 0's
        address and the port of a store server it hosts (kept across rounds), or, with
        ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, a free port there (torch's own helper)."""
        if not self.use_agent_store:
            return RendezvousStoreInfo.build(rank, store, local_addr=self._local_addr)
        server_port = 0
        if rank == 0:
            if self._bootstrap_server is None:
                self._bootstrap_server = dist.TCPStore(self._local_addr or socket.getfqdn(), 0, is_master=True,
                                                       multi_tenant=True)
            server_port = self._bootstrap_server.port
        # read every round: rank 0 may be another node than last round's
        return RendezvousStoreInfo.build(rank, store, local_addr=self._local_addr, server_port=server_port)

    def _read_dead(self, round_: int, count: int) -> None:
        """Append the entries of round ``round_``'s dead list not read yet (up to ``count``); an
        entry whose writer has not set it yet is read at the next call."""
        keys = [self._key(round_, f"dead/{n}") for n in range(len(self._dead) + 1, count + 1)]
        if keys and self._store.check(keys):
            self._dead.extend(int(v) for v in self._store.multi_get(keys))

    def _stop_keep_alive(self) -> None:
        if self._keep_alive is not None:
            self._keep_alive.stop()
            self._keep_alive = None


class _KeepAlive:
    """A member's heartbeat and its watch of its successor (see the module docstring).

    Args:
        store: The rendezvous store.
        key: The handler's key function (round, name) -> key.
        round_: The round this node is a member of.
        rank: Its rank there.
        world: The round's member count.
        interval: Seconds between heartbeats (``keep_alive_interval``).
        max_attempt: Heartbeats the successor may miss (``keep_alive_max_attempt``).
    """

    def __init__(self, store: Any, key: Callable[[int, str], str], round_: int, rank: int, world: int,
                 interval: float, max_attempt: int) -> None:
        self._store, self._key = store, key
        self._round, self._rank, self._world = round_, rank, world
        self._interval, self._expiry = interval, interval * max_attempt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ft-barrier-keepalive-r{round_}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the thread to end (after :meth:`stop`)."""
        self._thread.join(timeout)

    def _run(self) -> None:
        dead: set[int] = set()
        watched, seen, moved_at = None, None, time.monotonic()
        while not self._stop.is_set():
            try:
                self._store.add(self._key(self._round, f"hb/{self._rank}"), 1)
                if watched is None:
                    watched = self._successor(dead)
                    seen, moved_at = None, time.monotonic()
                if watched is not None:
                    beat = int(self._store.add(self._key(self._round, f"hb/{watched}"), 0))
                    now = time.monotonic()
                    if beat != seen:
                        seen, moved_at = beat, now
                    elif now - moved_at >= self._expiry:
                        self._declare_dead(watched, now - moved_at)
                        dead.add(watched)
                        watched = None
            except (RuntimeError, OSError) as err:  # the store's host gone: the store watchdog reports it
                logger.debug("rendezvous: heartbeat of round %s failed: %s", self._round, err)
            self._stop.wait(self._interval)

    def _successor(self, dead: set[int]) -> int | None:
        for step in range(1, self._world):
            rank = (self._rank + step) % self._world
            if rank not in dead:
                return rank
        return None

    def _declare_dead(self, rank: int, silent_s: float) -> None:
        if _claim_dead(self._store, self._key, self._round, rank, self._rank):
            logger.warning("rendezvous: rank %s of round %s sent no heartbeat for %.1f s; counted as gone",
                           rank, self._round, silent_s)


def _claim_dead(store: Any, key: Callable[[int, str], str], round_: int, rank: int, claimer: int) -> bool:
    """Append ``rank`` to round ``round_``'s dead list unless it is there; whether this call put it there.
    The claim's value is unique to the call: a member that claims a rank twice (its keep-alive, then
    :meth:`BarrierRendezvousHandler.count_as_gone`) must find it taken, not count it again."""
    mine = f"{claimer}:{secrets.token_hex(8)}"
    if store.compare_set(key(round_, f"dead_claim/{rank}"), "", mine).decode() != mine:
        return False  # another watcher declared it
    count = int(store.add(key(round_, "dead_count"), 1))
    store.set(key(round_, f"dead/{count}"), str(rank))
    return True


def create_handler(params: RendezvousParameters) -> BarrierRendezvousHandler:
    """The handler for torch's registry, from ``params`` (the store as torch's c10d backend makes it).

    Raises:
        ValueError: A setting out of range (torch's registry turns it into a usage error).
        RendezvousConnectionError: The store cannot be reached (torch's backend).
    """
    poll = params.get("poll_interval", None)
    # the same check as ft_launcher's --rdzv-conf one (0.01 to 1 s): plain torchrun reaches only this
    poll_interval = parse_poll_interval(str(poll)) if poll is not None else None
    _, store = create_backend(params)  # torch's c10d backend: endpoint, is_host, read_timeout, store_type

    def number(key: str, default: float) -> float:
        value = params.get_as_int(key, None)
        if value is None:
            return default
        if value <= 0:
            raise ValueError(f"the rendezvous setting {key} must be a positive whole number, got {value}")
        return value

    return BarrierRendezvousHandler(
        store, params.run_id, params.min_nodes, params.max_nodes, local_addr=params.local_addr,
        join_timeout=number("join_timeout", DEFAULT_JOIN_TIMEOUT),
        last_call_timeout=number("last_call_timeout", DEFAULT_LAST_CALL_TIMEOUT),
        keep_alive_interval=number("keep_alive_interval", DEFAULT_KEEP_ALIVE_INTERVAL),
        keep_alive_max_attempt=int(number("keep_alive_max_attempt", DEFAULT_KEEP_ALIVE_MAX_ATTEMPT)),
        poll_interval=poll_interval)

