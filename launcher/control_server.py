"""The launcher's control socket: receives workload control requests from its own workers.

A background thread accepts connections on a Unix socket in the launcher's private run
directory. A request is accepted only from a process of the same uid that is one of the current
workers or a descendant of one (checked with ``SO_PEERCRED`` and ``/proc``); anything else gets
an error reply. Accepted requests are queued for the agent's monitoring loop, which acts on them.

With warm restarts, torch knows each worker as its trampoline, while the real worker is forked by
this launcher's warm template (``launcher/zygote.py``), so it descends from the template, not from
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
import time
from dataclasses import dataclass
from typing import Any

from ft_core import protocol
from ft_core.errors import ProtocolError
from ft_core.procfs import parent_pid
from ft_core.workload_control import WorkloadControlRequest

logger = logging.getLogger(__name__)

REQUEST_READ_TIMEOUT = 5.0
_MAX_ANCESTRY_DEPTH = 16
_WARM_TEMPLATE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")


@dataclass(frozen=True)
class ReceivedRequest:
    """A workload control request and who sent it."""

    request: WorkloadControlRequest
    sender_pid: int
    rank: int | None
    received_at: float


class ControlServer:
    """Serves the control socket at ``path`` on a daemon thread until :meth:`close`.

    Args:
        path: Socket path (inside the launcher's private run directory).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: queue.Queue[ReceivedRequest] = queue.Queue()
        self._allowed_roots: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self._listener = protocol.listen_unix(path, 16)
        self._wake_r, self._wake_w = socket.socketpair()
        # Readable whenever a request was queued, so the agent can wait for it with a selector.
        self._notify_r, self._notify_w = socket.socketpair()
        self._notify_r.setblocking(False)
        self._notify_w.setblocking(False)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="ft-control-server", daemon=True)
        self._thread.start()

    def notify_fileno(self) -> int:
        """A descriptor that becomes readable when a request is queued (see :meth:`clear_notify`)."""
        return self._notify_r.fileno()

    def clear_notify(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._notify_r.recv(4096):
                pass

    def set_workers(self, pids: list[int]) -> None:
        """Accept requests only from these processes (and their descendants) from now on."""
        with self._lock:
            self._allowed_roots = frozenset(pids)

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
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                logger.warning("control socket accept failed: %s", err)
                return
            with conn:
                self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        pid, uid, _ = protocol.peer_credentials(conn)
        conn.settimeout(REQUEST_READ_TIMEOUT)
        if uid != os.getuid():
            logger.warning("control request refused: pid %s runs as uid %s, not %s", pid, uid, os.getuid())
            return
        try:
            # Read before judging, so that a refused sender still gets the reason.
            message = protocol.recv_message(conn, REQUEST_READ_TIMEOUT)
            with self._lock:
                roots = self._allowed_roots
            if not _descends_from(pid, roots, os.getpid()):
                logger.warning("control request refused: pid %s is not one of this launcher's workers", pid)
                self._reply(conn, {"type": protocol.MSG_ERROR, "error": "not a worker of this launcher"})
                return
            if message["type"] != protocol.MSG_WORKLOAD_CONTROL:
                raise ProtocolError(f"unexpected message type {message['type']!r}")
            request = WorkloadControlRequest.from_dict(message)
        except (OSError, ProtocolError, TimeoutError, ValueError) as err:
            logger.warning("control request from pid %s rejected: %s", pid, err)
            self._reply(conn, {"type": protocol.MSG_ERROR, "error": str(err)})
            return
        rank = message.get("rank")
        self.requests.put(ReceivedRequest(request, pid, rank if isinstance(rank, int) else None, time.time()))
        with contextlib.suppress(OSError):
            self._notify_w.send(b"r")
        self._reply(conn, {"type": protocol.MSG_OK})

    @staticmethod
    def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ProtocolError):
            protocol.send_message(conn, message)


def _descends_from(pid: int, roots: frozenset[int], launcher_pid: int) -> bool:
    """True if ``pid`` is in ``roots`` or a descendant of one (following parent pids), or a
    descendant of this launcher's warm template (a warm-started worker, see the module doc)."""
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
            return current != pid and _is_warm_template(current)
        current = parent
    return False


def _is_warm_template(pid: int) -> bool:
    """True if ``pid`` runs this package's ``zygote.py`` (the launcher's warm template)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            argv = stream.read().split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and os.fsdecode(argv[1]) == _WARM_TEMPLATE_SCRIPT
