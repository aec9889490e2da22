"""One ``fit`` run of a fault tolerance callback, set up and torn down in order.

:meth:`FitSession.open` (the callback's ``setup``, ``fit`` stage only) opens the callback's
:class:`~ft_core.client.session.FrontEndSession`: it checks the Trainer's callbacks and the
launcher's environment, reads the finished flag's path, connects a
:class:`~ft_core.RankMonitorClient`, restores timeouts saved by an earlier run, checks that hang
detection can work, arms a simulated fault, hooks checkpoint saving and arms the graceful stop,
in the session's order, and arms the restore of a just-in-time state. :meth:`FitSession.finish`
(``teardown`` of a run that ended normally, or ``on_exception`` of one that did not) sends the
driver's last report, updates timeouts when that is safe, creates the finished flag when training
is complete, and closes the session (which undoes the set-up in reverse).

The parts it runs are the callback's, each with one concern: the driver (heartbeats or sections,
:mod:`ptl_resiliency._drivers`), the :class:`~ptl_resiliency._timeouts_updater.TimeoutsUpdater`,
the :class:`~ptl_resiliency._finished_flag.FinishedFlag` and the
:class:`~ptl_resiliency._graceful_stop.LightningGracefulStop` and the just-in-time state
(:class:`~ptl_resiliency._jit.LightningJit`: attached at ``on_train_start``, saved by
:meth:`FitSession.failed` before anything else, released with the session). The order of set-up and tear-down
is :mod:`ft_core.client.session`'s, the same as :mod:`ft_core.client.integration`'s.

Where collectives happen (through the strategy, :class:`~ptl_resiliency._collectives.StrategyCollectives`):
reading the state file (broadcast from rank 0), planning a simulated fault (broadcast), after
each ``trainer.save_checkpoint`` (sections) and at the end of a run that ended normally: agreeing
on what there is data for and the timeout calculation itself. All of these happen at points
every rank reaches together. :meth:`FitSession.failed` never runs a collective in a multi-rank
job: the other ranks may not be there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Optional, Union

# torch's error-file writer, which failed() uses: imported now, not while a failed rank ends
# (under the launcher's SIGTERM grace; a stack taken then showed the import, not the wait).
import torch.distributed.elastic.multiprocessing.errors  # noqa: F401

from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.run_errors import record_error_for_launcher
from ft_core.client.sections_policy import is_clean_exit, is_graceful_stop
from ft_core.client.session import FrontEndSession
from ft_core.client.setup_errors import stop_job_for_setup_error
from ft_core.client.state_file import PART_SECTIONS
from ft_core.wire.config import ConfigError
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import NotStartedByLauncherError
from ptl_resiliency._checkpoint_hooks import CheckpointHooks
from ptl_resiliency._collectives import StrategyCollectives
from ptl_resiliency._drivers import HeartbeatDriver, SectionsDriver
from ptl_resiliency._finished_flag import FinishedFlag
from ptl_resiliency._graceful_stop import LightningGracefulStop
from ptl_resiliency._jit import LightningJit
from ptl_resiliency._lightning import TrainerFn, pl
from ptl_resiliency._metrics import MetricsLogger
from ptl_resiliency._timeouts_updater import TimeoutsUpdater
from ptl_resiliency._training_state import state_file_for_trainer

Driver = Union[HeartbeatDriver, SectionsDriver]
OnFailure = Callable[[BaseException], None]


class FitSession:
    """The set-up and tear-down of one ``fit`` run around a callback's parts.

    Args:
        session: The callback's connection to its monitor (opened and closed here).
        driver: What the callback reports (heartbeats or sections).
        updater: Updates and saves calculated timeouts.
        flag: The auto-resume finished flag.
        stop: The graceful stop.
        log: The callback's logger.
        on_failure: Called with the exception of a failed ``fit`` run (not a clean exit or a
            graceful stop), before the tear-down; what it raises is logged, never raised.
        jit: The just-in-time state part (a new one if None).
    """

    def __init__(self, session: FrontEndSession, driver: Driver, updater: TimeoutsUpdater, flag: FinishedFlag,
                 stop: LightningGracefulStop, log: RankLoggerAdapter, on_failure: Optional[OnFailure] = None,
                 jit: Optional[LightningJit] = None) -> None:
        self._session = session
        self._driver = driver
        self._updater = updater
        self._flag = flag
        self._stop = stop
        self._log = log
        self._on_failure = on_failure
        self.jit = jit if jit is not None else LightningJit(log)
        self._calculate_timeouts = False  # this run's argument, read at open()
        self._ckpt_hooks: Optional[CheckpointHooks] = None
        self._metrics: Optional[MetricsLogger] = None

    # ------------------------------------------------------------------ set-up

    def open(self, trainer: pl.Trainer, callback: Any, family: type) -> None:
        """Connect to the rank monitor for a ``fit`` run of ``trainer``.

        Args:
            callback: The callback this session serves (its arguments ``autoresume``,
                ``calculate_timeouts``, ``simulated_fault_params``, ``exp_dir`` and
                ``graceful_stop`` are read now).
            family: The fault tolerance callbacks' base class: the Trainer may hold only one.

        Raises:
            RuntimeError: The session is open already (one instance in two concurrent fits).
            RankMonitorClientError: Not started by ``ft_launcher``, or the monitor cannot be
                reached.
            ConfigError: See the callbacks' ``setup``.
            ValueError: The simulated fault names a rank outside the world.
        """
        if self._session.is_open:
            raise RuntimeError(
                f"{type(callback).__name__} is already active; one instance cannot serve two "
                "concurrent Trainer.fit() runs"
            )
        with self._session.opening():  # whatever raises below leaves nothing connected or hooked
            self._start(trainer, callback, family)

    def _start(self, trainer: pl.Trainer, callback: Any, family: type) -> None:
        session = self._session
        session.begin(trainer.global_rank, StrategyCollectives(trainer.strategy))
        name = type(callback).__name__
        copies = sum(1 for other in trainer.callbacks if other is callback)
        if copies > 1:
            raise ConfigError(
                f"{name}: the same instance is in the Trainer's callbacks {copies} "
                "times; pass it once (Trainer(callbacks=[ft, ...]))"
            )
        others = [type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, family) and cb is not callback]
        if others:
            raise ConfigError(
                f"{name}: a Trainer takes one fault tolerance callback, but it also has "
                f"{', '.join(others)}. Each rank has a single connection to its monitor: use "
                "FaultToleranceCallback (heartbeats) or FaultToleranceSectionsCallback (sections)."
            )
        if not os.environ.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR):
            raise NotStartedByLauncherError(  # uncaught: its message alone, not Lightning's traceback
                f"{name}: {FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR} is not set, so this process was not "
                "started by ft_launcher and has no rank monitor. Start training with "
                "`ft_launcher [torchrun options] script.py`, or remove the callback."
            )
        self._flag.arm(callback.autoresume)
        calculate_timeouts = self._calculate_timeouts = callback.calculate_timeouts
        self._driver.start(trainer, calculate_timeouts)
        self._updater.reset()
        path = session.use_state_file(state_file_for_trainer(trainer, callback.exp_dir)).path  # collective
        # Without calculate_timeouts the configured timeouts are what the user asked for.
        client = session.connect(restore=calculate_timeouts)  # with restore: a collective
        session.check_config(self._driver.config_error)
        if callback.simulated_fault_params is not None:
            session.arm_fault(callback.simulated_fault_params)  # collective
        self._ckpt_hooks = CheckpointHooks(self._checkpoint_started, self._checkpoint_ended,
                                           self._driver.wraps_checkpoint_io)
        session.hold("checkpoint hooks", self._unhook)
        self._ckpt_hooks.install(trainer)
        self._metrics = MetricsLogger(trainer, self._log, sections=self._driver.part == PART_SECTIONS)
        session.hold("just-in-time state", self.jit.close)
        self.jit.open(trainer, session.collectives)  # before Lightning restores a checkpoint
        self._driver.started(client)
        self._stop.arm(callback.graceful_stop)
        session.started(
            "%s set up: timeouts file %s (calculate_timeouts=%s, autoresume=%s, graceful stop %s)",
            name, path, calculate_timeouts, callback.autoresume, self._stop.describe(),
        )

    def _unhook(self) -> None:
        """Undo what ``_start`` hooked into the Trainer (checkpoint saving, its logger)."""
        hooks, self._ckpt_hooks, self._metrics = self._ckpt_hooks, None, None
        if hooks is not None:
            hooks.uninstall()

    # ------------------------------------------------------------------ while running

    def train_started(self, trainer: pl.Trainer) -> None:
        """Training starts (state restored): track the state for just-in-time saves; never raises."""
        if self._session.client is None:
            return
        try:
            self.jit.train_started(trainer)
        except Exception:  # a feature that helps after failures must not cause one
            self._log.exception("fault tolerance: just-in-time state is off for this run")
        # where this run resumed from, for ft_report's steps redone (once per fit; fail-open)
        source = (self.jit.restored_source if self.jit.restored is not None
                  else "checkpoint" if trainer.ckpt_path else "scratch")
        with contextlib.suppress(Exception):
            self._session.client.report_resumed(int(trainer.global_step), source)

    def log_metrics(self, save: bool = False) -> None:
        """Log what changed of the cycle and the timeouts in force; never raises."""
        client, metrics = self._session.client, self._metrics
        if client is not None and metrics is not None:
            metrics.log(client, save=save)

    def _checkpoint_started(self, kind: str) -> None:
        client = self._session.client
        if client is None:
            return
        try:
            self._driver.checkpoint_started(client, kind)
        except Exception:  # bookkeeping must never fail the user's checkpoint
            self._log.exception("fault tolerance: checkpoint start not recorded")

    def _checkpoint_ended(self, kind: str, ok: bool) -> None:
        client = self._session.client
        if client is None:
            return
        try:
            if self._driver.checkpoint_ended(client, kind, ok) and self._updater.update(client, final=False):
                self.log_metrics()
        except Exception:  # never fail a checkpoint, or hide the exception of a failed one
            self._log.exception("fault tolerance: after-checkpoint update failed")

    # ------------------------------------------------------------------ end of run

    def failed(self, trainer: pl.Trainer, exception: BaseException) -> None:
        """The run ended with ``exception``: report a failure, then clean up; never raises.

        Lightning calls this for errors in any stage, including in ``setup`` before the session
        opened (then there is nothing to clean up), so the user always sees the original exception.
        """
        clean = is_clean_exit(exception)
        stopped = is_graceful_stop(exception)
        if not clean and not stopped and trainer.state.fn == TrainerFn.FITTING:
            # First: the launcher waits for this save (bounded) before it stops the survivors.
            try:
                self.jit.save_on_failure()
            except Exception:  # never hide the user's exception
                self._log.exception("fault tolerance: the just-in-time state save failed")
            # The launcher's failure line shows the exception; a setup error that every restart
            # would hit again stops the job instead of burning the allocation.
            record_error_for_launcher(exception, self._log)
            stop_job_for_setup_error(exception, self._log)
            if self._on_failure is not None:
                try:
                    self._on_failure(exception)
                except Exception:  # the user's policy may raise anything; their exception comes first
                    self._log.exception("fault tolerance: handling %r failed", exception)
        if self._session.client is None:
            return
        try:
            # A graceful stop ends a healthy run on every rank at the same step: as clean as a normal end.
            self.finish(trainer, "clean SystemExit(0)" if clean else None, clean=clean or stopped, exception=exception)
        except Exception:  # our bookkeeping must never replace the user's exception
            self._log.exception("fault tolerance: cleanup after %r failed", exception)

    def finish(self, trainer: pl.Trainer, completed: Optional[str], clean: bool,
               exception: Optional[BaseException] = None) -> None:
        """Final report, timeouts, flag, disconnect.

        Args:
            completed: Why training counts as complete, or None (no finished flag).
            clean: The run ended normally, by a clean exit or a graceful stop.
            exception: What ended the run, if anything did.

        Raises:
            OSError: The finished flag of a completed run (``exception`` None) could not be created.
        """
        client = self._session.client
        assert client is not None
        flag_error: Optional[OSError] = None
        try:
            self._session.cancel_fault()
            self._driver.run_ended(client, clean)
            if self._calculate_timeouts and self._updater.final_update(client, exception):
                self.log_metrics(save=True)
            # a run that trained nothing (resumed at its end) never got to on_train_start
            self.log_metrics(save=True)
            self._stop.run_ended(exception)
            flag_error = self._flag.settle(trainer, completed, exception)
        finally:
            self._session.close(clean_end=clean)
        if flag_error is not None and exception is None:
            raise flag_error
