"""Rank-prefixed logging: one adapter instead of hand-written ``[rank N]`` prefixes.

Also what makes a rank's fault tolerance lines visible without any logging set-up
(:func:`configure_rank_logging`), the way Lightning's own INFO lines are.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Optional

_CONSOLE_HANDLER_MARK = "_ft_core_console"


class RankLoggerAdapter(logging.LoggerAdapter):
    """A logger whose messages start with ``[rank N] `` once the rank is known.

    The prefix is added only for records that pass the level check, so a disabled debug call
    costs no formatting.

    Args:
        logger: The logger to write to.
        rank: The global rank, or None while unknown (then no prefix).
    """

    def __init__(self, logger: logging.Logger, rank: Any = None) -> None:
        super().__init__(logger, {"rank": rank})

    @property
    def rank(self) -> Any:
        """The rank in the prefix (None: no prefix)."""
        return self.extra["rank"]

    def set_rank(self, rank: Any) -> None:
        """Use ``rank`` in the prefix from now on."""
        self.extra = {"rank": rank}

    def rank_zero_info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """INFO on rank 0 (or while the rank is unknown), DEBUG on the other ranks.

        For lines that every rank would print alike (the timeouts in force after a calculation,
        a saved file): one copy at INFO, like Lightning's rank-zero lines.
        """
        kwargs.setdefault("stacklevel", 2)  # the record names our caller, not this method
        self.log(logging.INFO if self.extra["rank"] in (None, 0) else logging.DEBUG, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        rank = self.extra["rank"]
        return (msg if rank is None else f"[rank {rank}] {msg}"), kwargs


def rank_logger(name: str, rank: Any = None) -> RankLoggerAdapter:
    """``RankLoggerAdapter(logging.getLogger(name), rank)``."""
    return RankLoggerAdapter(logging.getLogger(name), rank)


def configure_rank_logging(level: Optional[int], *names: str) -> None:
    """Make the loggers ``names`` of a rank process log at ``level`` and reach the console.

    ``level`` is the config's ``log_level`` (None: INFO). When the program has set up no logging
    at all (the root logger has no handler) and a logger has no handler of its own, a stderr
    handler that prints the bare message is attached to it and it stops propagating, as
    Lightning does for ``lightning.pytorch``: the important lines appear in a script without
    any logging set-up, and a ``logging.basicConfig`` made later does not print them twice.
    Where the program configured logging, only the level is set and records go to its handlers.
    """
    for name in names:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO if level is None else level)
        if logger.hasHandlers():  # ours from an earlier call, or the program's own set-up
            continue
        handler = logging.StreamHandler(sys.stderr)
        setattr(handler, _CONSOLE_HANDLER_MARK, True)
        logger.addHandler(handler)
        logger.propagate = False
