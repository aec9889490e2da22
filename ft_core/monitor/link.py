"""The launcher's end of a connection to one rank monitor.

The launcher keeps one such link per monitor for the whole run. Through it the monitor learns
each cycle's worker pid (so it can stop that worker if the launcher dies) and reports hangs,
escalations and rank connections; the launcher asks it questions (``ping``, ``progress_query``,
``capture_stacks``: :meth:`MonitorLink.send`, then :meth:`MonitorLink.take_message` the
answer). Closing the link without :meth:`MonitorLink.close` (e.g. because the launcher was
killed) tells the monitor that its launcher is gone.

The link decodes what it receives into the typed messages of :mod:`ft_core.wire.messages`
(:meth:`MonitorLink.poll_messages`, :meth:`MonitorLink.take_message`); a message of a type this
side does not know, or a malformed one, is skipped with one warning per type. Tests that play the
launcher may read the frames as decoded JSON objects (:meth:`MonitorLink.poll_events`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any, TypeVar

from ft_core.wire import messages, protocol
from ft_core.wire.errors import ProtocolError
from ft_core.wire.typed import MalformedError

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=messages.Message)

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
            protocol.send_message(sock, messages.LauncherHello().to_wire())
            reply = messages.decode(protocol.recv_message(sock, CONNECT_TIMEOUT))
        except (OSError, ProtocolError, TimeoutError, MalformedError) as err:
            sock.close()
            raise ConnectionError(f"cannot attach to rank monitor at {socket_path}: {err}") from None
        if not isinstance(reply, messages.Ok):
            sock.close()
            error = reply.error if isinstance(reply, messages.Error) else f"answered {reply.TYPE!r}"
            raise ConnectionError(f"rank monitor at {socket_path} refused: {error}")
        sock.setblocking(False)
        self._sock: socket.socket | None = sock
        self.lost = False
        self._warned: set[str] = set()

    def fileno(self) -> int:
        """The socket's fd (for selectors); -1 once closed."""
        return self._sock.fileno() if self._sock is not None else -1

    def worker_started(self, pid: int, cycle: int, rank: int | None = None) -> None:
        """Tell the monitor which process is this cycle's worker."""
        self._send(messages.WorkerStarted(pid=pid, cycle=cycle, rank=rank).to_wire())

    def send(self, message: messages.Message | dict[str, Any]) -> bool:
        """Send a request (its answer arrives among the events: :meth:`take_message`); False if lost."""
        self._send(message.to_wire() if isinstance(message, messages.Message) else message)
        return not self.lost

    def take_message(self, cls: type[M]) -> M | None:
        """Remove and return the oldest received message of class ``cls`` (not blocking); other
        messages stay for :meth:`poll_messages`. A malformed one is dropped (one warning)."""
        while True:
            raw = self.take(cls.TYPE)
            if raw is None:
                return None
            message = self._decode(raw)
            if isinstance(message, cls):
                return message

    def poll_messages(self) -> list[messages.Message]:
        """The messages received so far, typed, without blocking (marks the link lost on EOF)."""
        decoded = (self._decode(raw) for raw in self.poll_events())
        return [message for message in decoded if message is not None]

    def _decode(self, raw: dict[str, Any]) -> messages.Message | None:
        try:
            return messages.decode(raw)
        except MalformedError as err:
            key = str(raw.get("type"))
            if key not in self._warned:
                self._warned.add(key)
                logger.warning("rank monitor at %s: skipped a message this launcher cannot read (%s); "
                               "further ones of this type are skipped silently", self.socket_path, err)
            return None

    def take(self, kind: str) -> dict[str, Any] | None:
        """Remove and return the oldest received frame of ``kind`` as decoded JSON (not
        blocking); other messages stay for :meth:`poll_events`."""
        self._read_available()
        for index, event in enumerate(self._pending):
            if event["type"] == kind:
                return self._pending.pop(index)
        return None

    def poll_events(self) -> list[dict[str, Any]]:
        """Return the frames received so far as decoded JSON, without blocking (marks the link
        lost on EOF); :meth:`poll_messages` gives them typed."""
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
            self._send(messages.LauncherBye().to_wire())
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
