"""The launcher's control socket: receives workload control requests and straggler reports
from its own workers.

A background thread accepts connections on a Unix socket in the launcher's private run
directory. A request is accepted only from a process of the same uid that is one of the current
workers or a descendant of one (checked with ``SO_PEERCRED`` and ``/proc``); anything else gets
an error reply. Accepted requests are queued for the agent's monitoring loop, which acts on them.

With warm restarts, torch knows each worker as its trampoline, while the real worker is forked by
this launcher's warm template (``launcher/warm/zygote.py``), so it descends from the template, not from
the trampoline. The template forks only at the request of this launcher's own children, so a
process it forked (or a descendant of one) is a worker of this launcher too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import socket
import threading
from dataclasses import dataclass
from typing import Any

from ft_core.wire import protocol
from ft_core.wire.data import WorkloadControlRequest
from ft_core.wire.errors import ProtocolError
from ft_core.wire.osutil import drain, wakeup_pair
from ft_core.wire.procfs import parent_pid
from ft_core.wire.straggler_report import StragglerEntry, parse_report

logger = logging.getLogger(__name__)

REQUEST_READ_TIMEOUT = 5.0
_MAX_ANCESTRY_DEPTH = 16


@dataclass(frozen=True)
class ReceivedRequest:
    """A workload control request and who sent it."""

    request: WorkloadControlRequest
    sender_pid: int
    rank: int | None


@dataclass(frozen=True)
class ReceivedStragglerReport:
    """A straggler report (the flagged ranks and node of one report interval) and who sent it."""

    interval_s: float
    entries: tuple[StragglerEntry, ...]
    sender_pid: int
    rank: int | None


class ControlServer:
    """Serves the control socket at ``path`` on a daemon thread until :meth:`close`.

    Args:
        path: Socket path (inside the launcher's private run directory).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: queue.Queue[ReceivedRequest | ReceivedStragglerReport] = queue.Queue()
        self._allowed_roots: frozenset[int] = frozenset()
        self._template_pid: int | None = None
        self._lock = threading.Lock()
        self._listener = protocol.listen_unix(path, 16)
        self._wake_r, self._wake_w = socket.socketpair()
        # Readable whenever a request was queued, so the agent can wait for it with a selector.
        self._notify_r, self._notify_w = wakeup_pair()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="ft-control-server", daemon=True)
        self._thread.start()

    def notify_fileno(self) -> int:
        """A descriptor that becomes readable when a request is queued (see :meth:`clear_notify`)."""
        return self._notify_r.fileno()

    def clear_notify(self) -> None:
        drain(self._notify_r)

    def set_workers(self, pids: list[int], template_pid: int | None = None) -> None:
        """Accept requests only from these processes (and their descendants) from now on, and
        from the processes forked by the warm template ``template_pid``."""
        with self._lock:
            self._allowed_roots = frozenset(pids)
            self._template_pid = template_pid

    def close(self) -> None:
        """Stop the thread and remove the socket."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5)
        for sock in (self._listener, self._wake_r, self._wake_w, self._notify_r, self._notify_w):
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._closed:
                for key, _ in sel.select():
                    if key.fileobj is self._listener and not self._closed:
                        self._accept_all()

    def _accept_all(self) -> None:
        for conn, pid in protocol.accept_own_user(self._listener, logger, "control socket"):
            with conn:
                self._handle(conn, pid)

    def _handle(self, conn: socket.socket, pid: int) -> None:
        conn.settimeout(REQUEST_READ_TIMEOUT)
        try:
            # Read before judging, so that a refused sender still gets the reason.
            message = protocol.recv_message(conn, REQUEST_READ_TIMEOUT)
            with self._lock:
                roots, template = self._allowed_roots, self._template_pid
            if not _descends_from(pid, roots, os.getpid(), template):
                logger.warning("control request refused: pid %s is not one of this launcher's workers", pid)
                self._reply(conn, {"type": protocol.MSG_ERROR, "error": "not a worker of this launcher"})
                return
            rank = message.get("rank")
            rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
            item: ReceivedRequest | ReceivedStragglerReport
            if message["type"] == protocol.MSG_WORKLOAD_CONTROL:
                item = ReceivedRequest(WorkloadControlRequest.from_dict(message), pid, rank)
            elif message["type"] == protocol.MSG_STRAGGLER_REPORT:
                interval, entries = parse_report(message)
                item = ReceivedStragglerReport(interval, tuple(entries), pid, rank)
            else:
                raise ProtocolError(f"unexpected message type {message['type']!r}")
        except (OSError, ProtocolError, TimeoutError, ValueError) as err:
            logger.warning("control request from pid %s rejected: %s", pid, err)
            self._reply(conn, {"type": protocol.MSG_ERROR, "error": str(err)})
            return
        self.requests.put(item)
        with contextlib.suppress(OSError):
            self._notify_w.send(b"r")
        self._reply(conn, {"type": protocol.MSG_OK})

    @staticmethod
    def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ProtocolError):
            protocol.send_message(conn, message)


def _descends_from(pid: int, roots: frozenset[int], launcher_pid: int, template_pid: int | None) -> bool:
    """True if ``pid`` is in ``roots`` or a descendant of one (following parent pids), or a
    descendant of this launcher's warm template ``template_pid`` (a warm-started worker, see the
    module doc)."""
    current = pid
    for _ in range(_MAX_ANCESTRY_DEPTH):
        if current in roots:
            return True
        parent = parent_pid(current)
        if parent is None or parent <= 1:
            return False
        if parent == launcher_pid:
            # ``current`` is a child of the launcher: a worker (checked above), a monitor, or
            # the warm template, whose descendants are the warm-started workers.
            return current != pid and current == template_pid
        current = parent
    return False
