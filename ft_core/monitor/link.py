"""The launcher's end of a connection to one rank monitor.

The launcher keeps one such link per monitor for the whole run. Through it the monitor learns
each cycle's worker pid (so it can stop that worker if the launcher dies) and reports hangs,
escalations and rank connections; the launcher asks it questions (``ping``, ``progress_query``,
``capture_stacks``: :meth:`MonitorLink.send`, then :meth:`MonitorLink.take` the answer). Closing
the link without :meth:`MonitorLink.close` (e.g. because the launcher was killed) tells the
monitor that its launcher is gone.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from ft_core.wire import protocol
from ft_core.wire.errors import ProtocolError

CONNECT_TIMEOUT = 10.0


class MonitorLink:
    """A launcher-role connection to a rank monitor.

    Args:
        socket_path: The monitor's socket.

    Raises:
        ConnectionError: The monitor cannot be reached, runs as another user, or refused the
            launcher role.
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._reader = protocol.FrameReader()
        self._pending: list[dict[str, Any]] = []
        try:
            sock = protocol.connect_unix(socket_path, CONNECT_TIMEOUT, "rank monitor")
        except OSError as err:
            raise ConnectionError(f"cannot attach to rank monitor at {socket_path}: {err}") from None
        try:
            protocol.send_message(sock, {"type": protocol.MSG_LAUNCHER_HELLO})
            reply = protocol.recv_message(sock, CONNECT_TIMEOUT)
        except (OSError, ProtocolError, TimeoutError) as err:
            sock.close()
            raise ConnectionError(f"cannot attach to rank monitor at {socket_path}: {err}") from None
        if reply["type"] != protocol.MSG_OK:
            sock.close()
            raise ConnectionError(f"rank monitor at {socket_path} refused: {reply.get('error')}")
        sock.setblocking(False)
        self._sock: socket.socket | None = sock
        self.lost = False

    def fileno(self) -> int:
        """The socket's fd (for selectors); -1 once closed."""
        return self._sock.fileno() if self._sock is not None else -1

    def worker_started(self, pid: int, cycle: int, rank: int | None = None) -> None:
        """Tell the monitor which process is this cycle's worker."""
        self._send({"type": protocol.MSG_WORKER_STARTED, "pid": pid, "cycle": cycle, "rank": rank})

    def send(self, message: dict[str, Any]) -> bool:
        """Send a request (its answer arrives among the events: :meth:`take`); False if lost."""
        self._send(message)
        return not self.lost

    def take(self, kind: str) -> dict[str, Any] | None:
        """Remove and return the oldest received message of ``kind`` (not blocking); other
        messages stay for :meth:`poll_events`."""
        self._read_available()
        for index, event in enumerate(self._pending):
            if event["type"] == kind:
                return self._pending.pop(index)
        return None

    def poll_events(self) -> list[dict[str, Any]]:
        """Return the events received so far without blocking (marks the link lost on EOF)."""
        self._read_available()
        events, self._pending = self._pending, []
        return events

    def _read_available(self) -> None:
        sock = self._sock
        if sock is not None:
            while True:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    data = b""
                if not data:
                    self._mark_lost()
                    break
                try:
                    self._pending.extend(self._reader.feed(data))
                except ProtocolError:
                    self._mark_lost()
                    break

    def close(self) -> None:
        """Say goodbye (the monitor then exits without touching workers) and disconnect."""
        if self._sock is None:
            return
        with contextlib.suppress(OSError, ProtocolError):
            self._send({"type": protocol.MSG_LAUNCHER_BYE})
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, message: dict[str, Any]) -> None:
        if self._sock is None:
            return
        try:
            self._sock.setblocking(True)
            self._sock.settimeout(CONNECT_TIMEOUT)
            protocol.send_message(self._sock, message)
        except OSError:
            self._mark_lost()
        finally:
            if self._sock is not None:
                self._sock.setblocking(False)

    def _mark_lost(self) -> None:
        self.lost = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
