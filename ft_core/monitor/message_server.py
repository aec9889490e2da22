"""A single-threaded message server on a private Unix socket (the rank monitor's I/O layer).

It accepts connections from processes of this user only (``SO_PEERCRED``), at most
``max_connections`` at a time, reads length-prefixed JSON messages (:mod:`ft_core.wire.protocol`)
without ever blocking on a peer, and sends replies, optionally with file descriptors. What the
messages mean is up to its owner, which gets two callbacks: ``on_message(conn, message)`` and
``on_close(conn, reason)``. A malformed message drops that connection, never the server.

It also owns the self-pipe that makes a signal wake :meth:`MessageServer.poll` at once
(``signal.set_wakeup_fd``).

Standard library only: the rank monitor uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from ft_core.wire import protocol
from ft_core.wire.errors import ProtocolError
from ft_core.wire.osutil import drain, wakeup_pair

logger = logging.getLogger(__name__)

_LISTENER = "listener"
MAX_FDS = 4
"""Descriptors accepted with one read (a rank sends one, its stack dump file, with ``init``)."""
_WAKEUP = "wakeup"


@dataclass
class Connection:
    """One accepted peer.

    Attributes:
        sock: The connected socket (blocking with a send timeout; reads happen only when the
            selector says it is readable).
        peer_pid: The peer's pid at connection time (``SO_PEERCRED``).
        accepted_at: Monotonic time of the accept.
        role: Set by the owner once the peer said who it is; ``"pending"`` until then.
    """

    sock: socket.socket
    peer_pid: int
    accepted_at: float
    role: str = "pending"
    reader: protocol.FrameReader = field(default_factory=protocol.FrameReader)
    fds: list[int] = field(default_factory=list)
    """Descriptors the peer attached to its first message (``SCM_RIGHTS``), until the owner
    takes them (:meth:`take_fds`); closed by the server otherwise."""

    def take_fds(self) -> list[int]:
        """The descriptors received so far; the caller owns (and must close) them."""
        fds, self.fds = self.fds, []
        return fds

    def close_fds(self) -> None:
        for fd in self.take_fds():
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0


class MessageServer:
    """Listens at ``path`` and dispatches complete messages to ``on_message``.

    Args:
        path: Socket path (see ``protocol.prepare_socket_path``): its directory is created
            (0700) if missing and must be one no other user can swap the socket in; a stale
            socket of this user there is replaced.
        on_message: Called with each complete message; raising :class:`ProtocolError` drops
            the connection.
        on_close: Called once when a connection ends, with a reason (None when the server
            dropped it on purpose: a protocol error, a refused peer, shutdown).
        max_connections: Connections beyond this are refused at accept.
        send_timeout: Seconds a send may block on a peer that does not read.
    """

    def __init__(
        self,
        path: str,
        on_message: Callable[[Connection, dict[str, Any]], None],
        on_close: Callable[[Connection, Optional[str]], None],
        max_connections: int = 16,
        send_timeout: float = 2.0,
    ) -> None:
        self.path = os.path.abspath(path)
        self._on_message = on_message
        self._on_close = on_close
        self._max_connections = max_connections
        self._send_timeout = send_timeout
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._connections: dict[int, Connection] = {}
        self._wakeup_r, self._wakeup_w = wakeup_pair()
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, _WAKEUP)

    @property
    def wakeup_fd(self) -> int:
        """A descriptor for ``signal.set_wakeup_fd``: a signal then ends :meth:`poll` at once."""
        return self._wakeup_w.fileno()

    def connections(self) -> list[Connection]:
        """The open connections (a copy: callbacks may drop some while the caller iterates)."""
        return list(self._connections.values())

    def listen(self) -> None:
        """Bind (mode 0600 from birth) and start accepting.

        Raises:
            ValueError: The path is too long for a Unix socket.
            PermissionError: Another user could swap a socket in the directory.
            OSError: The socket cannot be bound.
        """
        protocol.prepare_socket_path(self.path)
        self._listener = protocol.listen_unix(self.path, self._max_connections)
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for activity and handle all of it."""
        for key, _mask in self._selector.select(timeout):
            if key.data == _LISTENER:
                self._accept()
            elif key.data == _WAKEUP:
                drain(self._wakeup_r)
            else:
                self._read(key.data)

    def send(self, conn: Connection, message: dict[str, Any], fds: list[int] | None = None) -> bool:
        """Send one message (with ``fds`` attached to its first bytes); drop the peer on failure.

        Returns:
            True if it was sent.
        """
        try:
            frame = protocol.encode(message)
            if fds:
                sent = socket.send_fds(conn.sock, [frame], fds)
                if sent < len(frame):
                    conn.sock.sendall(frame[sent:])
            else:
                conn.sock.sendall(frame)
            return True
        except (OSError, ProtocolError) as err:
            logger.warning("could not send %s to pid %s: %s", message.get("type"), conn.peer_pid, err)
            self.drop(conn, f"send failed: {err}")
            return False

    def drop(self, conn: Connection, reason: Optional[str]) -> None:
        """Close ``conn`` (if still open) and report it to ``on_close`` once."""
        if conn.closed:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        self._connections.pop(conn.sock.fileno(), None)
        conn.sock.close()
        conn.close_fds()
        self._on_close(conn, reason)

    def close(self) -> None:
        """Drop every connection, stop listening, remove the socket file."""
        for conn in self.connections():
            self.drop(conn, None)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._selector.close()
        self._wakeup_r.close()
        self._wakeup_w.close()

    def _accept(self) -> None:
        for sock, pid in protocol.accept_own_user(self._listener, logger, "rank monitor socket"):
            if len(self._connections) >= self._max_connections:
                logger.warning("refused connection from pid %s: too many connections", pid)
                sock.close()
                continue
            sock.settimeout(self._send_timeout)
            conn = Connection(sock=sock, peer_pid=pid, accepted_at=time.monotonic())
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: Connection) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn.sock, 65536, MAX_FDS)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self.drop(conn, f"read error: {err}")
            return
        conn.fds.extend(fds)
        if not data:
            self.drop(conn, "connection closed")
            return
        try:
            for message in conn.reader.feed(data):
                self._on_message(conn, message)
                if conn.closed:
                    return
        except ProtocolError as err:
            logger.warning("dropping connection from pid %s: %s", conn.peer_pid, err)
            self.drop(conn, None)
            return
        if conn.role != "pending" or len(conn.fds) > MAX_FDS:
            # Only the first message may carry descriptors, and its owner took them.
            conn.close_fds()
