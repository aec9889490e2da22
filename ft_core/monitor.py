"""The rank monitor: a small side process that watches one rank and stops it when it hangs.

One monitor runs per local rank, started once by ``ft_launcher`` and reused across restarts.
It imports only the standard library (never torch), so it costs a few MB and keeps working when
the rank is stuck in C code holding the GIL.

How it watches: the rank reports progress into a shared-memory :class:`ProgressSlot`. The
monitor computes the earliest deadline the slot implies (first heartbeat, next heartbeat, each
open section, out-of-section time), sleeps until then, and reads the slot again. If the deadline
still stands, the rank is hung: the monitor logs one line, tells the launcher why (before
signalling, so the launcher never sees the death without its cause), sends ``SIGCONT`` and then
``rank_termination_signal``. Detection lands within milliseconds of the timeout and an idle or
busy rank costs the monitor nothing in between.

Connections (Unix socket, same uid only, length-prefixed JSON): the rank (``init``, timeout
updates, ``shutdown``) and the launcher (``launcher_hello``, ``worker_started``). If the launcher
goes away without saying goodbye, the monitor kills the worker it was told about and exits, so
nothing outlives a SIGKILLed launcher.

Command line: ``python -m ft_core.monitor --socket PATH [--config-json JSON] ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ft_core import protocol
from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.errors import ProtocolError
from ft_core.procfs import pid_alive
from ft_core.progress_slot import ProgressSlot

logger = logging.getLogger("ft_core.monitor")

HANDSHAKE_TIMEOUT = 10.0
SEND_TIMEOUT = 2.0
MAX_PENDING_CONNECTIONS = 16
_PR_SET_PDEATHSIG = 1
# The signal the kernel sends us when our parent dies (see _set_parent_death_signal).
PARENT_DEATH_SIGNAL = signal.SIGHUP


@dataclass
class _Connection:
    sock: socket.socket
    peer_pid: int
    accepted_at: float
    reader: protocol.FrameReader = field(default_factory=protocol.FrameReader)
    role: str = "pending"  # pending | rank | launcher


@dataclass
class _RankSession:
    """State of the rank currently attached; discarded when its connection ends."""

    conn: _Connection
    pid: int
    info: dict[str, Any]
    slot: ProgressSlot
    section_names: list[str]
    connected_at: float
    hb_initial: Optional[float]
    hb_subsequent: Optional[float]
    section_timeouts: list[Optional[float]]
    out_of_section_timeout: Optional[float]
    hang_handled: bool = False
    # When the rank last changed a timeout: clocks restart there, since a rank that just sent
    # us a message is alive (a shorter timeout must not be applied to an interval begun before).
    hb_timeouts_set_at: float = 0.0
    section_timeouts_set_at: float = 0.0

    def describe(self) -> str:
        rank = self.info.get("rank")
        local = self.info.get("local_rank")
        return f"rank {rank} (local rank {local}, pid {self.pid})"


@dataclass
class _Deadline:
    when: float
    kind: str  # initial_heartbeat | heartbeat | section | out_of_section
    started: float
    timeout: float
    section: Optional[str] = None


class RankMonitorServer:
    """Watches one rank through its progress slot; see the module docstring.

    Args:
        cfg: Effective fault tolerance configuration (sent to the rank at connection).
        ipc_socket_path: Where to listen. Its directory must be private (0700) to this user;
            it is created if missing.
        is_restarter_logger: If True, this monitor also logs each new worker cycle the launcher
            reports (one monitor per node should, to keep logs short).
        parent_pid: The process whose death makes the monitor stop its rank and exit.
        name: Label used in log lines.
        cleanup_dir: A directory to remove if the parent dies (the launcher's run directory,
            which a killed launcher cannot remove itself).
    """

    RANK_MONITOR_INIT_TIMEOUT = 30.0

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        ipc_socket_path: str,
        is_restarter_logger: bool = False,
        parent_pid: int | None = None,
        name: str | None = None,
        cleanup_dir: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.cleanup_dir = cleanup_dir
        self.ipc_socket_path = os.path.abspath(ipc_socket_path)
        self.is_restarter_logger = is_restarter_logger
        self.parent_pid = os.getppid() if parent_pid is None else parent_pid
        self.name = name or os.path.basename(self.ipc_socket_path)
        self.hostname = socket.gethostname()
        self._section_names = sorted(cfg.rank_section_timeouts)
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._connections: dict[int, _Connection] = {}
        self._session: _RankSession | None = None
        self._launcher: _Connection | None = None
        self._worker_pid: int | None = None
        self._stop_reason: str | None = None
        self._parent_gone = False
        self._signal_rsock: socket.socket | None = None
        self._signal_wsock: socket.socket | None = None
        self._next_housekeeping = 0.0
        self.hangs_detected = 0

    # ------------------------------------------------------------------ entry points

    @staticmethod
    def run(
        cfg: FaultToleranceConfig,
        ipc_socket_path: str,
        rank_monitor_ready_event: Any = None,
        is_restarter_logger: bool = False,
    ) -> None:
        """Run a monitor in the current process until stopped (``multiprocessing`` target).

        Args:
            cfg: Configuration.
            ipc_socket_path: Socket path, as in the constructor.
            rank_monitor_ready_event: Optional event set once the socket accepts connections.
            is_restarter_logger: As in the constructor.
        """
        configure_logging(cfg.log_level, os.path.basename(ipc_socket_path))
        server = RankMonitorServer(cfg, ipc_socket_path, is_restarter_logger)
        server.serve_forever(on_ready=rank_monitor_ready_event.set if rank_monitor_ready_event else None)

    @staticmethod
    def run_in_subprocess(
        cfg: FaultToleranceConfig,
        ipc_socket_path: str,
        is_restarter_logger: bool = False,
        mp_ctx: Any = None,
    ) -> Any:
        """Start a monitor in a new process and return once it accepts connections.

        Args:
            cfg: Configuration.
            ipc_socket_path: Socket path; its directory is created private (0700) if missing
                and must otherwise be private to this user.
            is_restarter_logger: As in the constructor.
            mp_ctx: ``None`` (recommended) starts a fresh interpreter running
                ``python -m ft_core.monitor``, which imports nothing heavy. A
                ``multiprocessing`` context runs the monitor in a ``Process`` of that context
                instead (with "fork" it inherits the parent's memory, with "spawn" it
                re-imports the parent's main module).

        Returns:
            A handle with the ``multiprocessing.Process`` interface: ``pid``, ``is_alive()``,
            ``join(timeout)``, ``terminate()``, ``kill()``, ``exitcode``.

        Raises:
            ValueError: The socket path is too long for a Unix socket.
            PermissionError: The socket directory is not private.
            RuntimeError: The monitor did not become ready within
                ``RANK_MONITOR_INIT_TIMEOUT`` seconds.
        """
        ipc_socket_path = os.path.abspath(ipc_socket_path)
        protocol.check_socket_path(ipc_socket_path)
        protocol.ensure_private_dir(os.path.dirname(ipc_socket_path))
        if mp_ctx is not None:
            return _start_with_multiprocessing(cfg, ipc_socket_path, is_restarter_logger, mp_ctx)
        return MonitorProcess.start(cfg, ipc_socket_path, is_restarter_logger)

    def serve_forever(self, ready_fd: int | None = None, on_ready: Any = None) -> int:
        """Listen and watch until told to stop.

        Args:
            ready_fd: A pipe to write one line to once listening (then closed).
            on_ready: A callable invoked once listening.

        Returns:
            Process exit code: 0 after a normal stop or the parent's death.
        """
        self._install_signal_handlers()
        self._listen()
        logger.debug("listening on %s", self.ipc_socket_path)
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)
        if on_ready is not None:
            on_ready()
        try:
            self._loop()
        finally:
            self._cleanup()
        logger.debug("stopped: %s", self._stop_reason)
        return 0

    # ------------------------------------------------------------------ setup / teardown

    def _listen(self) -> None:
        protocol.check_socket_path(self.ipc_socket_path)
        protocol.ensure_private_dir(os.path.dirname(self.ipc_socket_path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ipc_socket_path)
        listener = protocol.listen_unix(self.ipc_socket_path, MAX_PENDING_CONNECTIONS)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "listener")

    def _install_signal_handlers(self) -> None:
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        self._signal_rsock, self._signal_wsock = rsock, wsock
        self._selector.register(rsock, selectors.EVENT_READ, "signal")
        if _in_main_thread():
            signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT, PARENT_DEATH_SIGNAL):
                signal.signal(sig, self._on_signal)
            # Training clusters send SIGUSR1/2 as preemption warnings to the whole job;
            # they are for the ranks, not for us.
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_IGN)
            _set_parent_death_signal(PARENT_DEATH_SIGNAL)
        if os.getppid() != self.parent_pid:
            self._parent_gone = True

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == PARENT_DEATH_SIGNAL:
            self._parent_gone = True
        elif self._stop_reason is None:
            self._stop_reason = f"received {signal.Signals(signum).name}"

    def _cleanup(self) -> None:
        self._end_session("monitor stopping")
        for conn in list(self._connections.values()):
            self._drop(conn, None)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.ipc_socket_path)
        for sock in (self._signal_rsock, self._signal_wsock):
            if sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()
        if _in_main_thread():
            signal.set_wakeup_fd(-1)
        self._selector.close()

    # ------------------------------------------------------------------ main loop

    def _loop(self) -> None:
        interval = self.cfg.workload_check_interval
        self._next_housekeeping = time.monotonic() + interval
        while self._stop_reason is None:
            if self._parent_gone:
                self._handle_parent_gone("the launcher process exited")
                return
            now = time.monotonic()
            wake_at = self._next_housekeeping
            deadline = self._check_rank(now)
            if deadline is not None:
                wake_at = min(wake_at, deadline)
            for conn in self._connections.values():
                if conn.role == "pending":
                    wake_at = min(wake_at, conn.accepted_at + HANDSHAKE_TIMEOUT)
            timeout = max(0.0, wake_at - now)
            for key, _mask in self._selector.select(timeout):
                self._dispatch(key)
            now = time.monotonic()
            if now >= self._next_housekeeping:
                self._housekeeping(now)
                self._next_housekeeping = now + interval

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        if key.data == "listener":
            self._accept()
        elif key.data == "signal":
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while self._signal_rsock.recv(512):
                    pass
        else:
            self._read(key.data)

    def _housekeeping(self, now: float) -> None:
        if os.getppid() != self.parent_pid:
            self._parent_gone = True
        for conn in list(self._connections.values()):
            if conn.role == "pending" and now - conn.accepted_at > HANDSHAKE_TIMEOUT:
                logger.warning(
                    "dropping connection from pid %s: no handshake within %.0f s",
                    conn.peer_pid, HANDSHAKE_TIMEOUT,
                )
                self._drop(conn, None)
        session = self._session
        if session is not None and not pid_alive(session.pid):
            # The rank died but a forked child still holds its socket open.
            self._end_session(f"{session.describe()} exited")

    # ------------------------------------------------------------------ connections

    def _accept(self) -> None:
        while True:
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                logger.warning("accept failed: %s", err)
                return
            pid, uid, _gid = protocol.peer_credentials(sock)
            if uid != os.getuid():
                logger.warning(
                    "refused connection from pid %s: uid %s is not this user's uid %s",
                    pid, uid, os.getuid(),
                )
                sock.close()
                continue
            if len(self._connections) >= MAX_PENDING_CONNECTIONS:
                logger.warning("refused connection from pid %s: too many connections", pid)
                sock.close()
                continue
            sock.settimeout(SEND_TIMEOUT)
            conn = _Connection(sock=sock, peer_pid=pid, accepted_at=time.monotonic())
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._drop(conn, f"read error: {err}")
            return
        if not data:
            self._drop(conn, "connection closed")
            return
        try:
            for message in conn.reader.feed(data):
                self._handle(conn, message)
                if conn.sock.fileno() < 0:
                    return
        except ProtocolError as err:
            logger.warning("dropping connection from pid %s: %s", conn.peer_pid, err)
            self._drop(conn, None)

    def _drop(self, conn: _Connection, reason: str | None) -> None:
        if conn.sock.fileno() >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
            self._connections.pop(conn.sock.fileno(), None)
            conn.sock.close()
        if self._session is not None and self._session.conn is conn:
            self._end_session(reason or "connection dropped")
        if self._launcher is conn:
            self._launcher = None
            if reason is not None and self._stop_reason is None:
                # The launcher closed without saying goodbye: it died.
                self._parent_gone = True

    def _send(self, conn: _Connection, message: dict[str, Any], fds: list[int] | None = None) -> bool:
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
            self._drop(conn, f"send failed: {err}")
            return False

    def _handle(self, conn: _Connection, message: dict[str, Any]) -> None:
        kind = message["type"]
        if conn.role == "pending":
            if kind == protocol.MSG_INIT:
                self._start_session(conn, message)
            elif kind == protocol.MSG_LAUNCHER_HELLO:
                self._attach_launcher(conn)
            else:
                raise ProtocolError(f"unexpected first message {kind!r}")
        elif conn.role == "rank":
            self._handle_rank_message(conn, message)
        elif conn.role == "launcher":
            self._handle_launcher_message(message)

    # ------------------------------------------------------------------ launcher side

    def _attach_launcher(self, conn: _Connection) -> None:
        if self._launcher is not None:
            self._send(conn, {"type": protocol.MSG_ERROR, "error": "a launcher is already attached"})
            self._drop(conn, None)
            return
        conn.role = "launcher"
        self._launcher = conn
        self._send(conn, {"type": protocol.MSG_OK, "monitor_pid": os.getpid()})

    def _handle_launcher_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == protocol.MSG_WORKER_STARTED:
            pid = message.get("pid")
            if not isinstance(pid, int) or pid <= 0:
                raise ProtocolError(f"worker_started needs a positive integer pid, got {pid!r}")
            self._worker_pid = pid
            if self.is_restarter_logger:
                logger.info("cycle %s: worker pid %s started", message.get("cycle"), pid)
        elif kind == protocol.MSG_LAUNCHER_BYE:
            self._worker_pid = None
            self._stop_reason = "launcher said goodbye"
        else:
            raise ProtocolError(f"unexpected launcher message {kind!r}")

    def _notify_launcher(self, message: dict[str, Any]) -> None:
        if self._launcher is not None:
            self._send(self._launcher, message)

    def _handle_parent_gone(self, why: str) -> None:
        """The launcher is gone: nothing will restart or reap the worker, so stop it."""
        targets = {pid for pid in (self._worker_pid, self._session.pid if self._session else None) if pid}
        for pid in targets:
            if pid_alive(pid):
                logger.warning("%s; stopping worker pid %s", why, pid)
                _signal_rank(pid, signal.SIGKILL, self._worker_pid)
        if self.cleanup_dir:
            import shutil

            shutil.rmtree(self.cleanup_dir, ignore_errors=True)
        self._stop_reason = why

    # ------------------------------------------------------------------ rank side

    def _start_session(self, conn: _Connection, message: dict[str, Any]) -> None:
        if message.get("protocol") != protocol.PROTOCOL_VERSION:
            self._send(conn, {"type": protocol.MSG_ERROR, "error": (
                f"protocol version {message.get('protocol')!r} is not supported "
                f"(monitor speaks {protocol.PROTOCOL_VERSION}); use matching ft_core versions")})
            self._drop(conn, None)
            return
        if self._session is not None:
            old = self._session
            if pid_alive(old.pid) and old.pid != conn.peer_pid:
                self._send(conn, {"type": protocol.MSG_ERROR, "error": (
                    f"this monitor already watches {old.describe()}; each rank needs its own "
                    "monitor (is the socket path shared between ranks?)")})
                self._drop(conn, None)
                return
            self._end_session(f"{old.describe()} replaced by a new connection")
        info = {
            key: message.get(key)
            for key in ("rank", "local_rank", "world_size", "hostname")
            if isinstance(message.get(key), (int, str))
        }
        slot, fd = ProgressSlot.create(len(self._section_names))
        now = time.monotonic()
        slot.set_out_of_section_since(now)
        cfg = self.cfg
        session = _RankSession(
            conn=conn,
            pid=conn.peer_pid,
            info=info,
            slot=slot,
            section_names=self._section_names,
            connected_at=now,
            hb_initial=cfg.initial_rank_heartbeat_timeout,
            hb_subsequent=cfg.rank_heartbeat_timeout,
            section_timeouts=[cfg.rank_section_timeouts[n] for n in self._section_names],
            out_of_section_timeout=cfg.rank_out_of_section_timeout,
        )
        conn.role = "rank"
        reply = {
            "type": protocol.MSG_INIT_OK,
            "config": cfg.to_dict(),
            "sections": self._section_names,
            "monitor_pid": os.getpid(),
        }
        try:
            sent = self._send(conn, reply, [fd])
        finally:
            os.close(fd)
        if not sent:
            slot.close()
            return
        self._session = session
        logger.debug("attached %s", session.describe())
        self._notify_launcher({"type": protocol.MSG_RANK_CONNECTED, "pid": session.pid, **info})

    def _end_session(self, reason: str) -> None:
        session = self._session
        if session is None:
            return
        self._session = None
        session.slot.close()
        logger.debug("detached %s: %s", session.describe(), reason)
        if session.conn.sock.fileno() >= 0:
            self._drop(session.conn, None)
        self._notify_launcher({
            "type": protocol.MSG_RANK_DISCONNECTED, "pid": session.pid, "reason": reason,
        })

    def _handle_rank_message(self, conn: _Connection, message: dict[str, Any]) -> None:
        session = self._session
        if session is None or session.conn is not conn:
            raise ProtocolError("message from a rank that is not attached")
        kind = message["type"]
        try:
            if kind == protocol.MSG_SET_HB_TIMEOUTS:
                session.hb_initial = _timeout_value(message, "initial")
                session.hb_subsequent = _timeout_value(message, "subsequent")
                session.hb_timeouts_set_at = time.monotonic()
                logger.info(
                    "%s: heartbeat timeouts set to initial=%s subsequent=%s",
                    session.describe(), _fmt(session.hb_initial), _fmt(session.hb_subsequent),
                )
            elif kind == protocol.MSG_SET_SECTION_TIMEOUTS:
                self._set_section_timeouts(session, message)
            elif kind == protocol.MSG_SHUTDOWN:
                self._send(conn, {"type": protocol.MSG_OK})
                self._end_session("rank shut down monitoring")
                return
            else:
                raise ProtocolError(f"unexpected rank message {kind!r}")
        except ValueError as err:
            self._send(conn, {"type": protocol.MSG_ERROR, "error": str(err)})
            return
        self._send(conn, {"type": protocol.MSG_OK})

    def _set_section_timeouts(self, session: _RankSession, message: dict[str, Any]) -> None:
        sections = message.get("section")
        if not isinstance(sections, dict):
            raise ValueError("'section' must be a mapping of section name to seconds")
        unknown = sorted(set(sections) - set(session.section_names))
        if unknown:
            raise ValueError(
                f"unknown section(s) {', '.join(unknown)}; configured: "
                f"{', '.join(session.section_names) or 'none'}"
            )
        new_values = list(session.section_timeouts)
        for name in sections:
            new_values[session.section_names.index(name)] = _timeout_value(sections, name)
        if "out_of_section" in message:
            session.out_of_section_timeout = _timeout_value(message, "out_of_section")
        session.section_timeouts = new_values
        session.section_timeouts_set_at = time.monotonic()
        logger.info(
            "%s: section timeouts set to %s, out-of-section=%s",
            session.describe(),
            ", ".join(f"{n}={_fmt(t)}" for n, t in zip(session.section_names, new_values, strict=True)) or "-",
            _fmt(session.out_of_section_timeout),
        )

    # ------------------------------------------------------------------ hang detection

    def _earliest_deadline(self, session: _RankSession) -> _Deadline | None:
        slot = session.slot
        best: _Deadline | None = None

        def consider(start: float, timeout: Optional[float], kind: str, section: str | None = None) -> None:
            nonlocal best
            if timeout is None or start <= 0.0:
                return
            when = start + timeout
            if best is None or when < best.when:
                best = _Deadline(when, kind, start, timeout, section)

        hb_floor = session.hb_timeouts_set_at
        # Opening or closing a section is progress too: a sections-only rank is not "missing
        # heartbeats" while it moves through its sections.
        last_hb = max(slot.last_heartbeat(), slot.last_section_activity())
        if last_hb == 0.0:
            consider(max(session.connected_at, hb_floor), session.hb_initial, "initial_heartbeat")
        else:
            consider(max(last_hb, hb_floor), session.hb_subsequent, "heartbeat")
        section_floor = session.section_timeouts_set_at
        oos_since = slot.out_of_section_since()
        if oos_since > 0.0:
            consider(max(oos_since, section_floor), session.out_of_section_timeout, "out_of_section")
        for index, timeout in enumerate(session.section_timeouts):
            if timeout is not None:
                since = slot.section_open_since(index)
                if since > 0.0:
                    consider(max(since, section_floor), timeout, "section", session.section_names[index])
        return best

    def _check_rank(self, now: float) -> float | None:
        """Detect a hang of the attached rank; return when to look again (None: never).

        The slot can also create a deadline *earlier* than the one we know of (the first
        heartbeat switches to the shorter subsequent timeout; a section opens; the last section
        closes). Any such deadline lies at least the smallest timeout after the event that
        created it, so looking again no later than that smallest timeout from now catches it
        before it is due: detection stays exact without any message from the rank.
        """
        session = self._session
        if session is None or session.hang_handled:
            return None
        revisit = _smallest_timeout(session)
        look_again = None if revisit is None else now + revisit
        deadline = self._earliest_deadline(session)
        if deadline is None:
            return look_again
        if now < deadline.when:
            return deadline.when if look_again is None else min(deadline.when, look_again)
        if not pid_alive(session.pid):
            self._end_session(f"{session.describe()} exited")
            return None
        self._handle_hang(session, deadline, now)
        return None

    def _handle_hang(self, session: _RankSession, deadline: _Deadline, now: float) -> None:
        session.hang_handled = True
        self.hangs_detected += 1
        elapsed = now - deadline.started
        cause = describe_hang(deadline.kind, elapsed, deadline.timeout, deadline.section)
        sig = self.cfg.rank_termination_signal
        logger.error(
            "%s on node %s: %s; sending SIGCONT then %s",
            session.describe(), self.hostname, cause, sig.name,
        )
        self._notify_launcher({
            "type": protocol.MSG_RANK_HANG,
            "pid": session.pid,
            **session.info,
            "node": self.hostname,
            "kind": deadline.kind,
            "section": deadline.section,
            "elapsed": round(elapsed, 4),
            "timeout": deadline.timeout,
            "cause": cause,
            "signal": sig.name,
            "detected_at": time.time(),
            "heartbeats": session.slot.heartbeat_count(),
        })
        _signal_rank(session.pid, sig, self._worker_pid)


def _smallest_timeout(session: _RankSession) -> float | None:
    """Smallest timeout that an event in the slot could newly start (None if none is set)."""
    candidates = [t for t in session.section_timeouts if t is not None]
    for value in (session.hb_subsequent, session.out_of_section_timeout):
        if value is not None:
            candidates.append(value)
    return max(min(candidates), 0.001) if candidates else None


def describe_hang(kind: str, elapsed: float, timeout: float, section: str | None = None) -> str:
    """One-line human description of a detected hang, e.g. for logs and event records."""
    if kind == "section":
        what = f"section {section!r} open {elapsed:.2f} s"
    elif kind == "out_of_section":
        what = f"out of any section for {elapsed:.2f} s"
    elif kind == "initial_heartbeat":
        what = f"no initial heartbeat for {elapsed:.2f} s"
    else:
        what = f"no heartbeat for {elapsed:.2f} s"
    return f"hang: {what} > timeout {timeout:.2f} s"


# ---------------------------------------------------------------------- process helpers


def _signal_rank(pid: int, sig: signal.Signals, worker_pid: int | None) -> None:
    """SIGCONT then ``sig`` to the rank, to its whole process group when it owns one.

    Workers started by the launcher lead their own process group, so the group signal also
    reaches their children (data-loader workers). A rank that shares its group with others (a
    test harness, a shell) is signalled alone.
    """
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    use_group = pgid == pid or (worker_pid is not None and pgid == worker_pid)
    for s in (signal.SIGCONT, sig):
        try:
            if use_group:
                os.killpg(pgid, s)
            else:
                os.kill(pid, s)
        except ProcessLookupError:
            return
        except PermissionError as err:
            logger.error("cannot signal pid %s: %s", pid, err)
            return


def _set_parent_death_signal(sig: signal.Signals) -> None:
    """Ask the kernel to send ``sig`` when our parent exits (Linux only; best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _timeout_value(mapping: dict[str, Any], key: str) -> Optional[float]:
    value = mapping.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"timeout {key!r} must be a positive number of seconds or null, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float range: JSON puts no limit on integers
        raise ValueError(f"timeout {key!r} must be finite, got a {value.bit_length()}-bit integer") from None
    if seconds != seconds or seconds == float("inf"):
        raise ValueError(f"timeout {key!r} must be finite, got {value!r}")
    return seconds


def _fmt(value: Optional[float]) -> str:
    return "inf" if value is None else f"{value:.3g}s"


def configure_logging(level: int, label: str) -> None:
    """Log to stderr with a prefix naming this monitor (process entry points only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [ft-monitor {label} pid {os.getpid()}] %(levelname)s: %(message)s"
    ))
    root = logging.getLogger("ft_core")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


# ---------------------------------------------------------------------- process handle


class MonitorProcess:
    """A monitor running as ``python -m ft_core.monitor``, with the ``Process`` interface."""

    def __init__(self, popen: subprocess.Popen[bytes], socket_path: str) -> None:
        self._popen = popen
        self.socket_path = socket_path
        self._ready_fd: int | None = None

    @classmethod
    def start(
        cls, cfg: FaultToleranceConfig, socket_path: str, is_restarter_logger: bool = False,
        extra_args: list[str] | None = None,
    ) -> MonitorProcess:
        """Start a monitor and wait until it listens (see ``run_in_subprocess``)."""
        handle = cls.spawn(cfg, socket_path, is_restarter_logger, extra_args)
        handle.wait_ready(RankMonitorServer.RANK_MONITOR_INIT_TIMEOUT)
        return handle

    @classmethod
    def spawn(
        cls, cfg: FaultToleranceConfig, socket_path: str, is_restarter_logger: bool = False,
        extra_args: list[str] | None = None,
    ) -> MonitorProcess:
        """Start a monitor process without waiting; call :meth:`wait_ready` before using it.

        Starting several monitors with ``spawn`` and then waiting for each overlaps their
        interpreter start-up.
        """
        read_fd, write_fd = os.pipe()
        args = [
            sys.executable, "-m", "ft_core.monitor",
            "--socket", socket_path,
            "--config-json", json.dumps(cfg.to_dict()),
            "--parent-pid", str(os.getpid()),
            "--ready-fd", str(write_fd),
        ]
        if is_restarter_logger:
            args.append("--restarter-logger")
        args += extra_args or []
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            popen = subprocess.Popen(
                args, env=env, pass_fds=(write_fd,), stdin=subprocess.DEVNULL,
                start_new_session=True,  # terminal Ctrl-C goes to the launcher, which stops us
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        handle = cls(popen, socket_path)
        handle._ready_fd = read_fd
        return handle

    def wait_ready(self, timeout: float) -> None:
        """Block until the monitor listens.

        Raises:
            RuntimeError: It exited or did not get ready in time (it is then killed).
        """
        read_fd, self._ready_fd = self._ready_fd, None
        if read_fd is None:
            return
        try:
            self._wait_ready(read_fd, timeout)
        except BaseException:
            self.kill()
            self.join(5)
            raise
        finally:
            os.close(read_fd)

    def _wait_ready(self, read_fd: int, timeout: float) -> None:
        selector = selectors.DefaultSelector()
        selector.register(read_fd, selectors.EVENT_READ)
        try:
            if not selector.select(timeout):
                raise RuntimeError(
                    f"rank monitor for {self.socket_path} did not start within {timeout:.0f} s"
                )
        finally:
            selector.close()
        if os.read(read_fd, 64) != b"ready\n":
            code = self._popen.wait(timeout=5)
            raise RuntimeError(
                f"rank monitor for {self.socket_path} failed to start (exit code {code}); "
                "its error is logged above"
            )

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """Exit code, negative signal number if killed by a signal, None while running."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=timeout)

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._popen.terminate()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._popen.kill()


def _start_with_multiprocessing(
    cfg: FaultToleranceConfig, socket_path: str, is_restarter_logger: bool, mp_ctx: Any
) -> Any:
    ready = mp_ctx.Event()
    process = mp_ctx.Process(
        target=RankMonitorServer.run,
        kwargs={
            "cfg": cfg, "ipc_socket_path": socket_path,
            "rank_monitor_ready_event": ready, "is_restarter_logger": is_restarter_logger,
        },
        daemon=True,
    )
    process.start()
    if not ready.wait(RankMonitorServer.RANK_MONITOR_INIT_TIMEOUT):
        process.kill()
        process.join(5)
        raise RuntimeError(f"rank monitor for {socket_path} did not start in time")
    return process


# ---------------------------------------------------------------------- command line


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ft_core.monitor",
        description="Run one rank monitor (normally started by ft_launcher).",
    )
    parser.add_argument("--socket", required=True, help="Unix socket path (in a 0700 directory).")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config-json", help="Configuration as a JSON object.")
    source.add_argument("--config-file", help="YAML file with a fault_tolerance section.")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="Exit (stopping the watched worker) when this process is gone.")
    parser.add_argument("--ready-fd", type=int, default=None,
                        help="Write 'ready' to this file descriptor once listening.")
    parser.add_argument("--restarter-logger", action="store_true",
                        help="Also log worker cycles reported by the launcher.")
    parser.add_argument("--name", default=None, help="Label for log lines.")
    parser.add_argument("--cleanup-dir", default=None,
                        help="Remove this directory if the parent process dies.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    args = build_arg_parser().parse_args(argv)
    try:
        if args.config_json is not None:
            cfg = FaultToleranceConfig.from_dict(json.loads(args.config_json))
        elif args.config_file is not None:
            cfg = FaultToleranceConfig.from_yaml_file(args.config_file)
        else:
            cfg = FaultToleranceConfig()
    except (ConfigError, ValueError) as err:
        print(f"ft_core.monitor: invalid configuration: {err}", file=sys.stderr)
        return 2
    label = args.name or os.path.basename(args.socket)
    configure_logging(cfg.log_level, label)
    server = RankMonitorServer(
        cfg, args.socket, is_restarter_logger=args.restarter_logger,
        parent_pid=args.parent_pid, name=label, cleanup_dir=args.cleanup_dir,
    )
    try:
        return server.serve_forever(ready_fd=args.ready_fd)
    except (OSError, ValueError) as err:
        if isinstance(err, OSError) and err.errno == errno.EADDRINUSE:
            print(f"ft_core.monitor: socket {args.socket} is in use", file=sys.stderr)
        else:
            print(f"ft_core.monitor: cannot start: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
