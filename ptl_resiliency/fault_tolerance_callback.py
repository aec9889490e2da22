"""``FaultToleranceCallback``: hang detection for Lightning training with heartbeats."""

from __future__ import annotations

from typing import Any, Optional, Union

from ft_core.client.sections_policy import MIN_ITERS_FOR_HB_TIMEOUTS
from ft_core.client.simulated_fault import SimulatedFaultParams
from ptl_resiliency._base import GracefulStopOption, PathLike, _FaultToleranceCallbackBase
from ptl_resiliency._drivers import HeartbeatDriver
from ptl_resiliency._lightning import pl

__all__ = ["MIN_ITERS_FOR_HB_TIMEOUTS", "FaultToleranceCallback"]


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
    ``FAULT_TOL_FINISHED_FLAG_FILE`` when training completed (``max_steps`` reached, the last
    epoch allowed by ``max_epochs`` ran to its end, ``max_time`` ran out, ``EarlyStopping``
    stopped it, or a clean ``SystemExit(0)``), never after a failure or interruption, a
    ``trainer.should_stop`` set by user code, or a ``fast_dev_run``. A ``ConfigError`` at setup
    also asks ``ft_launcher`` to stop the job (no restart can fix it). See ``docs/lightning.md``.

    Args:
        autoresume: Create the finished flag file when training completes.
        calculate_timeouts: Calculate timeouts from observed intervals and persist them.
        simulated_fault_params: A :class:`~ft_core.client.simulated_fault.SimulatedFaultParams` or an
            equivalent dict, to kill or hang one rank on purpose (for testing restarts).
        exp_dir: Directory of the timeouts file; default ``<trainer.default_root_dir>/ft_state``
            (the same for every run started the same way), keyed to the run under auto-resume
            (``$AUTORESUME_RUN_DIR/ft_state``) or SLURM (``.../ft_state/slurm-<job id>``).
        logger_name: Name of the logger this callback logs to.
        graceful_stop: Turn stop signals (default SIGTERM and SIGUSR1) into a coordinated stop:
            all ranks agree on a step, save a checkpoint there and leave ``fit`` with
            :class:`~ft_core.client.graceful_stop.GracefulStopExit` (exit status 0, no finished flag).
            True, a :class:`~ft_core.client.graceful_stop.GracefulStopConfig` or a dict of its fields
            (``signals``, ``check_interval``, ``checkpoint_path``); None or False: off. See
            ``docs/lightning.md``.

    Raises:
        ValueError: An argument has an invalid value (named in the message).
    """

    def __init__(self, autoresume: bool, calculate_timeouts: bool,
                 simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]] = None,
                 exp_dir: Optional[PathLike] = None, logger_name: str = "ptl_resiliency.FaultToleranceCallback",
                 graceful_stop: GracefulStopOption = None) -> None:
        super().__init__(autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name, graceful_stop,
                         HeartbeatDriver)
        self._heartbeats: HeartbeatDriver = self._driver

    # ------------------------------------------------------------------ heartbeats (HeartbeatDriver)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat: setup and checkpoint loading are done (the graceful stop is installed and the
        timeouts in force logged)."""
        super().on_train_start(trainer, pl_module)
        self._heartbeats.train_started(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Heartbeat after every training batch; the graceful stop's check."""
        self._jit.batch_ended()  # first: the step is counted, a copy of the state is consistent again
        if self._heartbeats.train_batch_ended(trainer):  # a collective at the graceful stop's agreed steps
            self._stop.stop_now(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat before validation (its first batch may take a while to load)."""
        self._heartbeats.heartbeat()

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Heartbeat after every validation batch."""
        self._heartbeats.heartbeat()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat after validation."""
        self._heartbeats.heartbeat()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat at the end of training."""
        self._heartbeats.heartbeat()
