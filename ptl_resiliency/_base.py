"""The life cycle both fault tolerance callbacks share.

``setup`` (``fit`` stage only) connects a :class:`~ft_core.RankMonitorClient`, restores timeouts
saved by an earlier run, checks that hang detection can work, arms a simulated fault and hooks
checkpoint saving. ``teardown`` (a ``fit`` run that ended normally) and ``on_exception`` (one
that did not) update timeouts when that is safe, create the finished flag when training is
complete, and disconnect.

Where collectives happen: reading the state file (broadcast from rank 0), planning a simulated
fault (broadcast), after each ``trainer.save_checkpoint`` (sections callback) and at
``teardown``: agreeing whether there is enough data (one all-reduce) and the timeout calculation
itself (one all-reduce in :class:`~ft_core.TimeoutsCalc`). All of these happen at points every
rank reaches together. ``on_exception`` never runs a collective: the other ranks may not be
there.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

from ft_core.client import RankMonitorClient
from ft_core.config import ConfigError
from ft_core.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from ft_core.errors import RankMonitorClientError
from ft_core.simulated_fault import SimulatedFault, SimulatedFaultParams, setup_simulated_fault
from ptl_resiliency._checkpoint_hooks import KIND_SAVE, CheckpointHooks
from ptl_resiliency._lightning import Callback, TrainerFn, pl
from ptl_resiliency._training_state import (
    FtStateFile,
    completion_reason,
    create_finished_flag,
    is_clean_exit,
    world_size,
)

PathLike = Union[str, "os.PathLike[str]"]


class _FaultToleranceCallbackBase(Callback):
    """Shared implementation; see :class:`~ptl_resiliency.FaultToleranceCallback`."""

    # Subclasses: also wrap the checkpoint IO methods (sections need the IO's own work).
    _WRAP_CHECKPOINT_IO = False

    # Lightning calls a callback's hook only when the attribute is callable, and each call costs
    # a profiler context (a few us). Per-batch hooks that these callbacks do not use are None so
    # that Lightning skips them: most of what a callback costs per step is this dispatch. A
    # subclass defines the ones it uses as methods.
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
        simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]] = None,
        exp_dir: Optional[PathLike] = None,
        logger_name: str = "ptl_resiliency",
    ) -> None:
        super().__init__()
        for name, value in (("autoresume", autoresume), ("calculate_timeouts", calculate_timeouts)):
            if not isinstance(value, bool):
                raise ValueError(f"{type(self).__name__}: {name} must be True or False, got {value!r}")
        if simulated_fault_params is not None:
            try:
                simulated_fault_params = SimulatedFaultParams.from_value(simulated_fault_params)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{type(self).__name__}: simulated_fault_params: {err}") from None
        if exp_dir is not None and not isinstance(exp_dir, (str, os.PathLike)):
            raise ValueError(f"{type(self).__name__}: exp_dir must be a path or None, got {exp_dir!r}")
        if not isinstance(logger_name, str) or not logger_name:
            raise ValueError(f"{type(self).__name__}: logger_name must be a non-empty string, got {logger_name!r}")
        self.autoresume = autoresume
        self.calculate_timeouts = calculate_timeouts
        self.simulated_fault_params: Optional[SimulatedFaultParams] = simulated_fault_params
        self.exp_dir: Optional[str] = None if exp_dir is None else os.fspath(exp_dir)
        self.logger_name = logger_name
        self._log = logging.getLogger(logger_name)
        self._client: Optional[RankMonitorClient] = None
        self._trainer: Optional[pl.Trainer] = None
        self._rank: Any = os.environ.get("RANK", 0)
        self._flag_path: Optional[str] = None
        self._state_file: Optional[FtStateFile] = None
        self._fault: Optional[SimulatedFault] = None
        self._ckpt_hooks: Optional[CheckpointHooks] = None
        self._reset_run_counters()

    def _reset_run_counters(self) -> None:
        self._ckpt_depth = 0
        self._ckpt_loaded = False
        self._ckpt_saves = 0
        self._train_iters = 0

    # ------------------------------------------------------------------ public state

    @property
    def is_active(self) -> bool:
        """True while connected to the rank monitor (from ``setup`` to the end of the run)."""
        return self._client is not None

    @property
    def client(self) -> Optional[RankMonitorClient]:
        """The rank monitor client while active (for inspection; do not shut it down)."""
        return self._client

    @property
    def state_file_path(self) -> Optional[str]:
        """Where calculated timeouts are loaded from and saved to (known after ``setup``)."""
        return None if self._state_file is None else self._state_file.path

    # ------------------------------------------------------------------ subclass interface

    def _check_timeouts(self, client: RankMonitorClient) -> None:
        """Raise a clear error when hang detection cannot work with this configuration."""
        raise NotImplementedError

    def _on_started(self, client: RankMonitorClient) -> None:
        """Called at the end of a successful ``setup``."""

    def _on_checkpointing_start(self, client: RankMonitorClient) -> None:
        """Checkpoint work began (outermost call only)."""

    def _on_checkpointing_end(self, client: RankMonitorClient) -> None:
        """Checkpoint work ended (outermost call only)."""

    def _after_checkpoint_save(self, trainer: pl.Trainer, client: RankMonitorClient) -> None:
        """``trainer.save_checkpoint`` succeeded; all ranks are here."""

    def _final_progress(self, client: RankMonitorClient, clean: bool) -> None:
        """Last report before disconnecting; ``clean``: the run ended normally."""

    def _update_timeouts(self, trainer: pl.Trainer, client: RankMonitorClient, final: bool) -> bool:
        """Calculate and send timeouts if there is enough data (a collective); True if updated."""
        raise NotImplementedError

    def _on_failure(self, trainer: pl.Trainer, exception: BaseException) -> None:
        """The run failed with ``exception`` (not a clean exit); called before cleanup."""

    # ------------------------------------------------------------------ Lightning hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Connect to the rank monitor (``fit`` only).

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher``, or the monitor cannot be
                reached.
            ConfigError: ``autoresume=True`` without ``FAULT_TOL_FINISHED_FLAG_FILE``, sections
                missing from the config (sections callback), or no valid timeouts while
                ``calculate_timeouts=False``.
            ValueError: The simulated fault names a rank outside the world.
        """
        if stage != TrainerFn.FITTING:
            return
        if self._client is not None:
            raise RuntimeError(
                f"{type(self).__name__} is already active; one instance cannot serve two "
                "concurrent Trainer.fit() runs"
            )
        self._rank = trainer.global_rank
        try:
            self._start(trainer)
        except BaseException:
            self._stop_quietly()
            raise

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The ``fit`` run ended normally: update timeouts, maybe create the flag, disconnect.

        Raises:
            OSError: The finished flag file could not be created (the auto-resume loop would
                otherwise run again after a completed training).
        """
        if stage != TrainerFn.FITTING or self._client is None:
            return
        self._finish(trainer, completion_reason(trainer), clean=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """The run ended with ``exception``; clean up without ever raising.

        Lightning calls this for errors in any stage, including in ``setup`` before this
        callback connected (then there is nothing to clean up), so the user always sees the
        original exception.
        """
        clean = is_clean_exit(exception)
        if not clean and trainer.state.fn == TrainerFn.FITTING:
            try:
                self._on_failure(trainer, exception)
            except Exception:
                self._log.exception("[rank %s] fault tolerance: handling %r failed", self._rank, exception)
        if self._client is None:
            return
        try:
            self._finish(trainer, "clean SystemExit(0)" if clean else None, clean=clean, exception=exception)
        except Exception:
            self._log.exception("[rank %s] fault tolerance: cleanup after %r failed", self._rank, exception)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Remember that this run resumed from a checkpoint (its intervals include the load)."""
        if self._client is not None:
            self._ckpt_loaded = True

    # ------------------------------------------------------------------ setup

    def _start(self, trainer: pl.Trainer) -> None:
        name = type(self).__name__
        others = [type(cb).__name__ for cb in trainer.callbacks
                  if isinstance(cb, _FaultToleranceCallbackBase) and cb is not self]
        if others:
            raise ConfigError(
                f"{name}: a Trainer takes one fault tolerance callback, but it also has "
                f"{', '.join(others)}. Each rank has a single connection to its monitor: use "
                "FaultToleranceCallback (heartbeats) or FaultToleranceSectionsCallback (sections)."
            )
        if not os.environ.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR):
            raise RankMonitorClientError(
                f"{name}: {FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR} is not set, so this process was not "
                "started by ft_launcher and has no rank monitor. Start training with "
                "`ft_launcher [torchrun options] script.py`, or remove the callback."
            )
        self._flag_path = None
        if self.autoresume:
            self._flag_path = os.environ.get(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR) or None
            if self._flag_path is None:
                raise ConfigError(
                    f"{name}(autoresume=True) needs {FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR}: the "
                    "path of the file to create when training completes, which tells the "
                    "auto-resume loop to stop. Set it (scripts/autoresume.sh does), or pass "
                    "autoresume=False."
                )
        self._reset_run_counters()
        self._trainer = trainer
        self._state_file = FtStateFile.for_trainer(trainer, self.exp_dir)  # collective
        client = RankMonitorClient()
        # Without calculate_timeouts the configured timeouts are what the user asked for.
        state = None
        if self.calculate_timeouts:
            state = self._state_file.read_agreed(trainer, self._log, self._rank)  # collective
        if state is not None:
            try:
                client.load_state_dict(state)
            except RankMonitorClientError as err:
                self._log.warning(
                    "[rank %s] ignoring fault tolerance state file %s: %s; configured timeouts are used",
                    self._rank, self._state_file.path, err,
                )
        client.init_workload_monitoring()
        self._client = client
        self._check_timeouts(client)
        if self.simulated_fault_params is not None:
            self._fault = setup_simulated_fault(self.simulated_fault_params)  # collective
        self._ckpt_hooks = CheckpointHooks(
            self._checkpoint_started, self._checkpoint_ended, self._WRAP_CHECKPOINT_IO
        )
        self._ckpt_hooks.install(trainer)
        self._on_started(client)
        self._log.info(
            "[rank %s] %s connected to its rank monitor: heartbeat timeouts %s, section timeouts "
            "%s; timeouts file %s (calculate_timeouts=%s, autoresume=%s)",
            self._rank, name, client.hb_timeouts.to_dict(), client.section_timeouts.to_dict(),
            self._state_file.path, self.calculate_timeouts, self.autoresume,
        )

    # ------------------------------------------------------------------ checkpoint hooks

    def _checkpoint_started(self, kind: str) -> None:
        client = self._client
        if client is None:
            return
        self._ckpt_depth += 1
        if self._ckpt_depth == 1:
            try:
                self._on_checkpointing_start(client)
            except Exception:
                self._log.exception("[rank %s] fault tolerance: checkpoint start not recorded", self._rank)

    def _checkpoint_ended(self, kind: str, ok: bool) -> None:
        client = self._client
        if client is None or self._ckpt_depth == 0:
            return
        try:
            self._ckpt_depth -= 1
            if self._ckpt_depth == 0:
                self._on_checkpointing_end(client)
            if kind == KIND_SAVE and ok:
                self._ckpt_saves += 1
                self._after_checkpoint_save(self._trainer, client)
        except Exception:
            # Bookkeeping must never fail a checkpoint or hide the exception of a failed one.
            self._log.exception("[rank %s] fault tolerance: after-checkpoint update failed", self._rank)

    # ------------------------------------------------------------------ end of run

    def _maybe_update_and_save_timeouts(self, trainer: pl.Trainer, client: RankMonitorClient, final: bool) -> None:
        """Update timeouts (a collective) and, on rank 0, persist them if they changed."""
        if not self._update_timeouts(trainer, client, final):
            return
        if trainer.global_rank == 0 and self._state_file is not None:
            self._state_file.write(client.state_dict())
            self._log.info("[rank %s] saved calculated timeouts to %s", self._rank, self._state_file.path)

    def _finish(
        self,
        trainer: pl.Trainer,
        completed: Optional[str],
        clean: bool,
        exception: Optional[BaseException] = None,
    ) -> None:
        """Final report, timeouts, flag, disconnect; raises only if the flag cannot be written."""
        client = self._client
        assert client is not None
        flag_error: Optional[OSError] = None
        try:
            if self._fault is not None:
                self._fault.cancel()
            self._final_progress(client, clean)
            if self.calculate_timeouts:
                self._final_timeouts_update(trainer, client, exception)
            if self.autoresume:
                if completed is None:
                    self._log.info(
                        "[rank %s] training did not complete (%s); no finished flag, the run can "
                        "be resumed", self._rank,
                        f"ended with {exception!r}" if exception is not None else "stopped early",
                    )
                elif trainer.global_rank == 0:
                    try:
                        create_finished_flag(self._flag_path, completed, trainer)
                        self._log.info("[rank %s] training completed (%s); created %s",
                                       self._rank, completed, self._flag_path)
                    except OSError as err:
                        self._log.error("[rank %s] training completed but the finished flag %s could "
                                        "not be created: %s", self._rank, self._flag_path, err)
                        flag_error = err
        finally:
            self._stop_quietly()
        if flag_error is not None and exception is None:
            raise flag_error

    def _final_timeouts_update(
        self, trainer: pl.Trainer, client: RankMonitorClient, exception: Optional[BaseException]
    ) -> None:
        if exception is not None and not is_clean_exit(exception):
            self._log.info("[rank %s] timeouts not updated: the run failed (%r) and its intervals "
                           "may include the failure", self._rank, exception)
            return
        if exception is not None and world_size() > 1:
            self._log.info("[rank %s] timeouts not updated: the run exited from inside the "
                           "training loop, where other ranks may not join a collective", self._rank)
            return
        try:
            self._maybe_update_and_save_timeouts(trainer, client, final=True)
        except Exception:
            self._log.exception("[rank %s] fault tolerance: final timeouts update failed", self._rank)

    def _stop_quietly(self) -> None:
        """Cancel the fault, unhook checkpoints, disconnect. Never raises."""
        if self._fault is not None:
            self._fault.cancel()
            self._fault = None
        if self._ckpt_hooks is not None:
            self._ckpt_hooks.uninstall()
            self._ckpt_hooks = None
        client, self._client = self._client, None
        self._trainer = None
        if client is not None:
            try:
                client.shutdown_workload_monitoring()
            except Exception:
                self._log.exception("[rank %s] fault tolerance: disconnecting from the monitor failed", self._rank)
