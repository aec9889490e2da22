"""A rank's sockets: its connection to its rank monitor, and its requests to the launcher.

:class:`MonitorConnection` is everything :class:`~ft_core.RankMonitorClient` does on its
monitor's socket: connect, the handshake (``init`` -> ``init_ok`` with the effective config,
the section names and the memfd of the shared progress slot), the liveness probe, control
round trips (one at a time) and closing, also in a forked child. :func:`send_to_launcher` is
the one-shot request on the launcher's control socket. Both open their sockets with
:func:`ft_core.wire.protocol.connect_unix`; nothing else in a rank opens one.

The hot path (heartbeats, sections) never touches a socket: it writes into the slot.

Fail-open: once the monitor is gone (closed the connection, or did not answer a request), the
connection is :attr:`~MonitorConnection.lost`: it logs that once, and requests return False
instead of raising, so training continues without hang detection. The same holds for a monitor
that accepts the connection but does not answer the handshake (it is stopped): when ft_launcher
started the rank, the config it would have received is in ``FT_RANK_CONFIG``, so the rank logs
one warning and goes on unwatched with the same sections and collectives as its peers.

Evidence for hang reports: at the handshake the rank registers a faulthandler signal writing to
a memfd and sends the memfd along with ``init`` (:class:`ft_core.wire.stacks.DumpHandler`), and allows
its monitor to trace it under Yama (:func:`ft_core.wire.osutil.allow_tracer`), so the monitor can read
its stacks with py-spy or the signal before it stops a hung rank.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Union

from ft_core.wire import protocol
from ft_core.wire.config import ConfigError, FaultToleranceConfig, Role
from ft_core.wire.env import FT_RANK_CONFIG_ENV_VAR
from ft_core.wire.errors import ProtocolError, RankMonitorClientError
from ft_core.wire.osutil import allow_tracer
from ft_core.wire.progress_slot import ProgressSlot
from ft_core.wire.stacks import DumpHandler

CONNECT_TIMEOUT = 30.0
REPLY_TIMEOUT = 10.0
HANDSHAKE_TIMEOUT = 10.0
"""How long a rank waits for its monitor's ``init_ok`` before it goes on unwatched."""

Logger = Union[logging.Logger, logging.LoggerAdapter]


@dataclass(frozen=True)
class Handshake:
    """The monitor's answer to ``init``.

    Attributes:
        config: The effective config the monitor enforces (as a rank receives it).
        sections: The configured section names, in slot order.
        slot: The attached shared-memory progress slot (the caller owns and closes it). For a
            rank going on unwatched, a private slot nobody reads.
        watched: False when the monitor did not answer and the rank goes on unwatched.
    """

    config: FaultToleranceConfig
    sections: list[str]
    slot: ProgressSlot
    watched: bool = True


class MonitorConnection:
    """One rank's connection to its rank monitor; made by :meth:`open`.

    Args:
        sock: The connected socket, past the handshake.
        log: Where "monitor lost" is reported (the client's rank-prefixed logger).
    """

    def __init__(self, sock: socket.socket | None, log: Logger, dump_handler: DumpHandler | None = None) -> None:
        self._sock: socket.socket | None = sock
        self._log = log
        self._lock = threading.Lock()  # serialises request round trips
        self._dump_handler = dump_handler
        self.lost = sock is None
        """True once the monitor is known to be gone (closed, or did not answer)."""

    @classmethod
    def open(cls, path: str, rank_info: dict[str, Any], log: Logger) -> tuple[MonitorConnection, Handshake]:
        """Connect to the monitor at ``path`` and introduce this rank.

        Args:
            path: The monitor's socket (``FT_RANK_MONITOR_IPC_SOCKET``).
            rank_info: What the monitor learns of this rank (host name, ranks, world size).
            log: See the class.

        Raises:
            RankMonitorClientError: The monitor cannot be reached, runs as another user,
                refused this rank, or answered something else than a valid ``init_ok``; or it
                did not answer and ``FT_RANK_CONFIG`` does not say how to go on unwatched.
        """
        try:
            sock = protocol.connect_unix(path, CONNECT_TIMEOUT, "rank monitor")
        except protocol.ForeignServerError as err:
            raise RankMonitorClientError(str(err)) from None
        except OSError as err:
            raise RankMonitorClientError(
                f"cannot connect to the rank monitor at {path}: {err.strerror or err}. Is "
                "ft_launcher still running, and was this rank started by it?"
            ) from None
        monitor_pid, _uid, _gid = protocol.peer_credentials(sock)
        allow_tracer(monitor_pid)  # py-spy from the monitor, where Yama restricts ptrace
        dump_handler = DumpHandler.install()
        init = {"type": protocol.MSG_INIT, "protocol": protocol.PROTOCOL_VERSION, **rank_info,
                "main_thread": threading.main_thread().ident}
        if dump_handler is not None:
            init["stack_signal"] = dump_handler.signum
        try:
            protocol.send_message_with_fds(sock, init, [dump_handler.fd] if dump_handler else [])
            reply, fds = protocol.recv_message_with_fds(sock, HANDSHAKE_TIMEOUT)
        except (OSError, ProtocolError, TimeoutError) as err:
            sock.close()
            if dump_handler is not None:
                dump_handler.uninstall()
            if isinstance(err, (TimeoutError, ConnectionError)):
                unwatched = _unwatched(path, err, log)
                if unwatched is not None:
                    return cls(None, log), unwatched
            raise RankMonitorClientError(f"handshake with the rank monitor at {path} failed: {err}") from None
        try:
            if reply["type"] == protocol.MSG_ERROR:
                raise RankMonitorClientError(f"rank monitor refused this rank: {reply.get('error')}")
            if reply["type"] != protocol.MSG_INIT_OK or len(fds) != 1:
                raise RankMonitorClientError(f"unexpected reply from the rank monitor: {reply['type']!r}")
            config = FaultToleranceConfig.as_received(reply["config"], "rank")
            sections = list(reply["sections"])
            slot = ProgressSlot.attach(fds[0], len(sections))
        except (KeyError, TypeError, ValueError) as err:
            sock.close()
            if dump_handler is not None:
                dump_handler.uninstall()
            raise RankMonitorClientError(f"invalid handshake reply from the rank monitor: {err}") from None
        except BaseException:
            sock.close()
            if dump_handler is not None:
                dump_handler.uninstall()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        # Blocking mode without timeout: the liveness probe's MSG_DONTWAIT recv must be a
        # plain system call (with a timeout set, Python would first wait for readability).
        sock.settimeout(None)
        return cls(sock, log, dump_handler), Handshake(config, sections, slot)

    def check_alive(self) -> None:
        """Notice (without waiting) whether the monitor closed the connection; log it once."""
        sock = self._sock
        if sock is None or self.lost:
            return
        try:
            data = sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._on_lost("the rank monitor closed the connection")

    def request(self, message: dict[str, Any], quiet: bool = False) -> bool:
        """Send a control message and wait for the monitor's reply.

        Args:
            message: The request.
            quiet: Do not log when the monitor does not answer (at shutdown).

        Returns:
            True if the monitor accepted it, False if the monitor is gone (fail-open).

        Raises:
            RankMonitorClientError: The monitor rejected the request.
        """
        if self.lost or self._sock is None:
            return False
        with self._lock:
            try:
                protocol.send_message(self._sock, message)
                reply = protocol.recv_message(self._sock, REPLY_TIMEOUT)
                self._sock.settimeout(None)
            except (OSError, ProtocolError, TimeoutError) as err:
                if not quiet:
                    self._on_lost(f"the rank monitor did not answer ({err})")
                self.lost = True
                return False
        if reply["type"] == protocol.MSG_ERROR:
            raise RankMonitorClientError(f"rank monitor rejected {message['type']}: {reply.get('error')}")
        return True

    def close(self) -> None:
        """Disconnect (the monitor then knows this rank is gone). Safe to call more than once."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._dump_handler is not None:
            self._dump_handler.uninstall()
            self._dump_handler = None

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copy of the socket.

        A child (a data-loader worker) holding the socket open would hide the rank's death from
        the monitor.
        """
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _on_lost(self, why: str) -> None:
        if not self.lost:
            self.lost = True
            self._log.error("%s; hang detection is off for this rank, training continues", why)


def _unwatched(path: str, err: BaseException, log: Logger) -> Handshake | None:
    """The handshake of a rank going on unwatched, from ``FT_RANK_CONFIG``; None without it.

    Logs the one warning of a rank whose monitor did not answer.
    """
    text = os.environ.get(FT_RANK_CONFIG_ENV_VAR)
    if not text:
        return None
    try:
        config = FaultToleranceConfig.as_received(json.loads(text), Role.RANK)
    except (ConfigError, ValueError) as bad:
        log.error("%s is not a valid rank config (%s); cannot go on unwatched", FT_RANK_CONFIG_ENV_VAR, bad)
        return None
    sections = sorted(config.rank_section_timeouts)
    slot, fd = ProgressSlot.create(len(sections))  # private: nobody reads it
    os.close(fd)
    why = "did not answer the handshake" if isinstance(err, TimeoutError) else f"closed the connection ({err})"
    log.warning("the rank monitor at %s %s within %.0f s; hang detection is off for this rank, "
                "training continues", path, why, HANDSHAKE_TIMEOUT)
    return Handshake(config, sections, slot, watched=False)


def send_to_launcher(path: str, message: dict[str, Any]) -> dict[str, Any]:
    """Send one request to the launcher's control socket at ``path``; return its reply.

    Raises:
        ForeignServerError: The socket is served by another user (nothing was sent).
        OSError, ProtocolError, TimeoutError: The request was not delivered or not answered
            within :data:`REPLY_TIMEOUT`.
    """
    with protocol.connect_unix(path, REPLY_TIMEOUT, "launcher control") as sock:
        protocol.send_message(sock, message)
        return protocol.recv_message(sock, REPLY_TIMEOUT)
