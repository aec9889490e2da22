"""Fault tolerance figures in the Trainer's logger, next to the loss.

The callbacks log, when they change: the launcher's cycle (``ft/cycle``: 0 for the first start,
+1 for each in-job restart), the auto-resume attempt (``ft/autoresume_attempt`` under
``scripts/autoresume.sh``) and the timeouts in force (``ft/heartbeat_timeout``,
``ft/initial_heartbeat_timeout`` for the heartbeats callback; ``ft/section_timeout/<name>``,
``ft/out_of_section_timeout`` for the sections callback; infinite ones are not logged). They
are logged at the start of training (after a checkpoint was restored, at its step), after
every timeouts update, and at the end of the run if not yet (a run resumed at its end trains
nothing), to every logger of the ``Trainer`` (TensorBoard, CSV, ...).
"""

from __future__ import annotations

import logging
import os
from typing import Union

from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.wire.env import AUTORESUME_ATTEMPT_ENV_VAR, FT_CYCLE_ENV_VAR
from ptl_resiliency._lightning import pl

Logger = Union[logging.Logger, logging.LoggerAdapter]
PREFIX = "ft/"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def metric_values(client: RankMonitorClient, sections: bool) -> dict[str, float]:
    """The figures to log now, by metric name (see the module docstring)."""
    values: dict[str, float] = {}
    for name, env in (("cycle", FT_CYCLE_ENV_VAR), ("autoresume_attempt", AUTORESUME_ATTEMPT_ENV_VAR)):
        number = _env_int(env)
        if number is not None:
            values[PREFIX + name] = float(number)
    if sections:
        timeouts = client.section_timeouts
        for section, seconds in sorted(timeouts.section.items()):
            if seconds is not None:
                values[f"{PREFIX}section_timeout/{section}"] = float(seconds)
        if timeouts.out_of_section is not None:
            values[PREFIX + "out_of_section_timeout"] = float(timeouts.out_of_section)
    else:
        hb = client.hb_timeouts
        if hb.initial is not None:
            values[PREFIX + "initial_heartbeat_timeout"] = float(hb.initial)
        if hb.subsequent is not None:
            values[PREFIX + "heartbeat_timeout"] = float(hb.subsequent)
    return values


class MetricsLogger:
    """Logs :func:`metric_values` to ``trainer.loggers`` when they changed since the last call.

    Args:
        trainer: The ``Trainer`` of the run.
        log: Where a logger's failure is reported (one WARNING; training goes on).
        sections: The sections callback's figures instead of the heartbeat callback's.
    """

    def __init__(self, trainer: pl.Trainer, log: Logger, sections: bool) -> None:
        self._trainer = trainer
        self._log = log
        self._sections = sections
        self._last: dict[str, float] = {}

    def log(self, client: RankMonitorClient, save: bool = False) -> dict[str, float]:
        """Log what changed; ``save`` flushes the loggers (after the fit loop ended). Never raises.

        Returns:
            The values logged (empty when nothing changed or there is no logger).
        """
        values = metric_values(client, self._sections)
        changed = {name: value for name, value in values.items() if self._last.get(name) != value}
        loggers = self._trainer.loggers
        if not changed or not loggers:
            return {}
        self._last.update(changed)
        step = int(self._trainer.global_step)
        for logger in loggers:
            try:
                logger.log_metrics(changed, step=step)
                if save:
                    logger.save()
            except Exception as err:  # a logger's own failure must not stop training
                self._log.warning("fault tolerance: could not log %s to %s: %s", sorted(changed),
                                  type(logger).__name__, err)
        return changed
