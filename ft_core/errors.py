"""Exceptions raised by ft_core."""

from __future__ import annotations


class RankMonitorClientError(RuntimeError):
    """The client was misused or could not reach its monitor; the message says how to fix it."""


class TimeoutsCalcError(RuntimeError):
    """Timeouts cannot be calculated yet (not enough observations)."""


class ProtocolError(ValueError):
    """A peer sent a message that is malformed, too large, or of an unexpected type."""
