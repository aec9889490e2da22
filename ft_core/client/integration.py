"""Fault tolerance for a hand-written training loop (no Lightning): sections, warm-up, timeouts.

A few calls at fixed points of the loop wrap its phases in the sections ``setup``, ``step`` and
``checkpointing`` of the section API and keep the timeouts fitted to the run::

    import ft_core.client.integration as ft_integration

    dist.init_process_group(...)      # first: some calls below are collectives
    ft_integration.setup(checkpoint_dir, calculate_timeouts=True)      # opens "setup"
    ft_integration.maybe_setup_simulated_fault(fault_params)           # optional, for testing
    if load_checkpoint(checkpoint_dir):
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
    for batch in data:
        ft_integration.on_training_step_start()   # closes "setup"; opens "step" after warm-up
        train_step(batch)
        ft_integration.on_training_step_end()
        if time_to_save:
            ft_integration.on_checkpointing_start()
            save_checkpoint(checkpoint_dir)
            ft_integration.on_checkpointing_end(is_async_finalization=False)
    ft_integration.shutdown()

What is watched:

* ``setup`` is opened by :meth:`FaultToleranceIntegration.setup` and closed by the first
  training or evaluation step: model construction, checkpoint loading, data loader start-up.
* ``step`` wraps each training and evaluation step, except the first ``num_warmup_iters``
  (default 1) training steps of the run and the first ones of each evaluation run: those are
  often much slower (allocation, compilation, data loader start-up) and would force a long
  ``step`` timeout. They fall into the out-of-section time.
* ``checkpointing`` wraps checkpoint saving, including asynchronous finalisation.
* Everything else is out of section and bounded by ``rank_out_of_section_timeout``.

The rules are :mod:`ft_core.client.sections_policy`'s (the Lightning sections callback follows the
same ones) and the timeouts file is :mod:`ft_core.client.state_file`'s; this module adapts them to a
hand-written loop.

Timeouts: with ``calculate_timeouts=True`` they are calculated from the longest durations seen
on any rank, times the config's ``safety_factor`` (never below the config's
``min_calculated_section_timeout`` / ``min_calculated_out_of_section_timeout``, 60 s / 120 s by
default), after every checkpoint save and at :meth:`~FaultToleranceIntegration.shutdown`:

* ``step`` once the run did at least 16 training iterations;
* ``checkpointing`` once the run saved a checkpoint (not when asynchronous finalisation was seen:
  its duration varies too much from run to run);
* ``setup`` and the out-of-section timeout only in a run that loaded a persistent checkpoint, so
  that they include loading it (and, for the out-of-section time, once 16 iterations ran).

Rank 0 writes the client's ``state_dict()`` atomically to ``<checkpoint_dir>/_ft_state.json``
after each update; with ``calculate_timeouts=True``, :meth:`~FaultToleranceIntegration.setup` of
the next run (a restart or a resumed job) loads it when present, so calculated timeouts replace
configured ones from the start. Without it the configured timeouts are used as they are.

Collectives (:mod:`ft_core.client.collectives`, ``torch.distributed`` by default): when a process group
exists, ``setup`` (with ``calculate_timeouts``: rank 0 reads the state file and broadcasts it),
``maybe_setup_simulated_fault`` (the plan is broadcast), and, when
calculating timeouts, ``on_checkpointing_end(is_async_finalization=False)`` and ``shutdown``
must be called by every rank at the same point. Initialise the process group before ``setup``
and destroy it after ``shutdown``.

Every call is a no-op while fault tolerance is not initialised (before ``setup`` or after
``shutdown``), so a script can keep the calls and skip ``setup`` when it runs without
``ft_launcher``. Like the rest of ``ft_core``, this module never imports torch at import time.

The module-level functions act on one default :class:`FaultToleranceIntegration`; create your
own instance to hold the state elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

from ft_core.client import plain_state
from ft_core.client.collectives import Collectives, default_collectives, rank_and_world_size
from ft_core.client.front_end import require_bool, require_path
from ft_core.client.graceful_stop import GracefulStop, GracefulStopConfig
from ft_core.client.plain_state import track_state
from ft_core.client.policy_actions import apply_change, training_step_ended, update_section_timeouts
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.sections_policy import (
    MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE,
    NUM_WARMUP_ITERS,
    SECTION_CHECKPOINTING,
    SECTION_SETUP,
    SECTION_STEP,
    SECTIONS,
    SectionsPolicy,
    sections_config_error,
)
from ft_core.client.session import FrontEndSession, session_attribute
from ft_core.client.setup_errors import stop_job_for_setup_error
from ft_core.client.simulated_fault import SimulatedFault, SimulatedFaultParams
from ft_core.client.state_file import (
    MAX_STATE_FILE_BYTES,
    PART_SECTIONS,
    STATE_FILE_NAME,
    state_file_path,
)
from ft_core.wire.config_values import ConfigError

__all__ = [
    "MAX_STATE_FILE_BYTES", "MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE", "NUM_WARMUP_ITERS", "SECTIONS",
    "SECTION_CHECKPOINTING", "SECTION_SETUP", "SECTION_STEP", "STATE_FILE_NAME", "FaultToleranceIntegration",
    "get_integration", "get_rank_monitor_client", "is_initialized", "maybe_setup_simulated_fault",
    "on_checkpoint_loaded", "on_checkpointing_end", "on_checkpointing_start", "on_eval_step_end",
    "on_eval_step_start", "on_training_step_end", "on_training_step_start", "setup", "should_stop", "shutdown",
    "straggler_detection", "track_state", "load_jit_state",
]

PathLike = Union[str, "os.PathLike[str]"]
FaultParams = Union[SimulatedFaultParams, Mapping[str, Any]]
GracefulStopOption = Union[None, bool, GracefulStopConfig, Mapping[str, Any]]


class FaultToleranceIntegration:
    """The state of one training run's fault tolerance; see the module docstring.

    Args:
        logger_name: Logger the integration logs to (messages are prefixed ``[rank N]``).
        collectives: How the ranks agree (default: ``torch.distributed`` when initialised).
    """

    def __init__(self, logger_name: str = __name__, collectives: Optional[Collectives] = None) -> None:
        self._log = RankLoggerAdapter(logging.getLogger(logger_name))
        self._collectives = collectives if collectives is not None else default_collectives()
        self._session = FrontEndSession(self._log, PART_SECTIONS)  # the connection, set up in order
        self._policy = SectionsPolicy(calculate_timeouts=False)
        self._step: Optional[int] = None  # the step last passed to on_training_step_start
        self._resumed: Optional[tuple[int, str]] = None  # a restore reported before setup connected

    # ------------------------------------------------------------------ public state

    @property
    def is_initialized(self) -> bool:
        """True between a successful :meth:`setup` and :meth:`shutdown`."""
        return self._session.client is not None

    client = session_attribute("client", "The rank monitor client while initialised (for inspection; do not shut "
                               "it down), else None.")
    state_file_path = session_attribute("state_file_path", "Where calculated timeouts are loaded from and saved "
                                        "to (known once set up), else None.")

    @property
    def train_iters(self) -> int:
        """Training iterations seen in this run (warm-up iterations included)."""
        return self._policy.train_iters

    @property
    def graceful_stop(self) -> Optional[GracefulStop]:
        """The graceful stop of this run (``setup(graceful_stop=...)``), or None when off."""
        return self._session.graceful_stop

    def should_stop(self) -> bool:
        """True once every rank agreed to stop (a graceful stop); the same answer on every rank
        after the same :meth:`on_training_step_end`. Then save a checkpoint, leave the training
        loop and call :meth:`shutdown`; the process should exit 0."""
        stop = self._session.graceful_stop
        return stop is not None and stop.stop_step is not None

    # ------------------------------------------------------------------ life cycle

    def setup(
        self,
        checkpoint_dir: Optional[PathLike],
        *,
        calculate_timeouts: bool = False,
        num_warmup_iters: int = NUM_WARMUP_ITERS,
        state_file_name: str = STATE_FILE_NAME,
        graceful_stop: GracefulStopOption = None,
    ) -> None:
        """Connect to this rank's monitor, restore saved timeouts and open the ``setup`` section.

        A collective when a process group exists and ``calculate_timeouts`` is set (rank 0 reads
        the state file and broadcasts it): every rank must call it.

        Args:
            checkpoint_dir: The directory checkpoints are saved to; the timeouts file
                ``state_file_name`` lives there, next to the checkpoints it belongs with.
            calculate_timeouts: Calculate timeouts from observed durations, save them, and start
                from the ones an earlier run saved.
            num_warmup_iters: Training steps per run, and evaluation steps per evaluation run,
                left out of the ``step`` section (>= 0).
            state_file_name: Name of the timeouts file in ``checkpoint_dir``.
            graceful_stop: Turn stop signals (default SIGTERM and SIGUSR1) into a stop that all
                ranks agree on (see :mod:`ft_core.client.graceful_stop`): True, a
                :class:`~ft_core.client.graceful_stop.GracefulStopConfig` or a dict of its fields; None
                or False: off. Then :meth:`on_training_step_end` is a collective at the agreed
                check steps and :meth:`should_stop` says when to save and leave the loop. Must be
                called on the main thread for the handlers to be installed.

        Raises:
            ValueError: ``checkpoint_dir`` is not set, or another argument is invalid.
            RuntimeError: Already set up (call :meth:`shutdown` first).
            RankMonitorClientError: Not started by ``ft_launcher``, or the monitor cannot be
                reached.
            ConfigError: The monitor's configuration cannot watch this integration: a section
                is missing from ``rank_section_timeouts``, or, without ``calculate_timeouts``,
                a section or the out-of-section timeout is infinite.
        """
        session = self._session
        if session.is_open:
            raise RuntimeError("ft_core.client.integration.setup() was called twice; call shutdown() first")
        _check_setup_arguments(checkpoint_dir, calculate_timeouts, num_warmup_iters, state_file_name)
        stop_config = _graceful_stop_config(graceful_stop)
        assert checkpoint_dir is not None
        # Without a process group every process decides alone: its rank comes from the launcher.
        rank, world_size, grouped = rank_and_world_size(self._collectives)
        try:
            with session.opening():
                session.begin(rank, self._collectives)
                self._policy = SectionsPolicy(calculate_timeouts, num_warmup_iters)
                path = session.use_state_file(state_file_path(checkpoint_dir, state_file_name)).path
                if not grouped and world_size > 1:
                    self._log.warning(
                        "ft_core.client.integration.setup: WORLD_SIZE=%s but no torch.distributed process group "
                        "is initialised; calculated timeouts will differ between ranks (initialise the process "
                        "group before setup)", world_size,
                    )
                client = session.connect(restore=calculate_timeouts)  # with restore: a collective
                session.check_config(lambda c: sections_config_error(
                    "ft_core.client.integration", c.section_timeouts.section, c.section_timeouts.out_of_section,
                    calculate_timeouts, initial_heartbeat=c.hb_timeouts.initial))
                apply_change(client, self._policy.setup_started())
                if self._resumed is not None:
                    client.report_resumed(*self._resumed)
                stop_text = self._install_graceful_stop(session.arm_graceful_stop(stop_config))
                session.started("ft_core.client.integration set up: timeouts file %s (calculate_timeouts=%s, "
                                "warm-up iterations %s, graceful stop %s)", path, calculate_timeouts,
                                num_warmup_iters, stop_text)
        except BaseException as err:
            stop_job_for_setup_error(err, self._log)  # a restart would fail the same way
            raise

    def _install_graceful_stop(self, stop: Optional[GracefulStop]) -> str:
        """Install the stop's signal handlers now; how the "set up" line describes the stop."""
        if stop is None:
            return "off"
        names = ", ".join(s.name for s in stop.config.signals)
        if stop.install():
            return f"on {names}"
        self._log.warning("graceful stop not installed: setup() was not called on the main thread, where "
                          "Python lets signal handlers be set; %s keep their previous handling", names)
        return "not installed (not on the main thread)"

    def shutdown(self, update_timeouts: bool = True) -> None:
        """Close open sections, update and save timeouts, and disconnect from the monitor.

        Call it at the end of a run that ended normally, on every rank (the timeouts update is
        a collective). After a failure, when the other ranks may not get here, pass
        ``update_timeouts=False``: that only disconnects. Safe to call more than once; never
        raises (problems are logged).

        Args:
            update_timeouts: Run the final timeouts update (when ``calculate_timeouts``).
        """
        session = self._session
        client, stop = session.client, session.graceful_stop
        if client is None:
            return
        try:
            session.cancel_fault()
            for name in self._policy.run_ended():
                client.end_section(name)
            if update_timeouts:
                self._maybe_update_timeouts(client, final=True)
        except Exception:  # shutdown promises never to raise: the run's own outcome comes first
            self._log.exception("fault tolerance: final timeouts update failed")
        finally:
            session.close(clean_end=update_timeouts)
        if stop is not None and stop.stop_step is not None:
            self._log.rank_zero_info("fault tolerance shut down after a graceful stop (%s) after %s",
                                     stop.describe_stop(), stop.describe_step())
        else:
            self._log.rank_zero_info("fault tolerance shut down after %s training iterations", self._policy.train_iters)

    # ------------------------------------------------------------------ steps

    def on_training_step_start(self, step: Optional[int] = None) -> None:
        """A training step begins: close ``setup``; open ``step`` after the warm-up steps.

        Args:
            step: The step's number (e.g. the global iteration), published to the monitor so that
                a hang report says which step froze; default: training steps so far in this run.
        """
        session = self._session
        client = session.client
        if client is not None:
            self._step = step  # a graceful stop after this step names it (None: the run's own count)
            set_step = session.set_step
            if set_step is not None:
                set_step(self._policy.train_iters if step is None else step)
            apply_change(client, self._policy.training_step_started())

    def on_training_step_end(self) -> None:
        """A training step ended: close ``step`` if it was opened.

        With ``graceful_stop``, a collective at the check steps the ranks agreed on (about once
        per ``check_interval``); afterwards :meth:`should_stop` tells whether to stop now.
        """
        session = self._session
        client = session.client
        stop = session.graceful_stop
        if client is not None and training_step_ended(client, self._policy, stop, self._collectives):  # collective
            assert stop is not None
            stop.counted_step = self._step  # the step the user counts (and passed), when given
            self._log.rank_zero_info(
                    "graceful stop: %s; every rank stops after %s: save a checkpoint, leave the loop and exit 0 "
                    "(no finished flag; the next run resumes from the checkpoint)",
                    stop.describe_stop(), stop.describe_step())

    def on_eval_step_start(self) -> None:
        """An evaluation step begins: close ``setup``; open ``step`` after the warm-up steps."""
        client = self._session.client
        if client is not None:
            apply_change(client, self._policy.eval_step_started())

    def on_eval_step_end(self) -> None:
        """An evaluation step ended: close ``step`` if it was opened."""
        client = self._session.client
        if client is not None:
            end = self._policy.eval_step_ended()
            if end is not None:
                client.end_section(end)

    # ------------------------------------------------------------------ checkpoints

    def on_checkpointing_start(self) -> None:
        """Checkpoint saving (or asynchronous finalisation) begins: open ``checkpointing``.

        Nested calls are counted; only the outermost pair opens and closes the section.
        """
        client = self._session.client
        if client is not None:
            apply_change(client, self._policy.checkpointing_started())

    def on_checkpointing_end(self, is_async_finalization: bool) -> None:
        """Checkpoint saving ended: close ``checkpointing``; after a save, update timeouts.

        With ``calculate_timeouts`` and ``is_async_finalization=False`` this is a collective
        (every rank must call it after the same save).

        Args:
            is_async_finalization: True after finalising an asynchronous save (which may happen
                before any training step and may have had nothing to do); False after a save.
        """
        client = self._session.client
        if client is None:
            return
        end = self._policy.checkpointing_ended(is_async_finalization=is_async_finalization)
        if end.unmatched:
            self._log.debug("on_checkpointing_end() without on_checkpointing_start(); ignored")
            return
        apply_change(client, end.change)
        if not end.update_timeouts:
            return
        try:
            self._maybe_update_timeouts(client, final=False)
        except Exception:  # bookkeeping must never fail the checkpoint that was just saved
            self._log.exception("fault tolerance: timeouts update after a checkpoint failed")

    def on_checkpoint_loaded(self, is_local_chkpt: bool, step: Optional[int] = None) -> None:
        """A checkpoint was loaded; a persistent one makes ``setup`` timeouts calculable.

        Args:
            is_local_chkpt: True for a local (node-private, non-persistent) checkpoint, whose
                load time says little about a load from persistent storage.
            step: The completed step the checkpoint holds (an extension): the launcher then records
                where the restart resumed from, and ``ft_report`` shows the steps redone.
        """
        if self._session.client is not None:
            self._policy.checkpoint_loaded(persistent=not is_local_chkpt)
        if step is not None:
            self.report_resumed(step, "checkpoint")

    def report_resumed(self, step: int, source: str) -> None:
        """Tell the launcher where this rank's training resumed from (see
        :meth:`~ft_core.RankMonitorClient.report_resumed`); before :meth:`setup` the report is
        kept and sent once setup connected."""
        client = self._session.client
        if client is None:
            self._resumed = (step, source)
            return
        client.report_resumed(step, source)

    # ------------------------------------------------------------------ simulated faults

    def maybe_setup_simulated_fault(self, params: Optional[FaultParams]) -> Optional[SimulatedFault]:
        """Schedule a simulated fault (one rank kills or freezes itself) when ``params`` is given.

        A collective when a process group exists (the plan is agreed by broadcast): every rank
        must call it with the same ``params``. The fault is cancelled by :meth:`shutdown`.
        Arm it only in the first attempt (e.g. ``FT_LAUNCHER_CYCLE == "0"``), or every restart
        fails again.

        Args:
            params: A :class:`~ft_core.client.simulated_fault.SimulatedFaultParams`, an equivalent dict,
                or None for no fault.

        Returns:
            The scheduled fault (armed only on the failing rank), or None when ``params`` is
            None or fault tolerance is not initialised.

        Raises:
            ValueError: Invalid parameters, or ``rank_to_fail`` outside the world.
        """
        if params is None:
            return None
        if self._session.client is None:
            self._log.warning("simulated fault not scheduled: fault tolerance is not initialised "
                              "(call setup() first)")
            return None
        return self._session.arm_fault(SimulatedFaultParams.from_value(params))  # collective

    # ------------------------------------------------------------------ timeouts

    def _maybe_update_timeouts(self, client: RankMonitorClient, final: bool) -> bool:
        """Calculate the timeouts the run has data for (a collective); save them on rank 0.

        Returns:
            True if timeouts were updated.
        """
        if not self._policy.calculate_timeouts:
            return False
        if not update_section_timeouts(self._policy, client, self._collectives, self._log, final):  # collective
            return False
        self._session.save_timeouts()
        return True


_OWNER = "ft_core.client.integration.setup"  # who the argument errors name


def _graceful_stop_config(value: Any) -> Optional[GracefulStopConfig]:
    try:
        config = GracefulStopConfig.from_value(value)
    except ConfigError as err:
        raise ValueError(f"{_OWNER}: {err}") from None
    if config is not None and config.checkpoint_path is not None:
        raise ValueError(f"{_OWNER}: graceful_stop.checkpoint_path is for the Lightning callbacks; a training loop "
                         f"saves its own checkpoint when should_stop() turns True (got {config.checkpoint_path!r})")
    return config


def _check_setup_arguments(
    checkpoint_dir: Optional[PathLike], calculate_timeouts: Any, num_warmup_iters: Any, state_file_name: Any,
) -> None:
    if checkpoint_dir is None or (isinstance(checkpoint_dir, str) and not checkpoint_dir.strip()):
        raise ValueError(
            f"{_OWNER}: checkpoint_dir is not set (got {checkpoint_dir!r}). "
            "Fault tolerance keeps its state (calculated timeouts) next to the checkpoints: "
            "pass the directory your checkpoints are saved to."
        )
    require_path(_OWNER, "checkpoint_dir", checkpoint_dir)
    require_bool(_OWNER, "calculate_timeouts", calculate_timeouts)
    if isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
        raise ValueError(
            f"{_OWNER}: num_warmup_iters must be a whole number >= 0, got {num_warmup_iters!r}"
        )
    if not isinstance(state_file_name, str) or not state_file_name or os.sep in state_file_name:
        raise ValueError(
            f"{_OWNER}: state_file_name must be a plain file name, got {state_file_name!r}"
        )


# ---------------------------------------------------------------------- module-level API

_default = FaultToleranceIntegration()


def get_integration() -> FaultToleranceIntegration:
    """The instance the module-level functions act on."""
    return _default


def get_rank_monitor_client() -> Optional[RankMonitorClient]:
    """The rank monitor client while initialised, else None."""
    return _default.client


def is_initialized() -> bool:
    """True between :func:`setup` and :func:`shutdown`."""
    return _default.is_initialized


def setup(checkpoint_dir: Optional[PathLike], *, calculate_timeouts: bool = False,
          num_warmup_iters: int = NUM_WARMUP_ITERS, state_file_name: str = STATE_FILE_NAME,
          graceful_stop: GracefulStopOption = None) -> None:
    """Initialise fault tolerance; see :meth:`FaultToleranceIntegration.setup`."""
    _default.setup(checkpoint_dir, calculate_timeouts=calculate_timeouts,
                   num_warmup_iters=num_warmup_iters, state_file_name=state_file_name, graceful_stop=graceful_stop)


def should_stop() -> bool:
    """See :meth:`FaultToleranceIntegration.should_stop`."""
    return _default.should_stop()


def on_training_step_start(step: Optional[int] = None) -> None:
    """See :meth:`FaultToleranceIntegration.on_training_step_start`."""
    _default.on_training_step_start(step)


def on_training_step_end() -> None:
    """See :meth:`FaultToleranceIntegration.on_training_step_end`."""
    _default.on_training_step_end()


def on_eval_step_start() -> None:
    """See :meth:`FaultToleranceIntegration.on_eval_step_start`."""
    _default.on_eval_step_start()


def on_eval_step_end() -> None:
    """See :meth:`FaultToleranceIntegration.on_eval_step_end`."""
    _default.on_eval_step_end()


def on_checkpointing_start() -> None:
    """See :meth:`FaultToleranceIntegration.on_checkpointing_start`."""
    _default.on_checkpointing_start()


def on_checkpointing_end(is_async_finalization: bool) -> None:
    """See :meth:`FaultToleranceIntegration.on_checkpointing_end`."""
    _default.on_checkpointing_end(is_async_finalization)


def on_checkpoint_loaded(is_local_chkpt: bool, step: Optional[int] = None) -> None:
    """See :meth:`FaultToleranceIntegration.on_checkpoint_loaded`."""
    _default.on_checkpoint_loaded(is_local_chkpt, step)


def load_jit_state(model: Any, optimizer: Any, *, newer_than: Optional[int] = None,
                   load_extra: Optional[Callable[[dict[str, Any]], None]] = None,
                   checkpoint_dir: Optional[str] = None) -> Optional[int]:
    """See :func:`ft_core.client.plain_state.load_jit_state`; a restored state is also reported to
    the launcher (where the restart resumed from: ``ft_report``'s steps redone)."""
    step = plain_state.load_jit_state(model, optimizer, newer_than=newer_than, load_extra=load_extra,
                                      checkpoint_dir=checkpoint_dir)
    if step is not None:
        _default.report_resumed(step, plain_state.restored_source() or "jit")
    return step


def shutdown(update_timeouts: bool = True) -> None:
    """See :meth:`FaultToleranceIntegration.shutdown`."""
    _default.shutdown(update_timeouts)


def maybe_setup_simulated_fault(params: Optional[FaultParams]) -> Optional[SimulatedFault]:
    """See :meth:`FaultToleranceIntegration.maybe_setup_simulated_fault`."""
    return _default.maybe_setup_simulated_fault(params)


def straggler_detection(**kwargs: Any) -> Any:
    """Straggler detection for this loop: a :class:`ft_core.straggler.loop.StragglerLoop` (see
    ``docs/stragglers.md``); ``kwargs`` are its arguments. Imported here on demand: the package
    needs torch, which the rest of this module does not."""
    from ft_core.straggler.loop import StragglerLoop

    return StragglerLoop(**kwargs)
