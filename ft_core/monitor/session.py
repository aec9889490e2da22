"""The rank a monitor currently watches: its slot, its timeouts, and its timeout updates.

A session starts with the rank's ``init`` message (:meth:`RankSession.open`: a fresh progress
slot, the configured timeouts) and ends when the rank shuts monitoring down, disconnects or
exits. While it lasts the rank may change its timeouts (:meth:`RankSession.apply_update`); the
monitor reads the slot (:meth:`RankSession.read_slot`) to check its deadlines
(:mod:`ft_core.monitor.deadlines`).

Standard library only: the rank monitor uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Optional

from ft_core.monitor import deadlines
from ft_core.monitor.message_server import Connection
from ft_core.wire import protocol, stacks
from ft_core.wire.config import ConfigError, FaultToleranceConfig, parse_seconds
from ft_core.wire.errors import ProtocolError
from ft_core.wire.messages import Progress, RankHang, StackSummary
from ft_core.wire.procfs import read_stat
from ft_core.wire.progress_slot import ProgressSlot
from ft_core.wire.stacks import StackTarget

logger = logging.getLogger(__name__)

_INFO_KEYS = ("rank", "local_rank", "world_size", "hostname")
MAX_INFO_INT = 2**31 - 1
MAX_INFO_CHARS = 255  # a fully qualified host name


@dataclass
class RankSession:
    """State of the rank currently attached; discarded when its connection ends."""

    conn: Connection
    pid: int
    info: dict[str, Any]
    slot: ProgressSlot
    timeouts: deadlines.RankTimeouts
    stack_target: StackTarget
    hang_handled: bool = False

    @classmethod
    def open(
        cls, conn: Connection, init: dict[str, Any], cfg: FaultToleranceConfig,
        section_names: tuple[str, ...],
    ) -> tuple[RankSession, int]:
        """A session for the rank behind ``conn``, which sent ``init``, with the configured timeouts.

        Returns:
            The session and the slot's file descriptor, to pass to the rank (the caller closes it).
        """
        info = {key: init[key] for key in _INFO_KEYS if _plausible(init.get(key))}
        stack_target = _stack_target(conn, init)
        slot, fd = ProgressSlot.create(len(section_names))
        now = time.monotonic()
        slot.set_out_of_section_since(now)
        timeouts = deadlines.RankTimeouts(
            connected_at=now,
            initial_heartbeat=cfg.initial_rank_heartbeat_timeout,
            heartbeat=cfg.rank_heartbeat_timeout,
            section_names=section_names,
            sections=[cfg.rank_section_timeouts[n] for n in section_names],
            out_of_section=cfg.rank_out_of_section_timeout,
        )
        return cls(conn=conn, pid=conn.peer_pid, info=info, slot=slot, timeouts=timeouts,
                   stack_target=stack_target), fd

    def close(self) -> None:
        """Release the slot and the rank's stack dump descriptor."""
        self.slot.close()
        if self.stack_target.dump_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.stack_target.dump_fd)

    def describe(self) -> str:
        rank = self.info.get("rank")
        local = self.info.get("local_rank")
        return f"rank {rank} (local rank {local}, pid {self.pid})"

    def read_slot(self) -> deadlines.SlotReading:
        """Read the slot in the order the client's stores are designed for (see progress_slot)."""
        slot = self.slot
        return deadlines.SlotReading(
            last_heartbeat=slot.last_heartbeat(),
            last_section_activity=slot.last_section_activity(),
            out_of_section_since=slot.out_of_section_since(),
            sections_open_since=tuple(slot.section_open_since(i) for i in range(slot.section_count)),
        )

    def progress(self) -> Progress:
        """What the rank last did, for the launcher's root-cause analysis (``progress_report``).

        Times are epoch seconds (the launcher compares them across nodes); the fields are
        described on :class:`~ft_core.wire.messages.Progress`.
        """
        reading = self.read_slot()
        mono_now, wall_now = time.monotonic(), time.time()

        def wall(mono: float) -> float:
            return round(wall_now - (mono_now - mono), 4)

        last = max(reading.last_heartbeat, reading.last_section_activity)
        opened = [(since, name) for name, since in zip(self.timeouts.section_names, reading.sections_open_since,
                                                       strict=True) if since > 0.0]
        open_section, section_since = None, None
        if opened:
            since, open_section = max(opened)
            section_since = wall(since)
        elif reading.last_section_activity > 0.0 and reading.out_of_section_since > 0.0:
            section_since = wall(reading.out_of_section_since)
        stat = read_stat(self.pid)
        return Progress(
            last_progress_at=wall(last if last > 0.0 else self.timeouts.connected_at),
            open_section=open_section,
            step=self.slot.step(),
            heartbeats=self.slot.heartbeat_count(),
            section_since=section_since,
            stopped=stat is not None and stat.state in ("T", "t"),
        )

    def identity(self) -> dict[str, Any]:
        """``rank``, ``local_rank`` and ``pid``, as the launcher's messages name a rank."""
        return {"rank": self.info.get("rank"), "local_rank": self.info.get("local_rank"), "pid": self.pid}

    def capture_stacks(self, budget: float, stacks_dir: str | None, context: str, file_prefix: str) -> StackSummary:
        """Capture the rank's stacks within ``budget`` s (see :func:`ft_core.wire.stacks.capture`).

        With ``stacks_dir`` the whole dump goes to a file there (its header names the rank and
        ``context``); without, into the monitor's log. Returns where they went, the main
        thread's frames or why there are none, and how they were taken.
        """
        stat = read_stat(self.pid)
        stopped = stat is not None and stat.state in ("T", "t")
        result = stacks.capture(self.stack_target, budget, stopped)
        path, error = None, result.error
        if result.method is None:
            # a rank that exited has no stack and needs none: the launcher says so once, in its log
            logger.log(logging.DEBUG if result.exited else logging.WARNING, "%s: no stacks: %s%s", self.describe(),
                       result.error, f" ({result.note})" if result.note else "")
        else:
            if result.note:
                logger.info("%s: stacks taken with %s (%s)", self.describe(), result.method, result.note)
            if stacks_dir:
                header = (f"{self.describe()} {context}\ncaptured with {result.method} in "
                          f"{result.seconds:.3f} s at {time.strftime('%Y-%m-%d %H:%M:%S')}")
                rank = self.info.get("rank")
                name = f"{file_prefix}rank{'' if rank is None else rank}_pid{self.pid}_{int(time.time() * 1000)}.txt"
                path, error = stacks.write_stack_file(stacks_dir, name, header, result)
            else:
                logger.error("%s: stacks (%s):\n%s", self.describe(), result.method, result.text)
        return StackSummary(stack_file=path, stack_frames=list(result.frames), stack_error=error,
                            stack_method=result.method, stack_seconds=result.seconds)

    def apply_update(self, message: dict[str, Any]) -> None:
        """Apply a ``set_hb_timeouts`` or ``set_section_timeouts`` message from the rank.

        Raises:
            ValueError: A value the rank may correct (bad timeout, unknown section); nothing is
                changed and the rank gets the error as its reply.
            ProtocolError: Not a timeout update.
        """
        kind = message["type"]
        timeouts = self.timeouts
        if kind == protocol.MSG_SET_HB_TIMEOUTS:
            initial, subsequent = _timeout_value(message, "initial"), _timeout_value(message, "subsequent")
            timeouts.set_heartbeat(initial, subsequent, time.monotonic())
            logger.info(
                "%s: heartbeat timeouts set to initial=%s subsequent=%s", self.describe(),
                _fmt(timeouts.initial_heartbeat), _fmt(timeouts.heartbeat),
            )
        elif kind == protocol.MSG_SET_SECTION_TIMEOUTS:
            sections = message.get("section")
            if not isinstance(sections, dict):
                raise ValueError("'section' must be a mapping of section name to seconds")
            values = {name: _timeout_value(sections, name) for name in sections}
            out_of_section = _timeout_value(message, "out_of_section") if "out_of_section" in message else ...
            timeouts.set_sections(values, time.monotonic(), out_of_section)
            pairs = zip(timeouts.section_names, timeouts.sections, strict=True)
            logger.info(
                "%s: section timeouts set to %s, out-of-section=%s", self.describe(),
                ", ".join(f"{n}={_fmt(t)}" for n, t in pairs) or "-", _fmt(timeouts.out_of_section),
            )
        else:
            raise ProtocolError(f"unexpected rank message {kind!r}")

    def hang_message(self, deadline: deadlines.Deadline, now: float, node: str, signal_name: str) -> RankHang:
        """The ``rank_hang`` message telling the launcher that ``deadline`` passed at ``now``
        (without stacks: the monitor adds them, :func:`ft_core.wire.messages.with_stacks`)."""
        return RankHang(
            pid=self.pid,
            **self.info,
            node=node,
            kind=deadline.kind.value,
            section=deadline.section,
            elapsed=round(now - deadline.started, 4),
            timeout=deadline.timeout,
            cause=deadline.describe(now),
            signal=signal_name,
            detected_at=time.time(),
            heartbeats=self.slot.heartbeat_count(),
            progress=self.progress(),
        )


def _stack_target(conn: Connection, init: dict[str, Any]) -> StackTarget:
    """How to read the rank's stacks: its faulthandler memfd (sent with ``init``) and signal."""
    fds = conn.take_fds()
    for extra in fds[1:]:
        with contextlib.suppress(OSError):
            os.close(extra)
    fd = fds[0] if fds else None
    signum = init.get("stack_signal")
    main_thread = init.get("main_thread")
    valid_signal = (isinstance(signum, int) and not isinstance(signum, bool)
                    and signal.SIGRTMIN <= signum <= signal.SIGRTMAX)
    if fd is not None and not valid_signal:
        # A descriptor without a usable signal is no dump handler; never send a signal whose
        # default action would end the rank.
        with contextlib.suppress(OSError):
            os.close(fd)
        fd = None
    return StackTarget(
        pid=conn.peer_pid, dump_fd=fd, dump_signal=signum if fd is not None else None,
        main_thread=main_thread if isinstance(main_thread, int) and not isinstance(main_thread, bool) else None,
    )


def _plausible(value: Any) -> bool:
    """Whether a rank detail (rank, host name, ...) is worth echoing in logs and hang reports.

    Others are left out: they are only informative, and an oversized one would make the hang
    report too large to send.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return 0 <= value <= MAX_INFO_INT
    return isinstance(value, str) and len(value) <= MAX_INFO_CHARS


def _timeout_value(mapping: dict[str, Any], key: str) -> Optional[float]:
    """A timeout from a rank's message: seconds within the config's bounds, or null.

    Raises:
        ConfigError: Not a JSON number or null, or out of range (the message says which).
    """
    value = mapping.get(key)
    if isinstance(value, str):  # JSON numbers only on the wire, although the validator reads "12"
        raise ConfigError(f"timeout {key!r} must be a number of seconds or null, got {value!r}")
    return parse_seconds(f"timeout {key!r}", value)


def _fmt(value: Optional[float]) -> str:
    return "inf" if value is None else f"{value:.3g}s"
