"""Exceptions raised by ft_core."""

from __future__ import annotations

import sys
import types
from typing import Optional


class RankMonitorClientError(RuntimeError):
    """The client was misused or could not reach its monitor; the message says how to fix it."""


class NotStartedByLauncherError(RankMonitorClientError):
    """This process was not started by ``ft_launcher``, so it has no rank monitor to connect to.

    A :class:`RankMonitorClientError` (code that catches that catches this too). Its message says
    how to start the script; a traceback through the user's framework (about 60 lines of
    Lightning's loops) would only bury it. So creating one installs :func:`message_only_excepthook`:
    if this error ends the program uncaught, its message alone goes to stderr (exit code 1);
    every other uncaught exception is shown as before.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        install_message_only_excepthook()


def message_only_excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: Optional[types.TracebackType],
) -> None:
    """``sys.excepthook`` that prints a :class:`NotStartedByLauncherError` as its message alone.

    Any other exception goes to the hook that was installed before (Python's default one,
    normally), unchanged.
    """
    if isinstance(exc, NotStartedByLauncherError):
        sys.stderr.write(f"error: {exc}\n")
        sys.stderr.flush()
        return
    _previous_excepthook(exc_type, exc, tb)


_previous_excepthook = sys.__excepthook__


def install_message_only_excepthook() -> None:
    """Make :func:`message_only_excepthook` the process's ``sys.excepthook``, chained to the hook
    it replaces. Once per process: a hook installed later (which may chain to ours) is kept."""
    global _previous_excepthook
    if getattr(install_message_only_excepthook, "done", False):
        return
    install_message_only_excepthook.done = True  # type: ignore[attr-defined]
    _previous_excepthook = sys.excepthook
    sys.excepthook = message_only_excepthook


class TimeoutsCalcError(RuntimeError):
    """Timeouts cannot be calculated yet (not enough observations), or a section event is invalid."""


class ProtocolError(ValueError):
    """A peer sent a message that is malformed, too large, or of an unexpected type."""


class GracefulStopExit(SystemExit):
    """Ends a Lightning ``fit`` at the agreed graceful stop step, after its checkpoint was saved.

    A ``SystemExit`` with code 0, as Lightning's own ``SIGTERMException``: it leaves the loops at
    once (no validation run, no further step) and, uncaught, the process exits 0. Unlike a plain
    ``SystemExit(0)`` it does not mean that training completed: no finished flag is written. See
    :mod:`ft_core.client.graceful_stop`.

    Attributes:
        stop_step: Lightning's global step the ranks stopped after.
        signal_name: The stop signal (e.g. ``"SIGUSR1"``).
        checkpoint: The checkpoint saved at the stop.
    """

    def __init__(self, stop_step: int, signal_name: str, checkpoint: Optional[str] = None) -> None:
        super().__init__(0)
        self.stop_step = stop_step
        self.signal_name = signal_name
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = f", checkpoint {self.checkpoint}" if self.checkpoint else ""
        return f"graceful stop after step {self.stop_step} ({self.signal_name}{saved})"
