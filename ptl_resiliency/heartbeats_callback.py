"""``FaultToleranceCallback``: hang detection for Lightning training with heartbeats."""

from __future__ import annotations

from typing import Any, Optional, Union

from ft_core.client import RankMonitorClient
from ft_core.config import ConfigError
from ft_core.simulated_fault import SimulatedFaultParams
from ptl_resiliency._base import PathLike, _FaultToleranceCallbackBase
from ptl_resiliency._lightning import pl
from ptl_resiliency._training_state import all_ranks_agree

MIN_ITERS_FOR_HB_TIMEOUTS = 2
"""Training iterations a run must have done before it calculates heartbeat timeouts: with fewer,
the intervals say nothing about a step."""


class FaultToleranceCallback(_FaultToleranceCallbackBase):
    """Sends heartbeats to this rank's monitor so that a hung rank is detected and restarted.

    Active in the ``fit`` stage. ``setup`` connects to the rank monitor that ``ft_launcher``
    started for this rank. Heartbeats are sent at train start, after every training batch, at
    validation start, after every validation batch, at validation end, after every checkpoint
    save and at train end. The monitor stops the rank when the time from ``setup`` to the first
    heartbeat exceeds ``initial_rank_heartbeat_timeout``, or the time between two heartbeats
    exceeds ``rank_heartbeat_timeout``. ``teardown`` (or ``on_exception``) sends a last heartbeat,
    updates timeouts if asked to, creates the finished flag if training completed, and
    disconnects.

    Timeouts: with ``calculate_timeouts=True``, a run that both loaded a checkpoint and saved one
    (so that the observed intervals include both) calculates the heartbeat timeouts at its end
    from the longest intervals seen on any rank, times the config's ``safety_factor``; rank 0
    writes them to ``<exp_dir>/_ft_state.json`` and the next run starts with them. With too
    little data the update is skipped with a log line.

    Auto-resume: with ``autoresume=True``, rank 0 creates the file named by
    ``FAULT_TOL_FINISHED_FLAG_FILE`` when training completed (``max_steps``/``max_epochs``
    reached, ``max_time`` ran out, ``EarlyStopping`` stopped it, or a clean ``SystemExit(0)``),
    never after a failure or interruption. See ``docs/lightning.md``.

    Args:
        autoresume: Create the finished flag file when training completes.
        calculate_timeouts: Calculate timeouts from observed intervals and persist them.
        simulated_fault_params: A :class:`~ft_core.simulated_fault.SimulatedFaultParams` or an
            equivalent dict, to kill or hang one rank on purpose (for testing restarts).
        exp_dir: Directory of the timeouts file; default ``<trainer.log_dir>/ft_state``.
        logger_name: Name of the logger this callback logs to.

    Raises:
        ValueError: An argument has an invalid value (named in the message).
    """

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]] = None,
        exp_dir: Optional[PathLike] = None,
        logger_name: str = "ptl_resiliency.FaultToleranceCallback",
    ) -> None:
        super().__init__(autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name)

    # ------------------------------------------------------------------ configuration

    def _check_timeouts(self, client: RankMonitorClient) -> None:
        out_of_section = client.section_timeouts.out_of_section
        if out_of_section is not None:
            raise ConfigError(
                f"FaultToleranceCallback: rank_out_of_section_timeout={out_of_section!r} is set, but "
                "this callback opens no sections, so the monitor would stop this rank after "
                f"{out_of_section:g} s. Pass --ft-param-rank_out_of_section_timeout=null, or use "
                "FaultToleranceSectionsCallback."
            )
        timeouts = client.hb_timeouts
        if not timeouts.are_valid and not self.calculate_timeouts:
            raise ConfigError(
                "FaultToleranceCallback: heartbeat hang detection is off because a heartbeat "
                f"timeout is infinite (initial_rank_heartbeat_timeout={timeouts.initial!r}, "
                f"rank_heartbeat_timeout={timeouts.subsequent!r}) and calculate_timeouts=False. "
                "Set both timeouts, e.g. ft_launcher --ft-param-initial_rank_heartbeat_timeout=600 "
                "--ft-param-rank_heartbeat_timeout=300, or pass calculate_timeouts=True."
            )

    # ------------------------------------------------------------------ heartbeats

    def _heartbeat(self) -> None:
        client = self._client
        if client is not None:
            client.send_heartbeat()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat: setup and checkpoint loading are done."""
        self._heartbeat()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Heartbeat after every training batch."""
        client = self._client
        if client is not None:
            client.send_heartbeat()
            self._train_iters += 1

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat before validation (its first batch may take a while to load)."""
        self._heartbeat()

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Heartbeat after every validation batch."""
        client = self._client
        if client is not None:
            client.send_heartbeat()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat after validation."""
        self._heartbeat()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat at the end of training."""
        self._heartbeat()

    def _after_checkpoint_save(self, trainer: pl.Trainer, client: RankMonitorClient) -> None:
        client.send_heartbeat()

    def _final_progress(self, client: RankMonitorClient, clean: bool) -> None:
        client.send_heartbeat()

    # ------------------------------------------------------------------ timeouts

    def _update_timeouts(self, trainer: pl.Trainer, client: RankMonitorClient, final: bool) -> bool:
        loaded, saved, enough_iters = all_ranks_agree([  # collective
            self._ckpt_loaded, self._ckpt_saves > 0, self._train_iters >= MIN_ITERS_FOR_HB_TIMEOUTS,
        ])
        if not enough_iters:
            self._log.info(
                "[rank %s] heartbeat timeouts not updated: too little data (%s training "
                "iterations in this run, need %s)", self._rank, self._train_iters,
                MIN_ITERS_FOR_HB_TIMEOUTS,
            )
            return False
        if not (loaded and saved):
            self._log.info(
                "[rank %s] heartbeat timeouts not updated: a run must both load and save a "
                "checkpoint so that the intervals include them (this run: loaded=%s, saved=%s)",
                self._rank, loaded, saved,
            )
            return False
        if not client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):  # collective
            self._log.info(
                "[rank %s] heartbeat timeouts not updated: too few heartbeats were observed "
                "(%s training iterations)", self._rank, self._train_iters,
            )
            return False
        return True
