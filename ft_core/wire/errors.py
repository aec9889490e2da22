"""Exceptions raised by ft_core."""

from __future__ import annotations

from typing import Optional


class RankMonitorClientError(RuntimeError):
    """The client was misused or could not reach its monitor; the message says how to fix it."""


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
