"""The workload control requests that decide how this node's run ends, and straggler reports.

:class:`WorkloadRequests` reads what the ranks of this node sent to the launcher's control
socket (``ShutdownWorkload``, ``ExcludeThisNode``, straggler reports) and the
``ShutdownWorkload`` requests other nodes published in the rendezvous store. It records and logs
each, publishes this node's ``ShutdownWorkload`` for the others, and keeps the request that
decides the run (:attr:`WorkloadRequests.current`) with who asked and why
(:attr:`WorkloadRequests.cause`). What follows from it is
:func:`launcher.decision.decide.decide`'s business; the agent acts on that.
"""

from __future__ import annotations

import logging
import queue

from ft_core.wire.data import WorkloadAction
from launcher.decision.facts import WorkloadRequest
from launcher.events.log import EventLog
from launcher.events.records import ControlRequest, ReplaceRefused, Straggler
from launcher.node.control_server import ControlServer, ReceivedStragglerReport
from launcher.rendezvous.store_channel import StoreChannel

logger = logging.getLogger(__name__)

NO_REASON = "(no reason given)"


class WorkloadRequests:
    """This node's workload control requests (see the module docstring).

    Args:
        control: The launcher's control server (its ``requests`` queue).
        channel: The cross-node channel (ShutdownWorkload published and read there).
        events: Where the records go (its ``node`` names this node).
    """

    def __init__(self, control: ControlServer, channel: StoreChannel, events: EventLog) -> None:
        self._control = control
        self._channel = channel
        self._events = events
        self.current: WorkloadRequest | None = None
        """The request that decided the run: SHUTDOWN wins over EXCLUDE, EXCLUDE over REPLACE (to be
        judged: :meth:`refuse` clears it); None before one."""
        self.cause = ""
        """Who asked for :attr:`current` and why, for the stop line."""
        self._refused_cycle: int | None = None  # a replace request was refused in this cycle

    def drain(self, cycle: int) -> None:
        """Read every request this node's ranks sent since the last call (non-blocking)."""
        while True:
            try:
                item = self._control.requests.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, ReceivedStragglerReport):
                self._record_stragglers(cycle, item)
                continue
            action = item.request.action
            description = item.request.description
            self._events.record_event(ControlRequest(cycle=cycle, action=action.name, description=description,
                                                     sender_pid=item.sender_pid, rank=item.rank))
            logger.warning("rank %s (pid %s) requested %s: %s", item.rank, item.sender_pid,
                           action.name, description or NO_REASON)
            asked = f"rank {item.rank} (pid {item.sender_pid}) requested {action.name}: {description or NO_REASON}"
            if action is WorkloadAction.ShutdownWorkload:
                if self.current is not WorkloadRequest.SHUTDOWN:
                    self.current, self.cause = WorkloadRequest.SHUTDOWN, asked
                self._channel.publish_shutdown(self._events.node, item.rank, description)
            elif action is WorkloadAction.ExcludeThisNode and not item.request.only_if_replaceable:
                if self.current in (None, WorkloadRequest.REPLACE):
                    self.current, self.cause = WorkloadRequest.EXCLUDE, asked
            elif action is WorkloadAction.ExcludeThisNode and self.current is None and self._refused_cycle != cycle:
                # every rank of the node asks; once refused, the others' requests of the cycle are too
                self.current, self.cause = WorkloadRequest.REPLACE, asked

    def refuse(self, cycle: int, refusal: ReplaceRefused) -> None:
        """The replace request (:attr:`current` REPLACE) was refused (the job cannot go on without
        this node): one line and ``refusal``'s record say why; forget the request, and refuse the
        other ranks' replace requests of ``cycle`` silently, without another decision."""
        logger.warning("%s", refusal.reason)
        self._events.record_event(refusal)
        if self.current is WorkloadRequest.REPLACE:
            self.current, self.cause = None, ""
        self._refused_cycle = cycle

    def check_other_nodes(self, cycle: int, force: bool = False) -> None:
        """Learn about a ShutdownWorkload requested on another node (``force``: read the store
        now, whatever the channel's own pace)."""
        if self.current is not None:
            return
        notice = self._channel.poll_shutdown(force=force)
        if notice is None:
            return
        self.current = WorkloadRequest.SHUTDOWN
        self.cause = f"node {notice.node} requested ShutdownWorkload: {notice.description}"
        self._events.record_event(ControlRequest(cycle=cycle, action=WorkloadAction.ShutdownWorkload.name,
                                                 description=notice.description, rank=notice.rank,
                                                 from_node=notice.node))
        logger.warning("node %s requested ShutdownWorkload: %s", notice.node, notice.description)

    def _record_stragglers(self, cycle: int, report: ReceivedStragglerReport) -> None:
        for entry in report.entries:
            self._events.record_event(Straggler(
                cycle=cycle, scope=entry.scope, rank=entry.rank, relative=entry.relative,
                individual=entry.individual, interval_s=report.interval_s, consecutive=entry.consecutive,
                action=entry.action, sender_pid=report.sender_pid,
                reported_node=entry.node if entry.node != self._events.node else None,
            ))
            who = f"rank {entry.rank}" if entry.rank is not None else "the node"
            logger.warning("straggler: %s on node %s is slow (relative score %s, individual score %s; "
                           "flagged in %d report(s) in a row; action: %s)", who, entry.node,
                           score_text(entry.relative), score_text(entry.individual), entry.consecutive,
                           entry.action)


def score_text(score: float | None) -> str:
    """A straggler score for a log line: 2 decimals (``0.51``), ``-`` when not computed."""
    return "-" if score is None else f"{score:.2f}"
