"""The life cycle both fault tolerance callbacks share.

``setup`` (``fit`` stage only) opens the callback's :class:`~ft_core.client.session.FrontEndSession`:
it connects a :class:`~ft_core.RankMonitorClient`, restores timeouts saved by an earlier run,
checks that hang detection can work, arms a simulated fault, hooks checkpoint saving and arms the
graceful stop, in the session's order. ``teardown`` (a ``fit`` run that ended normally) and
``on_exception`` (one that did not) update timeouts when that is safe, create the finished flag
when training is complete, and close the session (which undoes the set-up in reverse).

The rules (which sections, which timeouts when, the config check, when the final update may run)
are :mod:`ft_core.client.sections_policy`'s; the state file is :mod:`ft_core.client.state_file`'s;
the order of set-up and tear-down is :mod:`ft_core.client.session`'s, the same as
:mod:`ft_core.client.integration`'s. This module and the two callbacks only translate Lightning's
hooks into the policy's events and carry out its answers.

Where collectives happen (through the strategy, :class:`~ptl_resiliency._collectives.StrategyCollectives`):
reading the state file (broadcast from rank 0), planning a simulated fault (broadcast), after
each ``trainer.save_checkpoint`` (sections callback) and at ``teardown``: agreeing on what there
is data for and the timeout calculation itself. All of these happen at points every rank
reaches together. ``on_exception`` never runs a collective in a multi-rank job: the other ranks
may not be there.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

# torch's error-file writer, which on_exception uses: imported now, not while a failed rank ends
# (under the launcher's SIGTERM grace; a stack taken then showed the import, not the wait).
import torch.distributed.elastic.multiprocessing.errors  # noqa: F401

from ft_core.client.front_end import require_bool, require_path
from ft_core.client.graceful_stop import GracefulStopConfig, GracefulStopExit
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.run_errors import record_error_for_launcher, stop_job_for_setup_error
from ft_core.client.sections_policy import (
    HeartbeatsPolicy,
    SectionsPolicy,
    final_update_refusal,
    is_clean_exit,
    is_graceful_stop,
)
from ft_core.client.session import FrontEndSession, session_attribute
from ft_core.client.simulated_fault import SimulatedFaultParams
from ft_core.client.state_file import PART_SECTIONS
from ft_core.client.timeout_bounds import (
    Snapshot,
    describe_heartbeat_timeouts,
    describe_section_timeouts,
    heartbeat_snapshot,
    section_snapshot,
    significant_change,
)
from ft_core.wire.config import ConfigError
from ft_core.wire.env import (
    FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)
from ft_core.wire.errors import NotStartedByLauncherError
from ptl_resiliency._checkpoint_hooks import CheckpointHooks
from ptl_resiliency._collectives import StrategyCollectives
from ptl_resiliency._lightning import Callback, TrainerFn, pl
from ptl_resiliency._metrics import MetricsLogger
from ptl_resiliency._training_state import (
    completion_reason,
    create_finished_flag,
    incomplete_reason,
    state_file_for_trainer,
)

PathLike = Union[str, "os.PathLike[str]"]
GracefulStopOption = Union[None, bool, GracefulStopConfig, dict[str, Any]]


class _FaultToleranceCallbackBase(Callback):
    """Shared implementation; see :class:`~ptl_resiliency.FaultToleranceCallback`."""

    # Subclasses: also wrap the checkpoint IO methods (sections need the IO's own work).
    _WRAP_CHECKPOINT_IO = False
    # Subclasses: the part of the state file this callback reads and writes.
    _STATE_PART = ""

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
        simulated_fault_params: Optional[Union[SimulatedFaultParams, dict[str, Any]]],
        exp_dir: Optional[PathLike],
        logger_name: str,
        graceful_stop: GracefulStopOption,
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
        self._log = RankLoggerAdapter(logging.getLogger(logger_name))
        self._session = FrontEndSession(self._log, self._STATE_PART)  # the connection, set up in order
        self._policy: Any = None  # the subclass's policy, from setup on
        self._flag_path: Optional[str] = None
        self._ckpt_hooks: Optional[CheckpointHooks] = None
        self._metrics: Optional[MetricsLogger] = None
        self._stopped: Optional[GracefulStopExit] = None
        self._updated_logged: Optional[Snapshot] = None  # the timeouts the last "Updated FT timeouts" line showed

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
        return self._stopped

    # ------------------------------------------------------------------ subclass interface

    def _new_policy(self, trainer: pl.Trainer) -> Union[HeartbeatsPolicy, SectionsPolicy]:
        """The policy for a new run."""
        raise NotImplementedError

    def _config_error(self, client: RankMonitorClient) -> Optional[ConfigError]:
        """Why hang detection cannot work with the monitor's configuration, or None."""
        raise NotImplementedError

    def _on_started(self, client: RankMonitorClient) -> None:
        """Called at the end of a successful ``setup``."""

    def _checkpoint_started(self, client: RankMonitorClient, kind: str) -> None:
        """Checkpoint work of ``kind`` (see :mod:`~ptl_resiliency._checkpoint_hooks`) begins."""

    def _checkpoint_ended(self, client: RankMonitorClient, kind: str, ok: bool) -> None:
        """Checkpoint work of ``kind`` ended (``ok``: without an exception)."""

    def _final_progress(self, client: RankMonitorClient, clean: bool) -> None:
        """Last report before disconnecting; ``clean``: the run ended normally."""

    def _update_timeouts(self, client: RankMonitorClient, final: bool) -> bool:
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
                missing from the config or configured but never opened (sections callback), or
                no valid timeouts while ``calculate_timeouts=False``.
            ValueError: The simulated fault names a rank outside the world.
        """
        if stage != TrainerFn.FITTING:
            return
        if self._session.is_open:
            raise RuntimeError(
                f"{type(self).__name__} is already active; one instance cannot serve two "
                "concurrent Trainer.fit() runs"
            )
        with self._session.opening():  # whatever raises below leaves nothing connected or hooked
            self._start(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The ``fit`` run ended normally: update timeouts, maybe create the flag, disconnect.

        Raises:
            OSError: The finished flag file could not be created (the auto-resume loop would
                otherwise run again after a completed training).
        """
        if stage != TrainerFn.FITTING or self._session.client is None:
            return
        self._finish(trainer, completion_reason(trainer), clean=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """The run ended with ``exception``; clean up without ever raising.

        Lightning calls this for errors in any stage, including in ``setup`` before this
        callback connected (then there is nothing to clean up), so the user always sees the
        original exception.
        """
        clean = is_clean_exit(exception)
        stopped = is_graceful_stop(exception)
        if not clean and not stopped and trainer.state.fn == TrainerFn.FITTING:
            # The launcher's failure line shows the exception; a setup error that every restart
            # would hit again stops the job instead of burning the allocation.
            record_error_for_launcher(exception, self._log)
            stop_job_for_setup_error(exception, self._log)
            try:
                self._on_failure(trainer, exception)
            except Exception:  # the user's policy may raise anything; their exception comes first
                self._log.exception("fault tolerance: handling %r failed", exception)
        if self._session.client is None:
            return
        try:
            # A graceful stop ends a healthy run on every rank at the same step: as clean as a normal end.
            self._finish(trainer, "clean SystemExit(0)" if clean else None, clean=clean or stopped, exception=exception)
        except Exception:  # our bookkeeping must never replace the user's exception
            self._log.exception("fault tolerance: cleanup after %r failed", exception)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Remember that this run resumed from a checkpoint (its intervals include the load)."""
        if self._session.client is not None:
            self._policy.checkpoint_loaded()

    # ------------------------------------------------------------------ setup

    def _start(self, trainer: pl.Trainer) -> None:
        session = self._session
        session.begin(trainer.global_rank, StrategyCollectives(trainer.strategy))
        name = type(self).__name__
        copies = sum(1 for callback in trainer.callbacks if callback is self)
        if copies > 1:
            raise ConfigError(
                f"{name}: the same instance is in the Trainer's callbacks {copies} "
                "times; pass it once (Trainer(callbacks=[ft, ...]))"
            )
        others = [type(cb).__name__ for cb in trainer.callbacks
                  if isinstance(cb, _FaultToleranceCallbackBase) and cb is not self]
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
        self._policy = self._new_policy(trainer)
        self._updated_logged = None
        path = session.use_state_file(state_file_for_trainer(trainer, self.exp_dir)).path  # collective
        # Without calculate_timeouts the configured timeouts are what the user asked for.
        client = session.connect(restore=self.calculate_timeouts)  # with restore: a collective
        session.check_config(self._config_error)
        if self.simulated_fault_params is not None:
            session.arm_fault(self.simulated_fault_params)  # collective
        self._ckpt_hooks = CheckpointHooks(self._on_checkpoint_start, self._on_checkpoint_end, self._WRAP_CHECKPOINT_IO)
        session.hold("checkpoint hooks", self._unhook)
        self._ckpt_hooks.install(trainer)
        self._metrics = MetricsLogger(trainer, self._log, sections=self._STATE_PART == PART_SECTIONS)
        self._on_started(client)
        self._stopped = None
        # Installed at on_train_start, after Lightning's own handlers; ours then call the handlers
        # the program had before fit (the user's), not Lightning's (whose SIGTERM handling would
        # end the run at the next batch, without a checkpoint).
        stop = session.arm_graceful_stop(self.graceful_stop)
        if stop is not None:
            stop.chain_to_current_handlers()
        session.started(
            "%s set up: timeouts file %s (calculate_timeouts=%s, autoresume=%s, graceful stop %s)",
            name, path, self.calculate_timeouts, self.autoresume,
            "off" if self.graceful_stop is None else "on " + ", ".join(s.name for s in self.graceful_stop.signals),
        )

    def _unhook(self) -> None:
        """Undo what ``_start`` hooked into the Trainer (checkpoint saving, its logger)."""
        hooks, self._ckpt_hooks, self._metrics = self._ckpt_hooks, None, None
        if hooks is not None:
            hooks.uninstall()

    # ------------------------------------------------------------------ graceful stop

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the cycle and the timeouts in force to the Trainer's logger (step restored by now);
        install the graceful stop's signal handlers (Lightning installed its own just before)."""
        self._log_metrics()
        stop = self._session.graceful_stop
        if stop is None:
            return
        self._stop_checkpoint(trainer)  # a ConfigError now rather than at the stop
        if not stop.install():
            self._log.warning("graceful stop not installed: fit() does not run on the main thread, where Python "
                              "lets signal handlers be set")

    def _stop_checkpoint(self, trainer: pl.Trainer) -> str:
        """Where the stop checkpoint goes: ``checkpoint_path``, or the ``ModelCheckpoint``'s last.ckpt."""
        assert self.graceful_stop is not None
        if self.graceful_stop.checkpoint_path is not None:
            return self.graceful_stop.checkpoint_path
        path = last_checkpoint_path(trainer)
        if path is not None:
            return path
        raise ConfigError(
            f"{type(self).__name__}(graceful_stop=...) needs a checkpoint to save at the stop: give "
            "graceful_stop={'checkpoint_path': ...}, or a ModelCheckpoint with a dirpath (the stop then "
            "saves <dirpath>/last.ckpt, which fit(ckpt_path='last') resumes from)"
        )

    def _graceful_stop_now(self, trainer: pl.Trainer) -> None:
        """Every rank agreed to stop after this step: save the checkpoint (all ranks) and leave ``fit``."""
        stop = self._session.graceful_stop
        assert stop is not None
        path = self._stop_checkpoint(trainer)
        step = int(trainer.global_step)
        stop.counted_step = step  # the launcher's graceful_stop record names the global step, as the user counts
        self._log.rank_zero_info("graceful stop: %s; every rank stops after global step %s and saves %s",
                                 stop.describe_stop(), step, path)
        trainer.save_checkpoint(path)  # every rank: rank 0 writes, the others take part
        self._log.rank_zero_info("graceful stop: saved %s at global step %s; leaving fit (exit 0, no finished flag)",
                                 path, step)
        raise GracefulStopExit(step, stop.stop_signal.name if stop.stop_signal else "a stop signal", path)

    # ------------------------------------------------------------------ checkpoint hooks

    def _on_checkpoint_start(self, kind: str) -> None:
        client = self._session.client
        if client is None:
            return
        try:
            self._checkpoint_started(client, kind)
        except Exception:  # bookkeeping must never fail the user's checkpoint
            self._log.exception("fault tolerance: checkpoint start not recorded")

    def _on_checkpoint_end(self, kind: str, ok: bool) -> None:
        client = self._session.client
        if client is None:
            return
        try:
            self._checkpoint_ended(client, kind, ok)
        except Exception:  # never fail a checkpoint, or hide the exception of a failed one
            self._log.exception("fault tolerance: after-checkpoint update failed")

    # ------------------------------------------------------------------ end of run

    def _maybe_update_and_save_timeouts(self, client: RankMonitorClient, final: bool) -> None:
        """Update timeouts (a collective) and, on rank 0, persist them if they changed."""
        if not self._update_timeouts(client, final):
            return
        saved = self._session.save_timeouts()
        self._log_updated_timeouts(client, saved)
        self._log_metrics(save=final)

    def _log_updated_timeouts(self, client: RankMonitorClient, saved: bool = True) -> None:
        """The reference's line after calculated timeouts were applied and saved.

        People grep logs for "Updated FT timeouts"; it stands next to the client's "timeouts in
        force (calculated)" line, which says how each value came about. INFO (rank 0) when the
        timeouts changed significantly since this run's last such line, else DEBUG, like ours.
        When rank 0 could not save them the line says so (they hold for this run only).
        """
        if self._STATE_PART == PART_SECTIONS:
            snapshot = section_snapshot(client.section_timeouts)
            text = describe_section_timeouts(client.section_timeouts)
        else:
            snapshot = heartbeat_snapshot(client.hb_timeouts)
            text = describe_heartbeat_timeouts(client.hb_timeouts)
        if significant_change(self._updated_logged, snapshot):
            self._updated_logged = snapshot
            if saved:
                self._log.rank_zero_info("Updated FT timeouts. New values: %s", text)
            else:  # the state file's warning said why; the next run starts from the configured ones
                self._log.rank_zero_info("Updated FT timeouts for this run only (not saved to %s). New values: %s",
                                         self._session.state_file_path, text)
        else:
            self._log.debug("Updated FT timeouts: no significant change")  # short: every checkpoint, every rank

    def _log_metrics(self, save: bool = False) -> None:
        """Log what changed of the cycle and the timeouts in force; never raises."""
        client, metrics = self._session.client, self._metrics
        if client is not None and metrics is not None:
            metrics.log(client, save=save)

    def _finish(
        self,
        trainer: pl.Trainer,
        completed: Optional[str],
        clean: bool,
        exception: Optional[BaseException] = None,
    ) -> None:
        """Final report, timeouts, flag, disconnect; raises only if the flag cannot be written."""
        client = self._session.client
        assert client is not None
        flag_error: Optional[OSError] = None
        try:
            self._session.cancel_fault()
            self._final_progress(client, clean)
            if self.calculate_timeouts:
                self._final_timeouts_update(client, exception)
            # a run that trained nothing (resumed at its end) never got to on_train_start
            self._log_metrics(save=True)
            if is_graceful_stop(exception):
                self._stopped = exception  # type: ignore[assignment]
            if self.autoresume:
                if completed is None:
                    self._log.rank_zero_info(
                        "training did not complete (%s); no finished flag, the run can be resumed",
                        exception if is_graceful_stop(exception) else
                        f"ended with {exception!r}" if exception is not None else incomplete_reason(trainer),
                    )
                elif trainer.global_rank == 0:
                    try:
                        create_finished_flag(self._flag_path, completed, trainer)
                        self._log.info("training completed (%s); created %s", completed, self._flag_path)
                    except OSError as err:
                        self._log.error("training completed but the finished flag %s could not be created: %s",
                                        self._flag_path, err)
                        flag_error = err
        finally:
            self._session.close(clean_end=clean)
        if flag_error is not None and exception is None:
            raise flag_error

    def _final_timeouts_update(self, client: RankMonitorClient, exception: Optional[BaseException]) -> None:
        collectives = self._session.collectives
        world_size = collectives.world_size() if collectives is not None else 1
        refusal = final_update_refusal(exception, world_size)
        if refusal is not None:
            self._log.rank_zero_info("timeouts not updated: %s", refusal)
            return
        try:
            self._maybe_update_and_save_timeouts(client, final=True)
        except Exception:  # a completed run must still create its flag and disconnect
            self._log.exception("fault tolerance: final timeouts update failed")


def last_checkpoint_path(trainer: pl.Trainer) -> Optional[str]:
    """``<dirpath>/last.ckpt`` of the trainer's ``ModelCheckpoint`` (what ``fit(ckpt_path='last')``
    resumes from); None without a ``ModelCheckpoint`` with a dirpath and a plain last name."""
    checkpoint = trainer.checkpoint_callback
    dirpath = getattr(checkpoint, "dirpath", None)
    last_name = getattr(checkpoint, "CHECKPOINT_NAME_LAST", None)
    if dirpath and isinstance(last_name, str) and "{" not in last_name:
        return os.path.join(dirpath, last_name + getattr(checkpoint, "FILE_EXTENSION", ".ckpt"))
    return None
