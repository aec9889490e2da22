"""A round that closed counting a node that is gone: a restart, not the end of the launcher.

Right after a round closes, torch's agent assigns the workers' ranks through the round's store
(``SimpleElasticAgent._assign_worker_ranks``): every member writes its role info, rank 0 reads
them all and writes each member's ranks, and every member reads its own. A member that died
after it joined the round but before the round closed (ft-barrier counts it: liveness is watched
only while a round runs; c10d too when it died less than its keep-alive expiry before the round
completed) writes nothing, so the others' reads waited the store's whole timeout (60 s) and the
``DistStoreError`` ended every surviving launcher with a traceback, no restart used.

:func:`assign_ranks` runs torch's assignment with two changes:

- its wait is bounded by the rendezvous' own liveness rule (:func:`exchange_wait`): a member
  writes its role info as soon as it sees the round closed (within a poll interval); one that
  has not after its keep-alive expiry (``keep_alive_interval`` x ``keep_alive_max_attempt``, the
  time after which both backends count a silent member as gone), and at least
  :data:`MIN_EXCHANGE_WAIT`, is taken for gone. Never longer than the store's own timeout;
- a store timeout there becomes :class:`RoundFailed`, which names the members whose role info
  never came, what timed out and after how long. The agent counts it as a restart (one of
  ``--max-restarts``) and joins the next round; for ft-barrier :func:`forget_missing` first
  counts the missing members as gone (its keep-alive ring's claim), so that the next round
  closes as soon as the live members are back instead of waiting ``last_call_timeout``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousError

from launcher.events.log import EventLog
from launcher.events.records import RoundFailure

logger = logging.getLogger(__name__)

ROLE_INFO_PREFIX = "torchelastic/role_info/"
"""The key under which torch's rank assignment has each member write its role info, by group
rank (``tests/torch_source_checks.py`` checks that torch still uses it)."""
MIN_EXCHANGE_WAIT = 10.0
"""Least seconds the rank assignment waits for the other members, whatever the keep-alive settings
(ft_launcher's defaults give 1 x 3 s): a loaded node may take a few seconds to see the close."""

T = TypeVar("T")


class RoundFailed(RendezvousError):
    """The round closed, but a member never took part in the rank assignment.

    Attributes:
        group_rank: This node's group rank in the failed round.
        world: The round's member count.
        missing: Group ranks whose role info never came (empty: unknown, e.g. rank 0 wrote no ranks).
        waited: Seconds the assignment waited.
        what: What timed out (torch's store error).
    """

    def __init__(self, group_rank: int, world: int, missing: list[int], waited: float, what: str) -> None:
        self.group_rank, self.world, self.missing, self.waited, self.what = group_rank, world, missing, waited, what
        who = (f"rank {missing[0]}" if len(missing) == 1 else f"ranks {missing}") if missing else "a member"
        super().__init__(
            f"the round failed: {who} of its {world} node(s) (this node is rank {group_rank}) never took part in "
            f"the rank assignment: the node died after it joined the round, before the round closed; "
            f"waited {waited:.1f} s ({what})")


def keep_alive_expiry(handler: Any) -> float | None:
    """Seconds of silence after which ``handler``'s backend counts a member as gone (None: unknown)."""
    interval = getattr(handler, "keep_alive_interval", None)  # ft-barrier's handler
    attempts = getattr(handler, "keep_alive_max_attempt", None)
    if interval is None:
        settings = getattr(handler, "_settings", None)  # torch's dynamic (c10d) handler: RendezvousSettings
        interval = getattr(settings, "keep_alive_interval", None)
        attempts = getattr(settings, "keep_alive_max_attempt", None)
    if isinstance(interval, timedelta):
        interval = interval.total_seconds()
    if not isinstance(interval, (int, float)) or not isinstance(attempts, int):
        return None
    return float(interval) * attempts


def exchange_wait(handler: Any, store_timeout: float) -> float:
    """How long the rank assignment after a round waits for the other members (see the module)."""
    expiry = keep_alive_expiry(handler)
    if expiry is None:
        return store_timeout
    return min(store_timeout, max(expiry, MIN_EXCHANGE_WAIT))


def assign_ranks(assign: Callable[[], T], store: Any, group_rank: int, world: int, handler: Any) -> T:
    """Run torch's rank assignment ``assign`` on ``store``, waiting at most :func:`exchange_wait`.

    Raises:
        RoundFailed: The store timed out: a member never wrote its role info (or rank 0 its ranks).
    """
    previous = _timeout(store)
    bound = exchange_wait(handler, previous) if previous is not None else None
    if bound is not None and bound < previous:
        store.set_timeout(timedelta(seconds=bound))
    started = time.monotonic()
    try:
        return assign()
    except dist.DistStoreError as err:  # a timeout (the store's host gone is a DistNetworkError: not caught)
        waited = time.monotonic() - started
        raise RoundFailed(group_rank, world, _missing(store, world), waited, _first_line(err)) from None
    finally:
        if bound is not None and bound < previous:
            with contextlib.suppress(RuntimeError):
                store.set_timeout(timedelta(seconds=previous))


def report(events: EventLog, cycle: int, failed: RoundFailed, restarts_left: int, max_restarts: int) -> None:
    """Record ``failed`` (a ``round_failed`` record) and, when a restart is left, say in one line
    that the next round forms without the missing members."""
    events.record_event(RoundFailure(
        cycle=cycle, group_rank=failed.group_rank, group_world_size=failed.world, missing_ranks=failed.missing,
        waited_s=round(failed.waited, 4), what=failed.what, restarts_left=restarts_left))
    if restarts_left > 0:
        logger.warning("%s; restarting (%s/%s restarts left): the next round forms without it", failed,
                       restarts_left - 1, max_restarts)


def forget_missing(handler: Any, failed: RoundFailed) -> None:
    """Tell ``handler`` that the failed round's missing members are gone, where it can be told
    (ft-barrier: :meth:`~launcher.rendezvous.barrier.BarrierRendezvousHandler.count_as_gone`;
    c10d drops them itself once their keep-alive expired)."""
    count_as_gone = getattr(handler, "count_as_gone", None)
    if count_as_gone is not None and failed.missing:
        try:
            count_as_gone(failed.missing)
        except (RuntimeError, OSError) as err:  # the store's host gone: the next round says so
            logger.warning("rendezvous: could not count rank(s) %s as gone: %s", failed.missing, err)


def _timeout(store: Any) -> float | None:
    try:
        return store.timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def _missing(store: Any, world: int) -> list[int]:
    """The group ranks whose role info is not in ``store``; rank 0 when every member's is there (it
    then wrote no ranks); empty if the store cannot be read."""
    keys = [f"{ROLE_INFO_PREFIX}{rank}" for rank in range(world)]
    try:
        if store.check(keys):
            return [0]
        return [rank for rank, key in enumerate(keys) if not store.check([key])]
    except (RuntimeError, OSError):
        return []


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else 'no message'}"
