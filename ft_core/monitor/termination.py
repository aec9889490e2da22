"""Ending a hung rank: the termination signal, then SIGKILL if the rank outlives a grace period.

A monitor that found its rank hung sends ``SIGCONT`` and ``rank_termination_signal`` to the
rank's process group (:func:`signal_rank`). A rank whose handler of that signal returns (a
SIGTERM handler that only logs) or that cannot run it in time would otherwise live on: the
monitor keeps a handle on it (:class:`Escalations`, a pidfd, so a recycled pid is never
signalled) and sends SIGKILL to its process group once ``rank_termination_grace`` has passed.

Standard library only: the rank monitor uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


def signal_rank(pid: int, sig: signal.Signals, worker_pid: int | None) -> int | None:
    """SIGCONT then ``sig`` to the rank, to its whole process group when it owns one.

    Workers started by the launcher lead their own process group, so the group signal also
    reaches their children (data-loader workers). A rank that shares its group with others (a
    test harness, a shell) is signalled alone.

    Returns:
        The process group that was signalled, or None when the rank was signalled alone (or
        was gone).
    """
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return None
    use_group = pgid == pid or (worker_pid is not None and pgid == worker_pid)
    for s in (signal.SIGCONT, sig):
        try:
            if use_group:
                os.killpg(pgid, s)
            else:
                os.kill(pid, s)
        except ProcessLookupError:
            break
        except PermissionError as err:
            logger.error("cannot signal pid %s: %s", pid, err)
            break
    return pgid if use_group else None


@dataclass
class _Pending:
    pid: int
    pidfd: int
    due: float
    group: int | None
    details: dict[str, Any] = field(default_factory=dict)


class Escalations:
    """Ranks that were sent their termination signal and get SIGKILL if still alive when due.

    Args:
        grace: Seconds from the termination signal to SIGKILL.
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._pending: list[_Pending] = []

    def start(self, pid: int, group: int | None, details: dict[str, Any], now: float) -> None:
        """Watch ``pid`` (signalled at ``now``); ``group`` is the process group to kill with it."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # already gone
            return
        self._pending.append(_Pending(pid, pidfd, now + self.grace, group, dict(details)))

    def next_due(self) -> float | None:
        """When :meth:`run_due` must run next (None: nothing pending)."""
        return min((p.due for p in self._pending), default=None)

    def run_due(self, now: float) -> list[dict[str, Any]]:
        """SIGKILL every watched rank that is due and still alive; forget those that exited.

        Returns:
            One ``{"pid", "signal": "SIGKILL", "after", ...details}`` per rank killed.
        """
        killed, keep = [], []
        for pending in self._pending:
            if _exited(pending.pidfd):
                os.close(pending.pidfd)
                continue
            if now < pending.due:
                keep.append(pending)
                continue
            if pending.group is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pending.group, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                signal.pidfd_send_signal(pending.pidfd, signal.SIGKILL)
            os.close(pending.pidfd)
            killed.append({"pid": pending.pid, "signal": "SIGKILL", "after": self.grace, **pending.details})
        self._pending = keep
        return killed

    def close(self) -> None:
        for pending in self._pending:
            with contextlib.suppress(OSError):
                os.close(pending.pidfd)
        self._pending = []


def _exited(pidfd: int) -> bool:
    """A pidfd becomes readable when its process exited."""
    readable, _, _ = select.select([pidfd], [], [], 0)
    return bool(readable)
