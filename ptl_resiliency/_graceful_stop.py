"""The graceful stop in a Lightning run: where its checkpoint goes, when its handlers are
installed, and the stop itself (save on every rank, leave ``fit``).

The rules (which signals, the agreed stop step, the handlers' install and restore) are
:mod:`ft_core.client.graceful_stop`'s; the :class:`~ft_core.client.session.FrontEndSession`
creates the stop at set-up and uninstalls it at close. This object only carries them out at
Lightning's points: the handlers at ``on_train_start`` (after Lightning's own), the stop after a
training batch.
"""

from __future__ import annotations

import os
from typing import NoReturn, Optional

from ft_core.client.graceful_stop import GracefulStopConfig, GracefulStopExit
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.sections_policy import is_graceful_stop
from ft_core.client.session import FrontEndSession
from ft_core.wire.config import ConfigError
from ptl_resiliency._lightning import pl


class LightningGracefulStop:
    """A callback's graceful stop: armed at set-up, installed at train start, carried out after a step.

    Args:
        owner: The callback's class name (error messages name it).
        session: The callback's session, which holds the armed stop (``session.graceful_stop``).
        log: The callback's logger.
    """

    def __init__(self, owner: str, session: FrontEndSession, log: RankLoggerAdapter) -> None:
        self._owner = owner
        self.config: Optional[GracefulStopConfig] = None  # this run's; None: no graceful stop
        self._session = session
        self._log = log
        self.stopped: Optional[GracefulStopExit] = None  # what ended the last fit, if a graceful stop did

    def arm(self, config: Optional[GracefulStopConfig]) -> None:
        """Create this run's stop from ``config`` (None: none) in the session (its set-up step)
        and chain its handlers to the program's current ones.

        The handlers are installed later, at :meth:`install`: after Lightning's own, so that ours
        then call the handlers the program had before fit (the user's), not Lightning's (whose
        SIGTERM handling would end the run at the next batch, without a checkpoint).
        """
        self.config = config
        self.stopped = None
        stop = self._session.arm_graceful_stop(config)
        if stop is not None:
            stop.chain_to_current_handlers()

    def describe(self) -> str:
        """``off``, or ``on`` and the signals it stops on (for the "set up" line)."""
        if self.config is None:
            return "off"
        return "on " + ", ".join(s.name for s in self.config.signals)

    def install(self, trainer: pl.Trainer) -> None:
        """Install the stop's signal handlers (at train start; Lightning installed its own just before).

        Raises:
            ConfigError: There is no checkpoint to save at the stop (now rather than at the stop).
        """
        stop = self._session.graceful_stop
        if stop is None:
            return
        self.checkpoint_path(trainer)
        if not stop.install():
            self._log.warning("graceful stop not installed: fit() does not run on the main thread, where Python "
                              "lets signal handlers be set")

    def checkpoint_path(self, trainer: pl.Trainer) -> str:
        """Where the stop checkpoint goes: ``checkpoint_path``, or the ``ModelCheckpoint``'s last.ckpt.

        Raises:
            ConfigError: Neither is there; the message says what to configure.
        """
        assert self.config is not None
        if self.config.checkpoint_path is not None:
            return self.config.checkpoint_path
        path = last_checkpoint_path(trainer)
        if path is not None:
            return path
        raise ConfigError(
            f"{self._owner}(graceful_stop=...) needs a checkpoint to save at the stop: give "
            "graceful_stop={'checkpoint_path': ...}, or a ModelCheckpoint with a dirpath (the stop then "
            "saves <dirpath>/last.ckpt, which fit(ckpt_path='last') resumes from)"
        )

    def stop_now(self, trainer: pl.Trainer) -> NoReturn:
        """Every rank agreed to stop after this step: save the checkpoint (all ranks) and leave ``fit``.

        Raises:
            GracefulStopExit: Always, once the checkpoint is saved (the callbacks' ``on_exception``
                ends the run as cleanly as a normal end).
        """
        stop = self._session.graceful_stop
        assert stop is not None
        path = self.checkpoint_path(trainer)
        step = int(trainer.global_step)
        stop.counted_step = step  # the launcher's graceful_stop record names the global step, as the user counts
        self._log.rank_zero_info("graceful stop: %s; every rank stops after global step %s and saves %s",
                                 stop.describe_stop(), step, path)
        trainer.save_checkpoint(path)  # every rank: rank 0 writes, the others take part
        self._log.rank_zero_info("graceful stop: saved %s at global step %s; leaving fit (exit 0, no finished flag)",
                                 path, step)
        raise GracefulStopExit(step, stop.stop_signal.name if stop.stop_signal else "a stop signal", path)

    def run_ended(self, exception: Optional[BaseException]) -> None:
        """Remember the stop that ended the run, if one did (:attr:`stopped`)."""
        if is_graceful_stop(exception):
            self.stopped = exception  # type: ignore[assignment]


def last_checkpoint_path(trainer: pl.Trainer) -> Optional[str]:
    """``<dirpath>/last.ckpt`` of the trainer's ``ModelCheckpoint`` (what ``fit(ckpt_path='last')``
    resumes from); None without a ``ModelCheckpoint`` with a dirpath and a plain last name."""
    checkpoint = trainer.checkpoint_callback
    dirpath = getattr(checkpoint, "dirpath", None)
    last_name = getattr(checkpoint, "CHECKPOINT_NAME_LAST", None)
    if dirpath and isinstance(last_name, str) and "{" not in last_name:
        return os.path.join(dirpath, last_name + getattr(checkpoint, "FILE_EXTENSION", ".ckpt"))
    return None
