"""Which waiting nodes make the agent restart its workload: a proxy around torch's rendezvous handler.

torch's agent, while its workers are healthy, asks the rendezvous handler how many nodes wait
(``num_nodes_waiting``) and restarts the workload whenever that number is above 0. torch's dynamic
(c10d) rendezvous answers with the size of its wait list. A node lands on that list when it joins
while the round is complete and has room (fewer participants than ``--nnodes`` MAX), or when a
participant left (its keep-alive expired) and a spare moves up from the spare (redundancy) list;
when the next round fills up, the nodes that did not get a place stay on the wait list instead of
moving back to the spare list. From then on every node of the job sees "nodes waiting" after every
round and restarts again, forever (two spares that joined while a node restarted are enough).

:class:`MembershipHandler` wraps torch's handler (every attribute is the real handler's) and decides
from the rendezvous state which waiting nodes count:

- a waiting node that was a member of this node's round always counts: it is a member restarting
  (a failure on another node), and torch's way of restarting every node needs it;
- under ``any-failed`` a new node counts while the round has a free slot now: fewer participants
  than MAX (the round was not full, or a member left: excluded, killed, lost), so the workload
  restarts to take it in;
- under ``min-healthy`` a new node counts only once the participants still in the round (the
  nodes whose launcher is alive) are fewer than ``--nnodes`` MIN: until then it is a spare and does
  not interrupt training; below the minimum the workload restarts with the spares.

A handler with its own ``membership_view()`` (``--rdzv-backend ft-barrier``,
:mod:`launcher.rendezvous.barrier`) answers these questions with counts instead of torch's state.

A waiting node that does not count is a spare; each time the set of spares changes, one INFO line
says so (``N node(s) wait as spares``). Where the state cannot be read (a handler without torch's
dynamic-rendezvous state, a torch that changed it), the handler answers with torch's own count and
logs one warning. ``tests/torch_source_checks.py`` checks the private attributes read here on every
supported torch.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ft_core.wire.restart_policies import RestartPolicyName
from launcher.rendezvous import store_counter

logger = logging.getLogger(__name__)

DEAD_CONFIRM_POLL = 0.1
"""Seconds between the syncs that confirm a member is dead (:meth:`MembershipHandler.dead_group_ranks`)."""


class MembershipHandler:
    """torch's rendezvous handler, with a ``num_nodes_waiting`` that counts only nodes that fit.

    Args:
        handler: The handler from torch's rendezvous registry.
        restart_policy: ``any-failed`` or ``min-healthy`` (the ``restart_policy`` config field).
    """

    def __init__(self, handler: Any, restart_policy: str) -> None:
        # set through __dict__ so that __getattr__ never sees these names missing
        self.__dict__["_handler"] = handler
        self.__dict__["_min_healthy"] = RestartPolicyName(restart_policy) is RestartPolicyName.MIN_HEALTHY
        self.__dict__["_round_members"] = None  # frozenset of this node's round, once joined
        self.__dict__["_round_ranks"] = None  # node -> group rank of this node's round, once joined
        self.__dict__["_spares"] = frozenset()  # the waiting nodes that did not count last time
        self.__dict__["_warned"] = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # e.g. a cache duration set on the handler must reach torch's handler, not the proxy
        setattr(self._handler, name, value)

    @property
    def wrapped(self) -> Any:
        """The handler from torch's registry."""
        return self._handler

    def next_rendezvous(self) -> Any:
        """torch's ``next_rendezvous``; remembers the members of the round this node joined."""
        with store_counter.phase(store_counter.RENDEZVOUS):  # FT_STORE_COUNTS: what the rendezvous costs
            info = self._handler.next_rendezvous()
        if self._has_view():
            return info  # ft-barrier: its view tells restarting members apart itself (no state to read)
        ranks = self._read(lambda state: dict(state.participants))
        self.__dict__["_round_ranks"] = ranks
        self.__dict__["_round_members"] = frozenset(ranks) if ranks is not None else None
        self.__dict__["_spares"] = frozenset()
        return info

    def num_nodes_waiting(self) -> int:
        """How many waiting nodes should make this node restart its workload (see the module).

        Returns:
            torch's count where it is 0 or the rendezvous state cannot be read; otherwise the
            waiting nodes that were members of this node's round, plus the new ones when they
            may join now: under ``any-failed`` while the round has fewer participants than
            ``--nnodes`` MAX, under ``min-healthy`` once it has fewer than MIN.
        """
        with store_counter.phase(store_counter.POLL):  # FT_STORE_COUNTS: what the agent's polls cost
            torch_count = int(self._handler.num_nodes_waiting())  # syncs the state, records torch's errors
        if torch_count == 0:
            self.__dict__["_spares"] = frozenset()
            return 0
        if self._has_view():  # ft-barrier (launcher.rendezvous.barrier): counts, cached with torch_count's read
            view = self._handler.membership_view()
            if view is None:
                return torch_count
            # stand-ins for the nodes (the view has counts only): the spares' line comes again when their number changes
            restarting, new = range(view.waiting_members), frozenset(range(view.waiting_new))
            participants, min_nodes, max_nodes = view.participants, view.min_nodes, view.max_nodes
        else:
            members = self._round_members
            seen = self._read(lambda state: (frozenset(state.wait_list), len(state.participants)))
            bounds = self._read_bounds()
            if members is None or seen is None or bounds is None:
                return torch_count
            waiting, participants = seen
            min_nodes, max_nodes = bounds
            restarting = waiting & members
            new = waiting - members
        # participants: the nodes of the round whose launcher is alive (torch drops a node from
        # the state once its keep-alive expired; an excluded or stopped node leaves that way)
        limit, limit_name = (min_nodes, "MIN") if self._min_healthy else (max_nodes, "MAX")
        spares = frozenset() if participants < limit else new
        if spares and spares != self._spares:
            logger.info("rendezvous: %s node(s) wait as spares (%s: %s node(s) in the round, --nnodes %s %s); "
                        "the workload goes on", len(spares),
                        RestartPolicyName.MIN_HEALTHY.value if self._min_healthy else "no free slot",
                        participants, limit_name, limit)
        self.__dict__["_spares"] = spares
        counted = len(restarting) + len(new - spares)
        if counted:
            logger.debug("rendezvous: %s node(s) wait, %s count (%s restarting member(s), %s new; %s node(s) in "
                         "the round, --nnodes %s %s)", torch_count, counted, len(restarting), len(new - spares),
                         participants, limit_name, limit)
        return counted

    def spares_waiting(self) -> int | None:
        """The nodes waiting in the rendezvous that are not members of this node's round: spares
        (torch's redundancy list: the round was full when they came), nodes on the wait list
        that were not members, ft-barrier's new nodes. As of the state's last sync (every poll
        of :meth:`num_nodes_waiting`). None if not known (no round yet, the state unreadable).

        Whether a node can be replaced (the straggler detector's replace action) asks this: a
        spare takes the leaving node's place, so the job goes on even at ``--nnodes`` MIN.
        """
        if self._has_view():
            view = self._handler.membership_view()
            return view.waiting_new if view is not None else None
        members = self._round_members
        seen = self._read(lambda state: (frozenset(state.wait_list), frozenset(state.redundancy_list)))
        if members is None or seen is None:
            return None
        waiting, redundant = seen
        return len((waiting | redundant) - members)

    def live_group_ranks(self) -> frozenset[int] | None:
        """The ranks in this round of the nodes whose launcher is alive (torch drops a node from the
        round's participants once its keep-alive expired), as of the state's last sync (every
        poll of :meth:`num_nodes_waiting`); None if the state cannot be read."""
        if self._has_view():
            view = self._handler.membership_view()
            return view.live_ranks if view is not None else None
        ranks = self._read(lambda state: frozenset(state.participants.values()))
        return frozenset(r for r in ranks if isinstance(r, int)) if ranks is not None else None

    def dead_group_ranks(self, confirm: float = 0.0) -> frozenset[int] | None:
        """The group ranks of this node's round whose node torch declared dead: its keep-alive
        lapsed, so torch removed it from the state, and it is nowhere in the rendezvous now (not a
        participant, not waiting, not a spare). A member that restarts leaves the round and joins
        the wait list in two steps; in between it is nowhere for a moment, so with ``confirm`` > 0
        the state is synced again for that many seconds and a member seen again is not dead.

        Returns:
            The dead members' group ranks (empty: none); None when not known (``ft-barrier``'s
            handler, no round yet, the state unreadable).
        """
        ranks = self._round_ranks
        if self._has_view() or ranks is None:
            return None
        dead = self._absent(ranks)
        deadline = time.monotonic() + confirm
        while dead and time.monotonic() < deadline:
            time.sleep(DEAD_CONFIRM_POLL)
            try:
                self._handler.num_nodes_waiting()  # syncs torch's view of the state
            except Exception as err:  # noqa: BLE001 - torch's store errors vary; unknown is the answer
                logger.debug("rendezvous: cannot sync the state to confirm a dead member: %s", err)
                return None
            again = self._absent(ranks)
            if again is None:
                return None
            dead &= again
        return frozenset(ranks[node] for node in dead) if dead is not None else None

    def _absent(self, ranks: dict[Any, int]) -> set[Any] | None:
        """The members of ``ranks`` found nowhere in the state (None if it cannot be read)."""
        alive = self._read(lambda state: frozenset().union(
            state.last_heartbeats, state.participants, state.wait_list, state.redundancy_list))
        return None if alive is None else {node for node in ranks if node not in alive}

    def _has_view(self) -> bool:
        """Whether the handler answers for itself (``membership_view()``, e.g. ft-barrier's: waiting
        members and new nodes as counts, live members; None before its first round)."""
        return callable(getattr(self._handler, "membership_view", None))

    def _read(self, read: Any) -> Any:
        """``read(state)`` on torch's rendezvous state under the handler's lock; None if unreadable."""
        try:
            holder = self._handler._state_holder
            lock = getattr(self._handler, "_heartbeat_lock", None)
            if isinstance(lock, type(threading.Lock())):
                with lock:
                    return read(holder.state)
            return read(holder.state)
        except (AttributeError, TypeError) as err:
            self._warn_once(f"{type(err).__name__}: {err}")
            return None

    def _read_bounds(self) -> tuple[int, int] | None:
        """``--nnodes`` MIN and MAX as torch's rendezvous settings hold them; None if unreadable."""
        try:
            settings = self._handler._settings
            return int(settings.min_nodes), int(settings.max_nodes)
        except (AttributeError, TypeError, ValueError) as err:
            self._warn_once(f"{type(err).__name__}: {err}")
            return None

    def _warn_once(self, why: str) -> None:
        if not self._warned:
            self.__dict__["_warned"] = True
            logger.warning("rendezvous: cannot read the rendezvous state (%s); every waiting node makes "
                           "the workload restart, as in torch (spares included)", why)


def wrap(handler: Any, restart_policy: str) -> MembershipHandler:
    """torch's rendezvous ``handler`` wrapped in a :class:`MembershipHandler` for ``restart_policy``."""
    return MembershipHandler(handler, restart_policy)
