"""The node check as the agent runs it before each rendezvous (the checks are :mod:`launcher.node.check`).

:class:`JoinCheck` takes its settings from the config, says each skipped check once, and records
a failed check (``node_check``) before it raises :class:`~launcher.node.check.NodeCheckFailed`.
"""

from __future__ import annotations

import dataclasses
import logging

from ft_core.wire.config import FaultToleranceConfig
from launcher.events.log import EventLog
from launcher.events.records import NodeCheck
from launcher.node import check

logger = logging.getLogger(__name__)


class JoinCheck:
    """The node check before each rendezvous.

    Args:
        ft_cfg: The config (``node_check_*``, ``node_health_check_*``).
        events: Where a failed check is recorded.
    """

    def __init__(self, ft_cfg: FaultToleranceConfig, events: EventLog) -> None:
        self._settings = check.NodeCheckSettings(
            dirs=check.default_dirs() if ft_cfg.node_check_dirs is None else ft_cfg.node_check_dirs,
            min_free_mb=ft_cfg.node_check_min_free_mb, max_write_seconds=ft_cfg.node_check_max_write_seconds,
            command=ft_cfg.node_health_check_cmd, command_timeout=ft_cfg.node_health_check_timeout)
        self._events = events
        self._said_skipped: set[str] = set()

    def run(self, cycle: int) -> None:
        """Check the node before the rendezvous of ``cycle``.

        Raises:
            check.NodeCheckFailed: A check failed: this node does not join (torch's ``run``
                stops the workers; the launcher exits 65).
        """
        results = check.run_checks(self._settings)
        for result in results:
            if result.skipped and result.name not in self._said_skipped:
                self._said_skipped.add(result.name)
                logger.info("node check: %s %s", result.name, result.detail)
        failed = check.failures(results)
        if not failed:
            logger.debug("node check passed: %s", check.describe(results))
            return
        self._events.record_event(NodeCheck(cycle=cycle, passed=False,
                                            checks=[dataclasses.asdict(r) for r in results]))
        raise check.NodeCheckFailed(check.describe(failed))
