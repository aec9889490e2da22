"""What both fault tolerance callbacks share: their arguments, the parts they assemble, and the
Lightning hooks of a ``fit`` run's life cycle.

Each part has one concern: the :class:`~ft_core.client.session.FrontEndSession` (the connection),
the driver (heartbeats or sections, :mod:`ptl_resiliency._drivers`), the
:class:`~ptl_resiliency._timeouts_updater.TimeoutsUpdater`, the
:class:`~ptl_resiliency._finished_flag.FinishedFlag`, the
:class:`~ptl_resiliency._graceful_stop.LightningGracefulStop`, and the
:class:`~ptl_resiliency._session.FitSession` that sets them up and tears them down in order. The
hooks stay on the callbacks (Lightning calls them there) and delegate; the two callbacks add the
per-batch hooks their driver needs.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

from ft_core.client.front_end import require_bool, require_path
from ft_core.client.graceful_stop import GracefulStopConfig, GracefulStopExit
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.session import FrontEndSession, session_attribute
from ft_core.client.simulated_fault import SimulatedFaultParams
from ft_core.wire.config import ConfigError
from ptl_resiliency._drivers import HeartbeatDriver, SectionsDriver
from ptl_resiliency._finished_flag import FinishedFlag
from ptl_resiliency._graceful_stop import LightningGracefulStop
from ptl_resiliency._lightning import Callback, TrainerFn, pl
from ptl_resiliency._session import FitSession, OnFailure
from ptl_resiliency._timeouts_updater import TimeoutsUpdater
from ptl_resiliency._training_state import completion_reason

PathLike = Union[str, "os.PathLike[str]"]
GracefulStopOption = Union[None, bool, GracefulStopConfig, dict[str, Any]]

SKIPPED_HOOKS = (
    "on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad", "on_validation_batch_start", "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end",
)
"""Per-batch Lightning hooks that are None on the base class (a callback defines the ones it uses).

Lightning calls a callback's hook only when the attribute is callable (``trainer/call.py``), and
each call costs a profiler context (a few us): most of what a callback costs per step is this
dispatch. ``tests/unit/test_lightning_hook_skipping.py`` pins that Lightning behaviour on the
installed Lightning (``make check-lightning-versions``: on every supported minor)."""


class _FaultToleranceCallbackBase(Callback):
    """Shared implementation; see :class:`~ptl_resiliency.FaultToleranceCallback`."""

    on_train_batch_start = None  # type: ignore[assignment]
    on_before_backward = None  # type: ignore[assignment]
    on_after_backward = None  # type: ignore[assignment]
    on_before_optimizer_step = None  # type: ignore[assignment]
    on_before_zero_grad = None  # type: ignore[assignment]
    on_validation_batch_start = None  # type: ignore[assignment]
    on_test_batch_start = None  # type: ignore[assignment]
    on_test_batch_end = None  # type: ignore[assignment]
    on_predict_batch_start = None  # type: ignore[assignment]
    on_predict_batch_end = None  # type: ignore[assignment]

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]],
        exp_dir: Optional[PathLike],
        logger_name: str,
        graceful_stop: GracefulStopOption,
        driver: type[Union[HeartbeatDriver, SectionsDriver]],
        on_failure: Optional[OnFailure] = None,
    ) -> None:
        # The public classes declare the arguments with their defaults; this checks them all.
        super().__init__()
        owner = type(self).__name__
        try:
            self.graceful_stop: Optional[GracefulStopConfig] = GracefulStopConfig.from_value(graceful_stop)
        except ConfigError as err:
            raise ValueError(f"{owner}: {err}") from None
        require_bool(owner, "autoresume", autoresume)
        require_bool(owner, "calculate_timeouts", calculate_timeouts)
        if simulated_fault_params is not None:
            try:
                simulated_fault_params = SimulatedFaultParams.from_value(simulated_fault_params)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{owner}: simulated_fault_params: {err}") from None
        require_path(owner, "exp_dir", exp_dir, allow_none=True)
        if not isinstance(logger_name, str) or not logger_name:
            raise ValueError(f"{owner}: logger_name must be a non-empty string, got {logger_name!r}")
        self.autoresume = autoresume
        self.calculate_timeouts = calculate_timeouts
        self.simulated_fault_params: Optional[SimulatedFaultParams] = simulated_fault_params
        self.exp_dir: Optional[str] = None if exp_dir is None else os.fspath(exp_dir)
        self.logger_name = logger_name
        # The parts, one concern each (module docstring); the per-batch hooks use the first two.
        self._log = log = RankLoggerAdapter(logging.getLogger(logger_name))
        self._session = session = FrontEndSession(log, driver.part)
        self._driver = driver(session, log)
        self._stop = LightningGracefulStop(owner, session, log)
        self._run = FitSession(session, self._driver, TimeoutsUpdater(session, self._driver.calculate, log),
                               FinishedFlag(owner, log), self._stop, log, on_failure)
        self._jit = self._run.jit

    # ------------------------------------------------------------------ public state

    @property
    def is_active(self) -> bool:
        """True while connected to the rank monitor (from ``setup`` to the end of the run)."""
        return self._session.client is not None

    client = session_attribute("client", "The rank monitor client while connected (for inspection; do not shut it "
                               "down), else None.")
    state_file_path = session_attribute("state_file_path", "Where calculated timeouts are loaded from and saved "
                                        "to (known once set up), else None.")

    @property
    def stopped_gracefully(self) -> Optional[GracefulStopExit]:
        """After a ``fit`` that ended with a graceful stop: what stopped it (step, signal,
        checkpoint); else None."""
        return self._stop.stopped

    # ------------------------------------------------------------------ Lightning hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Connect to the rank monitor (``fit`` only).

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher``, or the monitor cannot be
                reached.
            ConfigError: ``autoresume=True`` without ``FAULT_TOL_FINISHED_FLAG_FILE``, sections
                missing from the config or configured but never opened (sections callback), or
                no valid timeouts while ``calculate_timeouts=False``.
            ValueError: The simulated fault names a rank outside the world.
        """
        if stage == TrainerFn.FITTING:
            self._run.open(trainer, self, _FaultToleranceCallbackBase)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The ``fit`` run ended normally: update timeouts, maybe create the flag, disconnect.

        Raises:
            OSError: The finished flag file could not be created (the auto-resume loop would
                otherwise run again after a completed training).
        """
        if stage != TrainerFn.FITTING or self._session.client is None:
            return
        self._run.finish(trainer, completion_reason(trainer), clean=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """The run ended with ``exception``; clean up without ever raising.

        Lightning calls this for errors in any stage, including in ``setup`` before this
        callback connected (then there is nothing to clean up), so the user always sees the
        original exception.
        """
        self._run.failed(trainer, exception)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Remember that this run resumed from a checkpoint (its intervals include the load)."""
        if self._session.client is not None:
            self._driver.checkpoint_loaded()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the cycle and the timeouts in force to the Trainer's logger (step restored by now);
        install the graceful stop's signal handlers (Lightning installed its own just before); track
        the state for just-in-time saves."""
        self._run.log_metrics()
        self._stop.install(trainer)
        self._run.train_started(trainer)
