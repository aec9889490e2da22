"""The rank monitor: a small side process that watches one rank and stops it when it hangs.

One monitor runs per local rank, started once by ``ft_launcher`` and reused across restarts.
It imports only the standard library (never torch), so it costs a few MB and keeps working when
the rank is stuck in C code holding the GIL.

How it watches: the rank reports progress into a shared-memory :class:`ProgressSlot`. The
monitor asks :mod:`ft_core.monitor.deadlines` for the earliest deadline the slot implies (first
heartbeat, next heartbeat, each open section, out-of-section time), sleeps until then, and reads
the slot again. If the deadline still stands, the rank is hung: the monitor logs one line, tells
the launcher why (before signalling, so the launcher never sees the death without its cause),
sends ``SIGCONT`` and then ``rank_termination_signal``. Detection lands within milliseconds of
the timeout and an idle or busy rank costs the monitor nothing in between.

A job-wide stop (``scontrol suspend``, SLURM's PreemptMode=SUSPEND: SIGSTOP to every process of
the job, SIGCONT later) stops the monitor too, while the monotonic clock runs on. The monitor
notices that it was stopped (it receives the SIGCONT, or it woke far later than it asked) and
restarts its deadlines from that moment, with one INFO line; a rank stopped alone is still a
hang (see :func:`ft_core.monitor.deadlines.was_suspended`).

Connections (:mod:`ft_core.monitor.message_server`: Unix socket, same uid only, length-prefixed JSON):
the rank (``init``, timeout updates, ``shutdown``) and the launcher (``launcher_hello``,
``worker_started``, ``launcher_bye``). If the launcher goes away without saying goodbye, the
monitor kills the worker it was told about and exits, so nothing outlives a SIGKILLed launcher.

Started as ``python -m ft_core.monitor.cli`` (see :mod:`ft_core.monitor.process`), or in-process
with :meth:`RankMonitorServer.run`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import socket
import sys
import time
from typing import Any, Optional

from ft_core.monitor import deadlines
from ft_core.monitor.message_server import Connection, MessageServer
from ft_core.monitor.process import MONITOR_READY_TIMEOUT, MonitorProcess
from ft_core.monitor.session import RankSession
from ft_core.monitor.state_relay import STATE_ROLE, StateRelay
from ft_core.monitor.termination import Escalations, signal_rank
from ft_core.wire import messages, protocol, stacks
from ft_core.wire.config import FaultToleranceConfig, Role
from ft_core.wire.errors import ProtocolError
from ft_core.wire.osutil import in_main_thread, set_parent_death_signal
from ft_core.wire.procfs import pid_alive

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0
SEND_TIMEOUT = 2.0
# How long a monitor whose launcher died keeps reading what the launcher sent before dying.
LAUNCHER_DRAIN_TIMEOUT = 1.0
MAX_PENDING_CONNECTIONS = 16
MAX_PID = 2**22  # Linux's PID_MAX_LIMIT
# The signal the kernel sends us when our parent dies (see set_parent_death_signal).
PARENT_DEATH_SIGNAL = signal.SIGHUP
_RANK = "rank"
_LAUNCHER = "launcher"


class RankMonitorServer:
    """Watches one rank through its progress slot; see the module docstring.

    Args:
        cfg: Effective fault tolerance configuration. The monitor uses its monitor fields and
            hands each rank ``cfg.sent_to(Role.RANK)`` at the handshake.
        ipc_socket_path: Where to listen (see :meth:`run_in_subprocess` for the directory).
        is_restarter_logger: If True, this monitor also logs each new worker cycle the launcher
            reports (one monitor per node should, to keep logs short).
        parent_pid: The process whose death makes the monitor stop its rank and exit.
        cleanup_dir: A directory to remove if the parent dies (the launcher's run directory,
            which a killed launcher cannot remove itself).
        stacks_dir: Where stack files of hung ranks go (None: frames only, in the hang report
            and this monitor's log).
    """

    RANK_MONITOR_INIT_TIMEOUT = MONITOR_READY_TIMEOUT

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        ipc_socket_path: str,
        is_restarter_logger: bool = False,
        parent_pid: int | None = None,
        cleanup_dir: str | None = None,
        stacks_dir: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.cleanup_dir = cleanup_dir
        self.stacks_dir = stacks_dir
        self.ipc_socket_path = os.path.abspath(ipc_socket_path)
        self.is_restarter_logger = is_restarter_logger
        self.parent_pid = os.getppid() if parent_pid is None else parent_pid
        self.hostname = socket.gethostname()
        self._section_names = tuple(sorted(cfg.rank_section_timeouts))
        self._io = MessageServer(
            self.ipc_socket_path, self._handle, self._on_close,
            max_connections=MAX_PENDING_CONNECTIONS, send_timeout=SEND_TIMEOUT,
        )
        self._session: RankSession | None = None
        self._state = StateRelay(self._io, cfg.jit_state_timeout)  # just-in-time state (docs/jit-state.md)
        self._launcher: Connection | None = None
        self._worker_pid: int | None = None
        self._stop_reason: str | None = None
        # Set by the SIGCONT handler: the monitor was stopped (see _resume_after_suspension).
        self._continued = False
        # When the loop last ran (monotonic): a suspension began after it.
        self._running_at = time.monotonic()
        # When a late wake-up (no SIGCONT) last counted as a suspension (None: never).
        self._late_suspension_at: float | None = None
        self._parent_gone = False
        self._cycle: int | None = None
        self._escalations = Escalations(cfg.rank_termination_grace or 0.0)
        # The progress of the last rank that detached (the launcher asks after a crash).
        self._last_report: messages.ProgressReport | None = None

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
            cfg: Configuration (the monitor process receives ``cfg.sent_to(Role.MONITOR)``).
            ipc_socket_path: Socket path, in any directory the caller picks (``/tmp``,
                ``$TMPDIR``, a ``mkdtemp()`` or job directory); a missing directory is created
                0700. Refused only where another user could swap the socket: a directory
                writable by others without the sticky bit, or owned by another user. The socket
                is created 0600, and clients check that the monitor runs as their user.
            is_restarter_logger: As in the constructor.
            mp_ctx: ``None`` (recommended) starts a fresh interpreter running
                ``python -m ft_core.monitor.cli``, which imports nothing heavy. A
                ``multiprocessing`` context runs the monitor in a ``Process`` of that context
                instead (with "fork" it inherits the parent's memory, with "spawn" it
                re-imports the parent's main module).

        Returns:
            A handle with the ``multiprocessing.Process`` interface: ``pid``, ``is_alive()``,
            ``join(timeout)``, ``terminate()``, ``kill()``, ``exitcode``.

        Raises:
            ValueError: The socket path is too long for a Unix socket.
            PermissionError: Another user could swap a socket in the directory.
            FileExistsError: Something other than a socket exists at the path.
            RuntimeError: The monitor did not become ready within
                ``RANK_MONITOR_INIT_TIMEOUT`` seconds.
        """
        ipc_socket_path = os.path.abspath(ipc_socket_path)
        protocol.prepare_socket_path(ipc_socket_path)
        if mp_ctx is not None:
            return start_with_multiprocessing(cfg, ipc_socket_path, is_restarter_logger, mp_ctx)
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
        try:
            self._io.listen()
            logger.debug("listening on %s", self.ipc_socket_path)
            if ready_fd is not None:
                os.write(ready_fd, b"ready\n")
                os.close(ready_fd)
            if on_ready is not None:
                on_ready()
            self._loop()
        finally:
            self._end_session("monitor stopping")
            self._escalations.close()
            if in_main_thread():
                signal.set_wakeup_fd(-1)
            self._io.close()
        logger.debug("stopped: %s", self._stop_reason)
        return 0

    # ------------------------------------------------------------------ main loop

    def _install_signal_handlers(self) -> None:
        if in_main_thread():
            signal.set_wakeup_fd(self._io.wakeup_fd, warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT, PARENT_DEATH_SIGNAL):
                signal.signal(sig, self._on_signal)
            # Training clusters send SIGUSR1/2 as preemption warnings to the whole job;
            # they are for the ranks, not for us.
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(sig, signal.SIG_IGN)
            # A job-wide stop ends with SIGCONT to every process: the handler tells the loop that
            # the monitor itself was stopped (the process continues either way).
            signal.signal(signal.SIGCONT, self._on_signal)
            set_parent_death_signal(PARENT_DEATH_SIGNAL)
        if os.getppid() != self.parent_pid:
            self._parent_gone = True

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGCONT:
            self._continued = True
        elif signum == PARENT_DEATH_SIGNAL:
            self._parent_gone = True
        elif self._stop_reason is None:
            self._stop_reason = f"received {signal.Signals(signum).name}"

    def _loop(self) -> None:
        interval = self.cfg.workload_check_interval
        next_housekeeping = time.monotonic() + interval
        while self._stop_reason is None:
            if self._parent_gone:
                self._handle_parent_gone("the launcher process exited")
                return
            now = time.monotonic()
            self._running_at = now
            wake_at = next_housekeeping
            look_again = self._check_rank(now)
            if look_again is not None:
                wake_at = min(wake_at, look_again)
            escalate_at = self._escalate(now)
            if escalate_at is not None:
                wake_at = min(wake_at, escalate_at)
            for conn in self._io.connections():
                if conn.role == "pending":
                    wake_at = min(wake_at, conn.accepted_at + HANDSHAKE_TIMEOUT)
            save_due = self._state.due()
            if save_due is not None:
                wake_at = min(wake_at, save_due)
            self._io.poll(max(0.0, wake_at - now))
            planned_wake, now = max(now, wake_at), time.monotonic()
            self._state.expire(now)
            self._resume_after_suspension(planned_wake, now)
            if now >= next_housekeeping:
                self._housekeeping(now)
                next_housekeeping = now + interval

    def _housekeeping(self, now: float) -> None:
        if os.getppid() != self.parent_pid:
            self._parent_gone = True
        for conn in self._io.connections():
            if conn.role == "pending" and now - conn.accepted_at > HANDSHAKE_TIMEOUT:
                logger.warning(
                    "dropping connection from pid %s: no handshake within %.0f s",
                    conn.peer_pid, HANDSHAKE_TIMEOUT,
                )
                self._io.drop(conn, None)
        session = self._session
        if session is not None and not pid_alive(session.pid):
            # The rank died but a forked child still holds its socket open.
            self._end_session(f"{session.describe()} exited")

    # ------------------------------------------------------------------ messages

    def _handle(self, conn: Connection, message: dict[str, Any]) -> None:
        kind = message["type"]
        if conn.role == "pending":
            if kind == protocol.MSG_INIT:
                self._start_session(conn, message)
            elif kind == protocol.MSG_LAUNCHER_HELLO:
                self._attach_launcher(conn)
            elif kind == protocol.MSG_STATE_CHANNEL:
                refusal = self._state.attach(conn, message, self._session.pid if self._session else None)
                if refusal is not None:
                    self._refuse(conn, refusal)
            else:
                raise ProtocolError(f"unexpected first message {kind!r}")
        elif conn.role == _RANK:
            self._handle_rank_message(conn, message)
        elif conn.role == _LAUNCHER:
            self._handle_launcher_message(message)
        elif conn.role == STATE_ROLE:
            self._state.on_message(conn, message)

    def _on_close(self, conn: Connection, reason: Optional[str]) -> None:
        self._state.on_close(conn)
        if self._session is not None and self._session.conn is conn:
            self._end_session(reason or "connection dropped")
        if self._launcher is conn:
            self._launcher = None
            if reason is not None and self._stop_reason is None:
                # The launcher closed without saying goodbye: it died.
                self._parent_gone = True

    # ------------------------------------------------------------------ launcher side

    def _attach_launcher(self, conn: Connection) -> None:
        if self._launcher is not None:
            self._io.send(conn, messages.Error(error="a launcher is already attached").to_wire())
            self._io.drop(conn, None)
            return
        conn.role = _LAUNCHER
        self._launcher = conn
        self._io.send(conn, messages.Ok().to_wire())

    def _handle_launcher_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == protocol.MSG_WORKER_STARTED:
            pid = message.get("pid")
            if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
                raise ProtocolError(f"worker_started needs a pid in 1..{MAX_PID}, got {pid!r}")
            self._worker_pid = pid
            cycle = message.get("cycle")
            self._cycle = cycle if isinstance(cycle, int) and not isinstance(cycle, bool) else None
            self._last_report = None
            if self.is_restarter_logger:
                logger.info("cycle %s: worker pid %s started", message.get("cycle"), pid)
        elif kind == protocol.MSG_LAUNCHER_BYE:
            self._worker_pid = None
            self._stop_reason = "launcher said goodbye"
        elif kind == protocol.MSG_PING:
            self._notify_launcher(messages.Pong())
        elif kind == protocol.MSG_PROGRESS_QUERY:
            self._notify_launcher(self._progress_report())
        elif kind == protocol.MSG_CAPTURE_STACKS:
            reason = str(message.get("reason") or "requested by the launcher")[:200]
            self._notify_launcher(self._capture_for_launcher(reason))
        elif kind == protocol.MSG_SAVE_STATE:
            cycle = message.get("cycle")
            session = self._session
            self._state.ask(cycle if isinstance(cycle, int) else self._cycle,
                            str(message.get("reason") or "another rank failed")[:200], self._notify_launcher,
                            stopped=session is not None and session.progress().stopped)
        else:
            raise ProtocolError(f"unexpected launcher message {kind!r}")

    def _progress_report(self) -> messages.ProgressReport:
        """The ``progress_report`` answer: the attached rank, else the last one that detached."""
        session = self._session
        if session is not None:
            return messages.ProgressReport(**session.identity(), connected=True, progress=session.progress(),
                                           state_bytes=self._state.approx_bytes if self._state.open else None)
        if self._last_report is not None:
            return self._last_report
        return messages.ProgressReport()

    def _capture_for_launcher(self, reason: str) -> messages.StacksCaptured:
        session = self._session
        if session is None or not pid_alive(session.pid):
            return messages.StacksCaptured(
                stacks=messages.StackSummary(stack_error="no live rank is attached to this monitor"))
        return messages.StacksCaptured(**session.identity(), stacks=self._capture(session, reason))

    def _capture(self, session: RankSession, reason: str) -> messages.StackSummary:
        return session.capture_stacks(self.cfg.stack_capture_budget or 0.0, self.stacks_dir,
                                      f"on node {self.hostname}, cycle {self._cycle}: {reason}",
                                      "" if self._cycle is None else f"cycle{self._cycle}_")

    def _notify_launcher(self, message: messages.Message) -> None:
        if self._launcher is not None:
            self._io.send(self._launcher, message.to_wire())

    def _handle_parent_gone(self, why: str) -> None:
        """The launcher is gone: nothing will restart or reap the worker, so stop it."""
        self._read_what_the_launcher_left()
        targets = {pid for pid in (self._worker_pid, self._session.pid if self._session else None) if pid}
        for pid in targets:
            if pid_alive(pid):
                logger.warning("%s; stopping worker pid %s", why, pid)
                signal_rank(pid, signal.SIGKILL, self._worker_pid)
        if self.cleanup_dir:
            import shutil

            shutil.rmtree(self.cleanup_dir, ignore_errors=True)
        self._stop_reason = why

    def _read_what_the_launcher_left(self) -> None:
        """Handle the messages a dead launcher sent before it died.

        The death signal can wake us before its last ``worker_started`` is read; stopping then
        would leave that worker running with nobody to reap it. A dead peer's socket yields its
        buffered data and then end-of-file, so this ends as soon as the buffer is empty.
        """
        deadline = time.monotonic() + LAUNCHER_DRAIN_TIMEOUT
        while self._launcher is not None and time.monotonic() < deadline:
            self._io.poll(0.05)

    # ------------------------------------------------------------------ rank side

    def _start_session(self, conn: Connection, message: dict[str, Any]) -> None:
        if message.get("protocol") != protocol.PROTOCOL_VERSION:
            self._refuse(conn, (
                f"protocol version {message.get('protocol')!r} is not supported "
                f"(monitor speaks {protocol.PROTOCOL_VERSION}); use matching ft_core versions"))
            return
        if self._session is not None:
            old = self._session
            if pid_alive(old.pid) and old.pid != conn.peer_pid:
                self._refuse(conn, (
                    f"this monitor already watches {old.describe()}; each rank needs its own "
                    "monitor (is the socket path shared between ranks?)"))
                return
            self._end_session(f"{old.describe()} replaced by a new connection")
        session, fd = RankSession.open(conn, message, self.cfg, self._section_names)
        conn.role = _RANK
        reply = {
            "type": protocol.MSG_INIT_OK,
            "config": self.cfg.sent_to(Role.RANK),
            "sections": list(self._section_names),
        }
        try:
            sent = self._io.send(conn, reply, [fd])
        finally:
            os.close(fd)
        if not sent:
            session.close()
            return
        self._session = session
        self._state.identity = {k: session.identity()[k] for k in ("rank", "local_rank")}
        logger.debug("attached %s", session.describe())
        self._notify_launcher(messages.RankConnected(pid=session.pid, **session.info))

    def _refuse(self, conn: Connection, error: str) -> None:
        self._io.send(conn, {"type": protocol.MSG_ERROR, "error": error})
        self._io.drop(conn, None)

    def _end_session(self, reason: str) -> None:
        session = self._session
        if session is None:
            return
        self._session = None
        self._last_report = messages.ProgressReport(**session.identity(), connected=False, progress=session.progress(),
                                                    disconnected_at=time.time())
        session.close()
        logger.debug("detached %s: %s", session.describe(), reason)
        self._io.drop(session.conn, None)

    def _handle_rank_message(self, conn: Connection, message: dict[str, Any]) -> None:
        session = self._session
        if session is None or session.conn is not conn:
            raise ProtocolError("message from a rank that is not attached")
        if message["type"] == protocol.MSG_SHUTDOWN:
            finished = message.get("finished") is True
            if finished:
                # Before the answer: the rank may exit as soon as it has it, and the launcher
                # must know by then that an abort in its teardown is not a training failure.
                self._notify_launcher(messages.RankFinished(
                    pid=session.pid, **{k: v for k, v in session.info.items() if k in ("rank", "local_rank")},
                    **_graceful_stop_fields(message)))
            self._io.send(conn, {"type": protocol.MSG_OK})
            self._end_session("rank ended its training" if finished else "rank shut down monitoring")
            return
        try:
            if message["type"] == protocol.MSG_RESUMED:  # where it resumed from: relayed to the launcher
                step, source = messages.resumed_fields(message)
                self._notify_launcher(messages.RankResumed(**session.identity(), step=step, source=source))
            else:
                session.apply_update(message)
        except ValueError as err:  # ConfigError from the timeout validator included
            self._io.send(conn, {"type": protocol.MSG_ERROR, "error": str(err)})
            return
        self._io.send(conn, {"type": protocol.MSG_OK})

    # ------------------------------------------------------------------ hang detection

    def _check_rank(self, now: float) -> float | None:
        """Detect a hang of the attached rank; return when to look again (None: never)."""
        session = self._session
        if session is None or session.hang_handled:
            return None
        verdict = deadlines.check(session.timeouts, session.read_slot(), now)
        if verdict.hang is not None and self._resume_after_suspension(now, now):
            # The SIGCONT of a job-wide stop was handled only now: the deadlines restarted.
            verdict = deadlines.check(session.timeouts, session.read_slot(), now)
        if verdict.hang is None:
            return verdict.wake_at
        if not pid_alive(session.pid):
            self._end_session(f"{session.describe()} exited")
            return None
        self._handle_hang(session, verdict.hang, now)
        return None

    def _resume_after_suspension(self, planned_wake: float, now: float) -> bool:
        """Restart every deadline at ``now`` if the monitor itself was stopped; True if it was.

        Stopped means a SIGCONT arrived, or the loop woke far later than ``planned_wake``
        (:func:`deadlines.was_suspended`). A monitor stopped with its rank (a job-wide stop)
        cannot tell how long the rank could run, so the rank gets its full timeouts again.
        """
        continued, self._continued = self._continued, False
        if not deadlines.was_suspended(planned_wake, now, continued, self._late_suspension_at):
            return False
        if not continued:
            self._late_suspension_at = now
        logger.info("the monitor was suspended for up to %.1f s (job-wide stop?): deadlines restarted",
                    now - self._running_at)
        self._running_at = now
        if self._session is not None:
            self._session.timeouts.restart_clocks(now)
        for conn in self._io.connections():
            if conn.role == "pending":  # a handshake in progress gets its full time again too
                conn.accepted_at = max(conn.accepted_at, now)
        return True

    def _handle_hang(self, session: RankSession, deadline: deadlines.Deadline, now: float) -> None:
        session.hang_handled = True
        sig = self.cfg.rank_termination_signal
        hang = session.hang_message(deadline, now, self.hostname, sig.name)
        # Evidence before the kill: the stacks first (bounded), then the report, then the signal.
        captured = self._capture(session, hang.cause)
        hang = messages.with_stacks(hang, captured)
        where = stacks.innermost_user_frame(captured.stack_frames) or (captured.stack_frames or [None])[0]
        save = self._state.open and not (hang.progress is not None and hang.progress.stopped)
        if save:
            # Its state first (a rank blocked in a collective holds a consistent one): the
            # launcher waits that much longer before it kills the rank itself.
            hang = dataclasses.replace(hang, save_timeout=round(self._state.timeout(), 3))
        logger.error(
            "%s on node %s: %s%s; %ssending SIGCONT then %s",
            session.describe(), self.hostname, hang.cause, f" (at {where})" if where else "",
            "asking it to save its state, then " if save else "", sig.name,
        )
        self._notify_launcher(hang)
        if save:
            self._state.ask(self._cycle, hang.cause, lambda _reply: self._signal_hung(session))
        else:
            self._signal_hung(session)

    def _signal_hung(self, session: RankSession) -> None:
        sig = self.cfg.rank_termination_signal
        if not pid_alive(session.pid):
            return
        group = signal_rank(session.pid, sig, self._worker_pid)
        if sig != signal.SIGKILL:
            self._escalations.start(session.pid, group, session.identity(), time.monotonic())

    def _escalate(self, now: float) -> float | None:
        """SIGKILL hung ranks that outlived their termination signal; return when to look again."""
        for killed in self._escalations.run_due(now):
            logger.error("rank %s (pid %s) was still alive %.1f s after %s; sent SIGKILL to its process group",
                         killed.get("rank"), killed["pid"], killed["after"], self.cfg.rank_termination_signal.name)
            self._notify_launcher(messages.RankEscalatedMessage.from_wire(killed))
        return self._escalations.next_due()


# ---------------------------------------------------------------------- helpers


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


_SIGNAL_NAME = re.compile(r"SIG[A-Z0-9]{1,12}")
_MAX_STEP = 2**63 - 1


def _graceful_stop_fields(message: dict[str, Any]) -> dict[str, Any]:
    """The graceful stop a rank's ``shutdown`` reports (``stop_step``, ``stop_run_steps``,
    ``stop_signal``), for its ``rank_finished``; values that are not a step (an int from 0 to
    2**63-1) or a signal name are left out, so nothing else reaches the launcher's records."""
    def step(name: str) -> dict[str, int]:
        value = message.get(name)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_STEP
        return {name: value} if ok else {}

    found = step("stop_step")
    if not found:
        return {}
    signal_name = message.get("stop_signal")
    if isinstance(signal_name, str) and _SIGNAL_NAME.fullmatch(signal_name):
        found["stop_signal"] = signal_name
    return {**found, **step("stop_run_steps")}


def start_with_multiprocessing(
    cfg: FaultToleranceConfig, socket_path: str, is_restarter_logger: bool, mp_ctx: Any
) -> Any:
    """Run :meth:`RankMonitorServer.run` in a daemon ``Process`` of ``mp_ctx``; wait until ready.

    Returns:
        The started ``multiprocessing.Process``.

    Raises:
        RuntimeError: Not ready within ``MONITOR_READY_TIMEOUT`` (the process is killed).
    """
    ready = mp_ctx.Event()
    process = mp_ctx.Process(
        target=RankMonitorServer.run,
        kwargs={
            "cfg": FaultToleranceConfig.as_received(cfg.sent_to(Role.MONITOR), Role.MONITOR),
            "ipc_socket_path": socket_path,
            "rank_monitor_ready_event": ready,
            "is_restarter_logger": is_restarter_logger,
        },
        daemon=True,
    )
    process.start()
    if not ready.wait(MONITOR_READY_TIMEOUT):
        process.kill()
        process.join(5)
        raise RuntimeError(f"rank monitor for {socket_path} did not start in time")
    return process
