"""``FaultToleranceSectionsCallback``: hang detection for Lightning training with sections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, Union

from ft_core.client import RankMonitorClient
from ft_core.config import ConfigError
from ft_core.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
from ft_core.simulated_fault import SimulatedFaultParams
from ft_core.workload_control import WorkloadControlRequest
from ptl_resiliency._base import PathLike, _FaultToleranceCallbackBase
from ptl_resiliency._lightning import pl
from ptl_resiliency._training_state import all_ranks_agree

SECTION_SETUP = "setup"
SECTION_STEP = "step"
SECTION_CHECKPOINTING = "checkpointing"
SECTIONS = (SECTION_SETUP, SECTION_STEP, SECTION_CHECKPOINTING)

MIN_ITERS_FOR_STEP_TIMEOUT = 16
"""Training iterations a run must have done before it calculates the ``step`` timeout."""

ExcHandlingPolicy = Callable[[BaseException], Optional[WorkloadControlRequest]]


class FaultToleranceSectionsCallback(_FaultToleranceCallbackBase):
    """Wraps the phases of training in sections, each with its own timeout.

    Sections (all must be configured in ``rank_section_timeouts``; a ``null`` timeout is
    infinite until calculated):

    * ``setup``: from this callback's ``setup`` to the first training or validation batch
      (model setup, checkpoint loading, strategy setup, dataloaders).
    * ``step``: each training batch (``training_step``, backward, optimizer step) and each
      validation batch (``validation_step``).
    * ``checkpointing``: ``trainer.save_checkpoint`` on every rank, and the checkpoint IO's
      save, remove and asynchronous finalisation where the IO has one.

    Everything else (data loading between steps, epoch ends, logging) is out of section and
    bounded by ``rank_out_of_section_timeout``.

    Timeouts: with ``calculate_timeouts=True`` they are calculated from the longest durations
    seen on any rank, times the config's ``safety_factor``: after every checkpoint save once at
    least 16 training iterations ran (``step``, ``checkpointing``), and at the end of the run;
    ``setup`` and out-of-section only in a run that loaded a checkpoint. Rank 0 writes them to
    ``<exp_dir>/_ft_state.json`` and the next run starts with them.

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
        exp_dir: Directory of the timeouts file; default ``<trainer.log_dir>/ft_state``.
        logger_name: Name of the logger this callback logs to.
        exc_handling_policy: Maps the exception that ended the run to a workload control
            request, or to None for no request.

    Raises:
        ValueError: An argument has an invalid value (named in the message).
    """

    _WRAP_CHECKPOINT_IO = True

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]] = None,
        exp_dir: Optional[PathLike] = None,
        logger_name: str = "ptl_resiliency.FaultToleranceSectionsCallback",
        exc_handling_policy: Optional[ExcHandlingPolicy] = None,
    ) -> None:
        super().__init__(autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name)
        if exc_handling_policy is not None and not callable(exc_handling_policy):
            raise ValueError(
                "FaultToleranceSectionsCallback: exc_handling_policy must be a callable "
                f"(exception -> WorkloadControlRequest or None), got {exc_handling_policy!r}"
            )
        self.exc_handling_policy = exc_handling_policy
        self._reset_section_state()

    def _reset_section_state(self) -> None:
        self._setup_open = False
        self._setup_ended_by_batch = False
        self._step_open = False

    # ------------------------------------------------------------------ configuration

    def _check_timeouts(self, client: RankMonitorClient) -> None:
        # Finite heartbeat timeouts are fine: the monitor counts opening or closing a section as
        # progress, so they only bound the time between section changes (a coarse backstop).
        configured = client.section_timeouts.section
        missing = [name for name in SECTIONS if name not in configured]
        if missing:
            raise ConfigError(
                "FaultToleranceSectionsCallback: rank_section_timeouts must configure the "
                f"sections {', '.join(SECTIONS)}; missing: {', '.join(missing)} (configured: "
                f"{dict(configured)!r}). E.g. ft_launcher --ft-param-rank_section_timeouts="
                "setup:600,step:180,checkpointing:420 --ft-param-rank_out_of_section_timeout=300 "
                "(null means: calculate)"
            )
        if not client.section_timeouts.are_valid and not self.calculate_timeouts:
            raise ConfigError(
                "FaultToleranceSectionsCallback: section hang detection is incomplete because a "
                f"timeout is infinite (rank_section_timeouts={dict(configured)!r}, "
                f"rank_out_of_section_timeout={client.section_timeouts.out_of_section!r}) and "
                "calculate_timeouts=False. Give every section and the out-of-section time a "
                "timeout, or pass calculate_timeouts=True."
            )

    def _on_started(self, client: RankMonitorClient) -> None:
        self._reset_section_state()
        client.start_section(SECTION_SETUP)
        self._setup_open = True

    # ------------------------------------------------------------------ steps

    def _end_setup(self, client: RankMonitorClient) -> None:
        client.end_section(SECTION_SETUP)
        self._setup_open = False
        self._setup_ended_by_batch = True

    def _open_step(self, client: RankMonitorClient) -> None:
        if self._setup_open:
            self._end_setup(client)
        if not self._step_open:
            client.start_section(SECTION_STEP)
            self._step_open = True

    def _close_step(self, client: RankMonitorClient) -> None:
        if self._step_open:
            client.end_section(SECTION_STEP)
            self._step_open = False

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Open ``step`` (closing ``setup`` at the first batch)."""
        client = self._client
        if client is not None:
            self._open_step(client)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close ``step``."""
        client = self._client
        if client is not None:
            self._train_iters += 1
            self._close_step(client)

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Open ``step`` for a validation batch (closing ``setup`` at the first batch)."""
        client = self._client
        if client is not None:
            self._open_step(client)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Close ``step``."""
        client = self._client
        if client is not None:
            self._close_step(client)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close a ``step`` left open by a batch that ended the epoch early (hook returned -1)."""
        client = self._client
        if client is not None:
            self._close_step(client)

    # ------------------------------------------------------------------ checkpointing

    def _on_checkpointing_start(self, client: RankMonitorClient) -> None:
        client.start_section(SECTION_CHECKPOINTING)

    def _on_checkpointing_end(self, client: RankMonitorClient) -> None:
        client.end_section(SECTION_CHECKPOINTING)

    def _after_checkpoint_save(self, trainer: pl.Trainer, client: RankMonitorClient) -> None:
        if self.calculate_timeouts:
            self._maybe_update_and_save_timeouts(trainer, client, final=False)

    # ------------------------------------------------------------------ end of run

    def _final_progress(self, client: RankMonitorClient, clean: bool) -> None:
        if clean:
            client.end_all_sections()
        self._setup_open = self._step_open = False

    def _on_failure(self, trainer: pl.Trainer, exception: BaseException) -> None:
        policy = self.exc_handling_policy
        if policy is None:
            return
        request = policy(exception)
        if request is None:
            return
        if not isinstance(request, WorkloadControlRequest):
            self._log.error(
                "[rank %s] exc_handling_policy returned %r, not a WorkloadControlRequest or "
                "None; nothing sent", self._rank, request,
            )
            return
        client = self._client or RankMonitorClient()
        try:
            client.send_workload_control_request(request)
        except Exception as err:
            launcher_socket = FT_LAUNCHER_IPC_SOCKET_ENV_VAR
            self._log.error(
                "[rank %s] could not send %s (%s) to ft_launcher for %r: %s (is %s set?)",
                self._rank, request.action.name, request.description, exception, err, launcher_socket,
            )
            return
        self._log.warning(
            "[rank %s] run failed with %r; asked ft_launcher to %s (%s)",
            self._rank, exception, request.action.name, request.description,
        )

    def _update_timeouts(self, trainer: pl.Trainer, client: RankMonitorClient, final: bool) -> bool:
        enough_iters, saved, loaded, setup_known = all_ranks_agree([  # collective
            self._train_iters >= MIN_ITERS_FOR_STEP_TIMEOUT,
            self._ckpt_saves > 0,
            self._ckpt_loaded,
            self._ckpt_loaded and self._setup_ended_by_batch,
        ])
        if not final and not enough_iters:
            self._log.debug(
                "[rank %s] section timeouts not updated after this checkpoint: %s of %s training "
                "iterations so far", self._rank, self._train_iters, MIN_ITERS_FOR_STEP_TIMEOUT,
            )
            return False
        selected = []
        if enough_iters:
            selected.append(SECTION_STEP)
        if saved:
            selected.append(SECTION_CHECKPOINTING)
        if setup_known:
            selected.append(SECTION_SETUP)
        if not selected:
            self._log.info(
                "[rank %s] section timeouts not updated: too little data (%s training iterations, "
                "need %s; checkpoint saved=%s; checkpoint loaded=%s)", self._rank,
                self._train_iters, MIN_ITERS_FOR_STEP_TIMEOUT, saved, self._ckpt_loaded,
            )
            return False
        # Out-of-section time, like setup, only from a run that resumed from a checkpoint: only
        # then does it include what a restarted run spends outside sections (as in seed 004).
        updated = client.calculate_and_set_section_timeouts(  # collective
            selected_sections=selected, calc_out_of_section=enough_iters and loaded,
            skip_if_not_ready=True,
        )
        if not updated:
            self._log.info("[rank %s] section timeouts not updated: %s not observed on every rank",
                           self._rank, ", ".join(selected))
        return updated
