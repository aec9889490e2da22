"""``FaultToleranceSectionsCallback``: hang detection for Lightning training with sections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, Union

from ft_core.client.policy_actions import apply_change, training_step_ended, update_section_timeouts
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.sections_policy import (
    MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE,
    SECTION_CHECKPOINTING,
    SECTION_SETUP,
    SECTION_STEP,
    SECTIONS,
    SectionsPolicy,
    sections_config_error,
)
from ft_core.client.simulated_fault import SimulatedFaultParams
from ft_core.client.state_file import PART_SECTIONS
from ft_core.wire.config import ConfigError
from ft_core.wire.data import WorkloadControlRequest
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import RankMonitorClientError
from ptl_resiliency._base import GracefulStopOption, PathLike, _FaultToleranceCallbackBase
from ptl_resiliency._checkpoint_hooks import KIND_FINALIZE, KIND_SAVE, uses_async_checkpointing
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

    _WRAP_CHECKPOINT_IO = True
    _STATE_PART = PART_SECTIONS

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
        super().__init__(autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name, graceful_stop)
        if exc_handling_policy is not None and not callable(exc_handling_policy):
            raise ValueError(
                "FaultToleranceSectionsCallback: exc_handling_policy must be a callable "
                f"(exception -> WorkloadControlRequest or None), got {exc_handling_policy!r}"
            )
        self.exc_handling_policy = exc_handling_policy

    # ------------------------------------------------------------------ policy

    def _new_policy(self, trainer: pl.Trainer) -> SectionsPolicy:
        return SectionsPolicy(
            self.calculate_timeouts,
            async_checkpointing=uses_async_checkpointing(trainer.strategy.checkpoint_io),
        )

    def _config_error(self, client: RankMonitorClient) -> Optional[ConfigError]:
        timeouts = client.section_timeouts
        return sections_config_error("FaultToleranceSectionsCallback", timeouts.section,
                                     timeouts.out_of_section, self.calculate_timeouts,
                                     initial_heartbeat=client.hb_timeouts.initial, opens_only_these=True)

    def _on_started(self, client: RankMonitorClient) -> None:
        policy: SectionsPolicy = self._policy
        apply_change(client, policy.setup_started())
        if policy.async_checkpointing:
            self._log.info("asynchronous checkpoint IO: the checkpointing timeout is not calculated")

    # ------------------------------------------------------------------ steps

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Close ``setup`` at the first batch; open ``step`` after the warm-up batch."""
        session = self._session
        client = session.client
        if client is not None:
            set_step = session.set_step
            if set_step is not None:
                set_step(trainer.global_step)
            apply_change(client, self._policy.training_step_started())

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close ``step``; the graceful stop's check (a collective at the agreed check steps)."""
        session = self._session
        client = session.client
        if client is not None and training_step_ended(client, self._policy, session.graceful_stop,
                                                      session.collectives):
            self._graceful_stop_now(trainer)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        """Close ``setup`` at the first batch; open ``step`` after the run's warm-up batch."""
        client = self._session.client
        if client is not None:
            apply_change(client, self._policy.eval_step_started())

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Close ``step``."""
        client = self._session.client
        if client is not None:
            end = self._policy.eval_step_ended()
            if end is not None:
                client.end_section(end)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close a ``step`` left open by a batch that ended the epoch early (hook returned -1)."""
        client = self._session.client
        if client is not None:
            end = self._policy.step_abandoned()
            if end is not None:
                client.end_section(end)

    # ------------------------------------------------------------------ checkpointing

    def _checkpoint_started(self, client: RankMonitorClient, kind: str) -> None:
        apply_change(client, self._policy.checkpointing_started())

    def _checkpoint_ended(self, client: RankMonitorClient, kind: str, ok: bool) -> None:
        # Only trainer.save_checkpoint runs on every rank: the IO's own work may be rank 0's alone.
        end = self._policy.checkpointing_ended(is_async_finalization=kind == KIND_FINALIZE,
                                               completes_save=kind == KIND_SAVE and ok)
        apply_change(client, end.change)
        if end.update_timeouts:
            self._maybe_update_and_save_timeouts(client, final=False)

    # ------------------------------------------------------------------ end of run

    def _final_progress(self, client: RankMonitorClient, clean: bool) -> None:
        for name in self._policy.run_ended():
            client.end_section(name)

    def _on_failure(self, trainer: pl.Trainer, exception: BaseException) -> None:
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

    def _update_timeouts(self, client: RankMonitorClient, final: bool) -> bool:
        return update_section_timeouts(self._policy, client, self._session.collectives, self._log, final)  # collective
