"""The monitor's side of just-in-time state: the rank's state channel and the save requests.

A rank that tracks its training state opens a second connection to its monitor (the *state
channel*, first message ``state_channel``; accepted only from the pid of the rank attached to this
monitor). Two things ask it to save (see :mod:`ft_core.client.jit_state`):

* the monitor itself, when it found its rank hung: after the stacks, before the termination
  signal (a rank blocked in a collective behind a frozen peer holds a consistent state; a rank
  that is itself stopped cannot answer and is not asked);
* the launcher (``save_state``), after a rank of the node failed: the answer (``state_saved``)
  is relayed back.

Requests never block the monitor's loop: one request is in flight at a time, every asker waits
for its answer (or for the bound, :meth:`StateRelay.expire`), and an answer given for this cycle is
given again from memory. Standard library only, like the rest of the monitor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ft_core.monitor.message_server import Connection, MessageServer
from ft_core.wire import messages, protocol, saved_state
from ft_core.wire.errors import ProtocolError
from ft_core.wire.typed import MalformedError

logger = logging.getLogger(__name__)

STATE_ROLE = "state"
"""The role of a state channel's connection."""

Answer = Callable[[messages.StateSaved], None]


@dataclass
class _Pending:
    cycle: int | None
    deadline: float
    timeout: float
    askers: list[Answer] = field(default_factory=list)


class StateRelay:
    """The rank's state channel and the requests waiting for it.

    Args:
        io: The monitor's message server (sends on the channel).
        configured_timeout: ``jit_state_timeout`` (None: sized from the rank's bytes).
    """

    def __init__(self, io: MessageServer, configured_timeout: float | None) -> None:
        self._io = io
        self._configured = configured_timeout
        self._channel: Connection | None = None
        self.approx_bytes = 0
        self.identity: dict[str, Any] = {}
        """``rank`` and ``local_rank`` of the attached rank (set by the monitor at its ``init``)."""
        self._pending: _Pending | None = None
        self._answered: tuple[int | None, messages.StateSaved] | None = None

    @property
    def open(self) -> bool:
        """True while the rank's state channel is open."""
        return self._channel is not None and not self._channel.closed

    def timeout(self) -> float:
        """The bound of one save of this rank's state."""
        return saved_state.save_timeout(self._configured, self.approx_bytes)

    def attach(self, conn: Connection, message: dict[str, Any], rank_pid: int | None) -> str | None:
        """A ``state_channel`` hello on ``conn``; returns why it is refused, or None (accepted)."""
        if rank_pid is None or conn.peer_pid != rank_pid or message.get("pid") != rank_pid:
            return "the state channel is accepted only from the rank attached to this monitor"
        if self.open and self._channel is not conn:
            self._io.drop(self._channel, None)
        approx = message.get("approx_bytes")
        self.approx_bytes = approx if isinstance(approx, int) and not isinstance(approx, bool) and approx > 0 else 0
        conn.role = STATE_ROLE
        self._channel = conn
        self._io.send(conn, {"type": protocol.MSG_OK})
        return None

    def ask(self, cycle: int | None, reason: str, answer: Answer, *, stopped: bool = False) -> None:
        """Ask the rank to save; ``answer`` gets the outcome (now, or from :meth:`on_message` /
        :meth:`expire`)."""
        if self._answered is not None and self._answered[0] == cycle and self._answered[1].ok:
            answer(self._answered[1])
            return
        if self._pending is not None:
            self._pending.askers.append(answer)
            return
        if not self.open:
            answer(self._declined("the rank has no state channel (it tracks no state, or it exited)"))
            return
        if stopped:
            answer(self._declined("the rank is stopped (SIGSTOP): it cannot answer"))
            return
        timeout = self.timeout()
        request = messages.SaveState(cycle=cycle, reason=reason[:200], timeout=timeout)
        assert self._channel is not None
        if not self._io.send(self._channel, request.to_wire()):
            answer(self._declined("the state channel broke"))
            return
        self._pending = _Pending(cycle, time.monotonic() + timeout, timeout, [answer])

    def due(self) -> float | None:
        """When the request in flight runs out of time (monotonic), or None."""
        return self._pending.deadline if self._pending is not None else None

    def expire(self, now: float) -> None:
        """Answer the askers of a request that outlived its bound."""
        pending = self._pending
        if pending is not None and now >= pending.deadline:
            self._finish(self._declined(f"no answer within {pending.timeout:.1f} s"))

    def on_message(self, conn: Connection, message: dict[str, Any]) -> None:
        """A message on the state channel: the rank's ``state_saved``."""
        if message.get("type") != protocol.MSG_STATE_SAVED:
            raise ProtocolError(f"unexpected message on the state channel: {message.get('type')!r}")
        try:
            reply = messages.StateSaved.from_wire(message)
        except MalformedError as err:
            raise ProtocolError(f"malformed state_saved: {err}") from None
        self._finish(replace(reply, **self.identity, approx_bytes=self.approx_bytes))

    def on_close(self, conn: Connection) -> None:
        """The state channel closed (the rank exited, or detached its state)."""
        if conn is not self._channel:
            return
        self._channel = None
        if self._pending is not None:
            self._finish(self._declined("the rank closed its state channel before answering"))

    def _declined(self, reason: str) -> messages.StateSaved:
        return messages.StateSaved(ok=False, reason=reason, approx_bytes=self.approx_bytes, **self.identity)

    def _finish(self, reply: messages.StateSaved) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        reply = replace(reply, cycle=pending.cycle)
        if reply.ok:
            self._answered = (pending.cycle, reply)
            logger.info("rank %s saved its state of step %s (%.1f MB) in %.2f s", reply.rank, reply.step,
                        reply.bytes / 1e6, reply.seconds)
        else:
            logger.info("rank %s saved no state: %s", reply.rank, reply.reason)
        for answer in pending.askers:
            answer(reply)
