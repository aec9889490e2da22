"""The auto-resume finished flag of a Lightning run: its path at set-up, created at the end of a
completed training.

The completion rules and the file itself are :mod:`ptl_resiliency._training_state`'s; this object
holds the path for one ``fit`` and says what it did.
"""

from __future__ import annotations

import os
from typing import Optional

from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.sections_policy import is_graceful_stop
from ft_core.wire.config import ConfigError
from ft_core.wire.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR
from ptl_resiliency._lightning import pl
from ptl_resiliency._training_state import create_finished_flag, incomplete_reason


class FinishedFlag:
    """The file that tells the auto-resume loop that training completed (``autoresume=True``).

    Args:
        owner: The callback's class name (error messages name it).
        log: The callback's logger.
    """

    def __init__(self, owner: str, log: RankLoggerAdapter) -> None:
        self._owner = owner
        self._log = log
        self.autoresume = False  # this run's autoresume argument (without it, no flag)
        self.path: Optional[str] = None  # from FAULT_TOL_FINISHED_FLAG_FILE, read at set-up

    def arm(self, autoresume: bool) -> None:
        """Read the flag's path for a new run (with ``autoresume``; else there is no flag).

        Raises:
            ConfigError: ``autoresume=True`` without ``FAULT_TOL_FINISHED_FLAG_FILE``.
        """
        self.autoresume = autoresume
        self.path = None
        if not autoresume:
            return
        self.path = os.environ.get(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR) or None
        if self.path is None:
            raise ConfigError(
                f"{self._owner}(autoresume=True) needs {FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR}: the "
                "path of the file to create when training completes, which tells the "
                "auto-resume loop to stop. Set it (scripts/autoresume.sh does), or pass "
                "autoresume=False."
            )

    def settle(self, trainer: pl.Trainer, completed: Optional[str],
               exception: Optional[BaseException]) -> Optional[OSError]:
        """At the end of the run: on rank 0, create the flag when training ``completed`` (the
        reason), else say why there is none.

        Returns:
            The error that kept rank 0 from creating the flag of a completed run (logged; the
            caller raises it after disconnecting, unless the run already failed), else None.
        """
        if not self.autoresume:
            return None
        if completed is None:
            self._log.rank_zero_info(
                "training did not complete (%s); no finished flag, the run can be resumed",
                exception if is_graceful_stop(exception) else
                f"ended with {exception!r}" if exception is not None else incomplete_reason(trainer),
            )
        elif trainer.global_rank == 0:
            try:
                create_finished_flag(self.path, completed, trainer)  # type: ignore[arg-type]
                self._log.info("training completed (%s); created %s", completed, self.path)
            except OSError as err:
                self._log.error("training completed but the finished flag %s could not be created: %s",
                                self.path, err)
                return err
        return None
