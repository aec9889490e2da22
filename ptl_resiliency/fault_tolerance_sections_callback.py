"""``FaultToleranceSectionsCallback``: hang detection for Lightning training with sections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, Union

from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.sections_policy import (
    MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE,
    SECTION_CHECKPOINTING,
    SECTION_SETUP,
    SECTION_STEP,
    SECTIONS,
)
from ft_core.client.simulated_fault import SimulatedFaultParams
from ft_core.wire.data import WorkloadControlRequest
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import RankMonitorClientError
from ptl_resiliency._base import GracefulStopOption, PathLike, _FaultToleranceCallbackBase
from ptl_resiliency._drivers import SectionsDriver
from ptl_resiliency._lightning import pl

__all__ = [
    "MIN_ITERS_FOR_STEP_TIMEOUT", "SECTIONS", "SECTION_CHECKPOINTING", "SECTION_SETUP", "SECTION_STEP",
    "ExcHandlingPolicy", "FaultToleranceSectionsCallback",
]

MIN_ITERS_FOR_STEP_TIMEOUT = MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE
"""Training iterations a run must have done before it calculates the ``step`` timeout."""

ExcHandlingPolicy = Callable[[BaseException], Optional[WorkloadControlRequest]]


class FaultToleranceSectionsCallback(_FaultToleranceCallbackBase):
    """Wraps the phases of training in sections, each with its own timeout.

    Sections (all must be configured in ``rank_section_timeouts``, and no other: a section this
    callback never opens, e.g. a typo, is refused with a ``ConfigError``, a ``ValueError``; a
    ``null`` timeout is infinite until calculated):

    * ``setup``: from this callback's ``setup`` to the first training or validation batch
      (model setup, checkpoint loading, strategy setup, dataloaders).
    * ``step``: each training batch (``training_step``, backward, optimizer step) and each
      validation batch (``validation_step``), except the first training batch of the run and
      the first batch of each validation run (warm-up: first batches are often much slower and
      would force a long ``step`` timeout; they count as out-of-section time).
    * ``checkpointing``: ``trainer.save_checkpoint`` on every rank, and the checkpoint IO's
      save, remove and asynchronous finalisation where the IO has one.

    Everything else (data loading between steps, epoch ends, logging, warm-up batches) is out of
    section and bounded by ``rank_out_of_section_timeout``.

    Timeouts: with ``calculate_timeouts=True`` they are calculated from the longest durations
    seen on any rank, times the config's ``safety_factor``, after every checkpoint save and at
    the end of the run, each once the run has the data for it: ``step`` after 16 training
    iterations, ``checkpointing`` once a save was seen (never with an asynchronous checkpoint
    IO, whose section durations vary too much between runs), ``setup`` and out-of-section only
    in a run that loaded a checkpoint. The rules are :mod:`ft_core.client.sections_policy`'s, the same
    as :mod:`ft_core.client.integration`'s. Rank 0 writes them to ``<exp_dir>/_ft_state.json`` and the
    next run starts with them.

    Failures: ``exc_handling_policy(exception)`` may return a
    :class:`~ft_core.WorkloadControlRequest` that is sent to ``ft_launcher`` when the run fails,
    e.g. ``WorkloadAction.ShutdownWorkload`` to stop restarting after an unrecoverable error.
    It is called for every exception except a clean ``SystemExit(0)``, also for one raised
    before this callback connected.

    Auto-resume and the other arguments: as :class:`~ptl_resiliency.FaultToleranceCallback`.

    Args:
        autoresume: Create the finished flag file when training completes.
        calculate_timeouts: Calculate timeouts from observed durations and persist them.
        simulated_fault_params: A fault to simulate (see ``SimulatedFaultParams``).
        exp_dir: Directory of the timeouts file; default ``<trainer.default_root_dir>/ft_state``
            (the same for every run started the same way), keyed to the run under auto-resume
            (``$AUTORESUME_RUN_DIR/ft_state``) or SLURM (``.../ft_state/slurm-<job id>``).
        logger_name: Name of the logger this callback logs to.
        exc_handling_policy: Maps the exception that ended the run to a workload control
            request, or to None for no request (not called for a graceful stop).
        graceful_stop: A coordinated stop on signals: as :class:`~ptl_resiliency.FaultToleranceCallback`.

    Raises:
        ValueError: An argument has an invalid value (named in the message).
    """

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]] = None,
        exp_dir: Optional[PathLike] = None,
        logger_name: str = "ptl_resiliency.FaultToleranceSectionsCallback",
        exc_handling_policy: Optional[ExcHandlingPolicy] = None,
        graceful_stop: GracefulStopOption = None,
    ) -> None:
        super().__init__(autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name, graceful_stop,
                         SectionsDriver, on_failure=self._send_exc_handling_request)
        if exc_handling_policy is not None and not callable(exc_handling_policy):
            raise ValueError(
                "FaultToleranceSectionsCallback: exc_handling_policy must be a callable "
                f"(exception -> WorkloadControlRequest or None), got {exc_handling_policy!r}"
            )
        self.exc_handling_policy = exc_handling_policy
        self._sections: SectionsDriver = self._driver

    # ------------------------------------------------------------------ steps (SectionsDriver)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Close ``setup`` at the first batch; open ``step`` after the warm-up batch."""
        self._sections.train_batch_started(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close ``step``; the graceful stop's check (a collective at the agreed check steps)."""
        self._jit.batch_ended()  # first: the step is counted, a copy of the state is consistent again
        if self._sections.train_batch_ended(trainer):
            self._stop.stop_now(trainer)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        """Close ``setup`` at the first batch; open ``step`` after the run's warm-up batch."""
        self._sections.validation_batch_started()

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Close ``step``."""
        self._sections.validation_batch_ended()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close a ``step`` left open by a batch that ended the epoch early (hook returned -1)."""
        self._sections.train_epoch_ended()

    # ------------------------------------------------------------------ failures

    def _send_exc_handling_request(self, exception: BaseException) -> None:
        """The run failed with ``exception``: send what ``exc_handling_policy`` asks for, if anything."""
        policy = self.exc_handling_policy
        if policy is None:
            return
        request = policy(exception)
        if request is None:
            return
        if not isinstance(request, WorkloadControlRequest):
            self._log.error("exc_handling_policy returned %r, not a WorkloadControlRequest or None; nothing sent",
                            request)
            return
        client = self._session.client or RankMonitorClient()
        try:
            client.send_workload_control_request(request)
        except RankMonitorClientError as err:
            self._log.error("could not send %s (%s) to ft_launcher for %r: %s (is %s set?)",
                            request.action.name, request.description, exception, err,
                            FT_LAUNCHER_IPC_SOCKET_ENV_VAR)
            return
        self._log.warning("run failed with %r; asked ft_launcher to %s (%s)",
                          exception, request.action.name, request.description)
