"""``RankMonitorClient``: the per-rank handle on hang detection.

Call order (as in the reference's heartbeats and sections API guides):

1. ``init_workload_monitoring()`` connects to this rank's monitor (path from
   ``FT_RANK_MONITOR_IPC_SOCKET``, set by ``ft_launcher``) and receives the effective config. It
   also chains a ``sys.excepthook`` that writes the exception ending the rank to torch's error
   file, as ``@record`` would (:func:`ft_core.client.run_errors.install_error_recording`).
2. Optionally ``load_state_dict()`` with timeouts saved by an earlier run (before or after 1).
3. ``send_heartbeat()`` periodically and/or ``start_section(name)`` / ``end_section(name)``.
4. Optionally ``calculate_and_set_hb_timeouts()`` / ``calculate_and_set_section_timeouts()``
   once enough intervals were observed (collective when a process group exists).
5. Optionally save ``state_dict()`` for the next run.
6. ``shutdown_workload_monitoring()``.

Hot path: a heartbeat or section call stores a timestamp into memory shared with the monitor and
records the event in the rank's :class:`~ft_core.client.timeouts_calc.TimeoutsCalc`; it makes no
system call and never waits. If the monitor dies, those stores go nowhere and training continues
(fail-open); the client notices at its next liveness check (at most once a second) and logs it
once.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import socket
import struct
import time
import weakref
from collections.abc import Collection
from typing import Any, Optional

from ft_core.client import state as client_state
from ft_core.client.connection import MonitorConnection, send_to_launcher
from ft_core.client.ranklog import configure_rank_logging, rank_logger
from ft_core.client.run_errors import install_error_recording
from ft_core.client.timeout_bounds import (
    OUT_OF_SECTION,
    CalculatedMinimums,
    InForceLog,
    bound_heartbeat_timeouts,
    bound_section_timeouts,
    configured_heartbeat_timeouts,
    configured_section_timeouts,
    describe_heartbeat_timeouts,
    describe_section_timeouts,
    heartbeat_derivations,
    restored_hint,
    section_derivations,
)
from ft_core.client.timeouts_calc import TimeoutsCalc
from ft_core.wire import messages, protocol
from ft_core.wire.config import FaultToleranceConfig
from ft_core.wire.data import HeartbeatTimeouts, SectionAction, SectionTimeouts, WorkloadControlRequest
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import NotStartedByLauncherError, ProtocolError, RankMonitorClientError, TimeoutsCalcError
from ft_core.wire.progress_slot import (
    OFF_HEARTBEAT_COUNT,
    OFF_LAST_HEARTBEAT,
    OFF_LAST_SECTION_ACTIVITY,
    OFF_OUT_OF_SECTION_SINCE,
    OFF_STEP,
    ProgressSlot,
    section_offset,
)

LIVENESS_CHECK_INTERVAL = 1.0

_pack_f64 = struct.Struct("=d").pack_into
_pack_u64 = struct.Struct("=Q").pack_into
_monotonic = time.monotonic
_OPEN = SectionAction.OPEN
_CLOSE = SectionAction.CLOSE
_CLOSE_ALL = SectionAction.CLOSE_ALL


# Clients whose socket must not leak into forked children (data-loader workers), and whose
# slot a child must not write to (see MonitorConnection.forget_after_fork).
_live_clients: weakref.WeakSet[RankMonitorClient] = weakref.WeakSet()


def _close_sockets_in_child() -> None:
    for client in list(_live_clients):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_close_sockets_in_child)


class RankMonitorClient:
    """Connects one rank to its rank monitor; see the module docstring for the call order.

    Attributes:
        cfg: The config the launcher runs with, every field of it, received from the monitor
            (``None`` before init); ``cfg.to_yaml_file()`` writes a file
            ``FaultToleranceConfig.from_yaml_file()`` reads back to an equal config.
        hb_timeouts: Current heartbeat timeouts: ``None`` until ``init_workload_monitoring()``
            (the configured ones, then any restored) or ``load_state_dict()`` (the saved ones,
            applied and bounded at init), as in the reference.
        section_timeouts: Current section timeouts; ``None`` until then, like ``hb_timeouts``.
    """

    def __init__(self) -> None:
        self.cfg: FaultToleranceConfig | None = None
        self.hb_timeouts: HeartbeatTimeouts | None = None
        self.section_timeouts: SectionTimeouts | None = None
        self._conn: MonitorConnection | None = None
        self._slot: ProgressSlot | None = None
        self._mm: Any = None
        # The observations; also the one record of which sections are open.
        self._calc: TimeoutsCalc | None = None
        self._section_offsets: dict[str, int] = {}  # byte offset in the slot, set while initialised
        self._loaded_state: client_state.LoadedState | None = None
        self._state_source: str | None = None  # where the loaded state came from, for log lines
        self._resumed: dict[str, Any] | None = None  # report_resumed before init: sent at init
        self._next_liveness_check = 0.0
        self._first_use_checked = False
        self._log = rank_logger(__name__)
        self._minimums = CalculatedMinimums()
        self._in_force = InForceLog(self._log, self._minimums)
        self.rank_info: dict[str, Any] = {}

    # ------------------------------------------------------------------ life cycle

    @property
    def is_initialized(self) -> bool:
        """True between ``init_workload_monitoring`` and ``shutdown_workload_monitoring``."""
        return self._mm is not None

    def init_workload_monitoring(self) -> None:
        """Connect to this rank's monitor and start being watched.

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher`` (socket variable unset),
                already initialised, or the monitor cannot be reached.
        """
        if self.is_initialized:
            raise RankMonitorClientError(
                "init_workload_monitoring() was called twice; call "
                "shutdown_workload_monitoring() first"
            )
        path = os.environ.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR)
        if not path:
            raise NotStartedByLauncherError(  # uncaught: its message alone, no traceback
                f"{FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR} is not set: this process was not started "
                "by ft_launcher. Start training with `ft_launcher [torchrun options] script.py`, "
                "or point the variable at the socket of a running rank monitor."
            )
        self.rank_info = _rank_info_from_env()
        self._log.set_rank(self.rank_info.get("rank"))
        # The exception that ends this rank reaches the launcher's failure line and crash-loop
        # fingerprint also when the script has no torch @record.
        install_error_recording(self._log)
        conn, handshake = MonitorConnection.open(path, self.rank_info, self._log)
        self.cfg = handshake.config
        # log_level applies to the rank's fault tolerance loggers as it does to the monitors'.
        configure_rank_logging(self.cfg.log_level, "ft_core")
        self._minimums = CalculatedMinimums.from_config(self.cfg)
        configured = {"heartbeat": configured_heartbeat_timeouts(self.cfg),
                      "section": configured_section_timeouts(self.cfg)}
        self._in_force = InForceLog(self._log, self._minimums, configured)
        sections = handshake.sections
        self._conn = conn
        self._slot = slot = handshake.slot
        self._section_offsets = {name: section_offset(i) for i, name in enumerate(sections)}
        now = _monotonic()
        self._calc = TimeoutsCalc(sections, start_time=now, safety_factor=self.cfg.safety_factor)
        # The first heartbeat or section call checks the monitor at once, and with it how this
        # rank reports progress (see _check_first_use).
        self._next_liveness_check = now
        self._first_use_checked = False
        self.hb_timeouts = HeartbeatTimeouts(
            self.cfg.initial_rank_heartbeat_timeout, self.cfg.rank_heartbeat_timeout
        )
        self.section_timeouts = SectionTimeouts(
            section=dict(self.cfg.rank_section_timeouts),
            out_of_section=self.cfg.rank_out_of_section_timeout,
        )
        self._mm = slot.buffer
        _live_clients.add(self)
        raised: dict[str, dict[str, float]] = {}
        if self._loaded_state is not None:
            state, self._loaded_state = self._loaded_state, None
            raised = self._apply_state(state, report=False)
        self._in_force.baseline(self.hb_timeouts, self.section_timeouts)
        # A restored calculated timeout replaces a configured one, even one typed on the command
        # line (the reference's rule): say so where the timeouts in force are listed.
        hint = f"; {restored_hint(self._state_source)}" if raised and self._state_source is not None else ""
        self._log.rank_zero_info(
            "%s the rank monitor at %s; heartbeat timeouts in force: %s; section timeouts in force: %s%s",
            "connected to" if handshake.watched else "going on unwatched, without", path,
            describe_heartbeat_timeouts(self.hb_timeouts, self._minimums, raised.get("heartbeat", {}),
                                        configured=configured["heartbeat"]),
            describe_section_timeouts(self.section_timeouts, self._minimums, raised.get("section", {}),
                                      configured=configured["section"]),
            hint,
        )
        if self._resumed is not None:
            resumed, self._resumed = self._resumed, None
            with contextlib.suppress(RankMonitorClientError):  # an older monitor: the report is only missing
                self._request(resumed)

    def report_resumed(self, step: int, source: str) -> None:
        """Tell the launcher, once after a restore, where this rank's training resumed from.

        The launcher records it (a ``resumed`` record) and ``ft_report`` sets it against the step
        the failure happened at: the steps redone. Called by the training script's restore path
        (after it restored a just-in-time state, a checkpoint, or nothing); before
        ``init_workload_monitoring`` the report waits and is sent at init. Never raises because the
        monitor is gone (fail-open, as the other calls).

        Args:
            step: The completed step the restored state holds (training continues with the
                next one); 0 for a start from scratch.
            source: ``jit`` (the survivors' just-in-time state), ``jit_shared`` (the copy of it a
                previous job left in the checkpoint directory: a requeued job), ``checkpoint`` (a
                periodic checkpoint) or ``scratch``.

        Raises:
            RankMonitorClientError: ``step`` is not an int >= 0 or ``source`` not one of those.
        """
        try:
            step, source = messages.resumed_fields({"step": step, "source": source})
        except ValueError as err:
            raise RankMonitorClientError(f"report_resumed: {err}") from None
        message = {"type": protocol.MSG_RESUMED, "step": step, "source": source}
        if not self.is_initialized:
            self._resumed = message
            return
        with contextlib.suppress(RankMonitorClientError):  # an older monitor: the report is only missing
            self._request(message)

    def shutdown_workload_monitoring(self, *, clean_end: bool = False, stop_step: Optional[int] = None,
                                     stop_run_steps: Optional[int] = None,
                                     stop_signal: Optional[str] = None) -> None:
        """Stop being watched and disconnect. Safe to call more than once.

        Args:
            clean_end: The training ended cleanly (completed, or stopped gracefully). The
                monitor tells the launcher before it answers, so that a process that then
                aborts in its interpreter's teardown (a process group still alive at exit)
                is not taken for a crash and restarted (see docs/launcher.md).
            stop_step: With ``clean_end``, after a graceful stop: the step every rank stopped
                after, as the user counts it. The launcher records it (a ``graceful_stop``
                record) and names it in its result, so every node's stop can be compared.
            stop_run_steps: The same stop as training steps of this run.
            stop_signal: The stop's signal name (``SIGUSR1``).
        """
        if not self.is_initialized:
            return
        message: dict[str, Any] = {"type": protocol.MSG_SHUTDOWN}
        if clean_end:
            message["finished"] = True
            if isinstance(stop_step, int) and not isinstance(stop_step, bool):
                message.update(stop_step=int(stop_step), stop_signal=str(stop_signal or ""))
                if isinstance(stop_run_steps, int) and not isinstance(stop_run_steps, bool):
                    message["stop_run_steps"] = int(stop_run_steps)
        try:
            with contextlib.suppress(RankMonitorClientError):
                self._request(message, quiet=True)
        finally:  # a signal handler's exception in the request (a dying rank) still disconnects
            self._release()

    def _release(self) -> None:
        _live_clients.discard(self)
        self._mm = None
        self._section_offsets = {}
        if self._slot is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._slot.close()
            self._slot = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _forget_after_fork(self) -> None:
        # In a forked child: close our copy of the socket, stop writing to the parent's slot.
        self._mm = None
        self._section_offsets = {}
        self._slot = None
        if self._conn is not None:
            self._conn.forget_after_fork()
            self._conn = None

    # ------------------------------------------------------------------ hot path

    def send_heartbeat(self) -> None:
        """Tell the monitor this rank is alive. Never blocks.

        Raises:
            RankMonitorClientError: The client is not initialised.
        """
        mm = self._mm
        if mm is None:
            raise self._not_initialized("send_heartbeat")
        now = _monotonic()
        calc = self._calc
        calc.update_on_heartbeat(now)
        _pack_f64(mm, OFF_LAST_HEARTBEAT, now)
        _pack_u64(mm, OFF_HEARTBEAT_COUNT, calc.count)
        if now >= self._next_liveness_check:
            self._check_monitor(now)

    def set_step(self, step: int) -> None:
        """Tell the monitor which training step this rank is in. Never blocks.

        An extension (the reference has no such call): one 8-byte store into the progress slot.
        When a rank hangs, the launcher compares the steps of all ranks to name the one that
        stopped first ("rank 1 froze in step 61; rank 0 stopped waiting for it"). The front ends
        call it at the start of every training step.

        Args:
            step: The step about to run (an int >= 0, e.g. Lightning's ``global_step``).

        Raises:
            RankMonitorClientError: Not initialised, or ``step`` is not an int >= 0.
        """
        mm = self._mm
        if mm is None:
            raise self._not_initialized("set_step")
        try:
            _pack_u64(mm, OFF_STEP, step + 1)
        except (struct.error, TypeError):
            raise RankMonitorClientError(f"set_step needs an int step >= 0, got {step!r}") from None

    def start_section(self, section: str) -> None:
        """Open ``section``; it must be configured and not already open. Never blocks.

        Raises:
            RankMonitorClientError: Not initialised, unknown section, or already open.
        """
        offset = self._section_offsets.get(section)  # empty unless initialised
        if offset is None:
            raise self._section_error("start_section", section)
        now = _monotonic()
        calc = self._calc
        try:
            calc.update_on_section_event(section, _OPEN, now)
        except TimeoutsCalcError:  # the section is known, so it is open already
            raise RankMonitorClientError(
                f"section {section!r} is already open; call end_section({section!r}) first"
            ) from None
        mm = self._mm
        # Order matters for a concurrent reader: publish the open section before clearing
        # the out-of-section clock (see progress_slot).
        _pack_f64(mm, offset, now)
        if len(calc.open_sections) == 1:
            _pack_f64(mm, OFF_OUT_OF_SECTION_SINCE, 0.0)
        _pack_f64(mm, OFF_LAST_SECTION_ACTIVITY, now)
        if now >= self._next_liveness_check:
            self._check_monitor(now)

    def end_section(self, section: str) -> None:
        """Close ``section``, which must be open. Never blocks.

        Raises:
            RankMonitorClientError: Not initialised, unknown section, or not open.
        """
        offset = self._section_offsets.get(section)
        if offset is None:
            raise self._section_error("end_section", section)
        now = _monotonic()
        calc = self._calc
        try:
            calc.update_on_section_event(section, _CLOSE, now)
        except TimeoutsCalcError:  # the section is known, so it is not open
            raise RankMonitorClientError(
                f"end_section({section!r}) without a matching start_section({section!r})"
            ) from None
        mm = self._mm
        if not calc.open_sections:
            _pack_f64(mm, OFF_OUT_OF_SECTION_SINCE, now)
        _pack_f64(mm, offset, 0.0)
        _pack_f64(mm, OFF_LAST_SECTION_ACTIVITY, now)

    def _section_error(self, call: str, section: str) -> RankMonitorClientError:
        if self._mm is None:
            return self._not_initialized(call)
        return self._unknown_section(section)

    def end_all_sections(self) -> None:
        """Close every open section (e.g. before a checkpoint that is out of any section).

        Does nothing when no section is open (or the client is not initialised).
        """
        calc = self._calc
        if calc is None or not calc.open_sections or self._mm is None:
            return
        closed = list(calc.open_sections)
        now = _monotonic()
        calc.update_on_section_event(None, _CLOSE_ALL, now)
        mm = self._mm
        _pack_f64(mm, OFF_OUT_OF_SECTION_SINCE, now)  # before the sections close, as in end_section
        for section in closed:
            _pack_f64(mm, self._section_offsets[section], 0.0)
        _pack_f64(mm, OFF_LAST_SECTION_ACTIVITY, now)

    @property
    def open_sections(self) -> tuple[str, ...]:
        """Names of the sections currently open."""
        if self._mm is None:  # shut down, or a forked child: nothing of ours is open
            return ()
        return tuple(self._calc.open_sections)

    def _not_initialized(self, call: str) -> RankMonitorClientError:
        return RankMonitorClientError(
            f"{call}() called on a RankMonitorClient that is not initialised; call "
            "init_workload_monitoring() first (and not after shutdown_workload_monitoring())"
        )

    def _unknown_section(self, section: str) -> RankMonitorClientError:
        known = ", ".join(sorted(self._section_offsets)) or "none"
        return RankMonitorClientError(
            f"section {section!r} is not configured (configured sections: {known}); add it to "
            "rank_section_timeouts, e.g. --ft-param-rank_section_timeouts="
            f"{section}:600"
        )

    # ------------------------------------------------------------------ monitor liveness

    def _check_monitor(self, now: float) -> None:
        self._next_liveness_check = now + LIVENESS_CHECK_INTERVAL
        if not self._first_use_checked:
            self._first_use_checked = True
            self._check_first_use()
        conn = self._conn
        if conn is not None:
            conn.check_alive()

    def _check_first_use(self) -> None:
        """Warn, once, about a rank that opens a section before any heartbeat under a finite
        initial heartbeat timeout: sections are not heartbeats, so unless heartbeats
        follow, the monitor stops the rank when that timeout passes. Said up front, not an hour
        later; the front ends refuse the configuration instead (``sections_config_error``)."""
        calc = self._calc
        initial = self.hb_timeouts.initial
        if calc is None or calc.count or not calc.open_sections or initial is None:
            return
        self._log.warning(
            "start_section(%r) before any heartbeat while initial_rank_heartbeat_timeout is %s s: "
            "sections are not heartbeats, so unless this rank also sends heartbeats, its monitor "
            "will stop it %s s after it connected. For a workload that uses sections only, set "
            "initial_rank_heartbeat_timeout and rank_heartbeat_timeout to null (e.g. "
            "--ft-param-initial_rank_heartbeat_timeout=null --ft-param-rank_heartbeat_timeout=null)",
            next(iter(calc.open_sections)), f"{initial:g}", f"{initial:g}",
        )

    def _request(self, message: dict[str, Any], quiet: bool = False) -> bool:
        """See :meth:`MonitorConnection.request`; False without a connection."""
        conn = self._conn
        return conn.request(message, quiet) if conn is not None else False

    # ------------------------------------------------------------------ timeouts

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Calculate heartbeat timeouts from observed intervals and send them to the monitor.

        With a ``torch.distributed`` process group this is a collective: every rank must call
        it, and all get the same timeouts (from the longest intervals any rank observed). New
        values are merged with earlier calculated ones (EMA, see
        :meth:`~ft_core.client.timeouts_calc.TimeoutsCalc.get_hb_timeouts`), then raised to the
        config's ``min_calculated_initial_heartbeat_timeout`` / ``min_calculated_heartbeat_timeout``
        (see :mod:`ft_core.client.timeout_bounds`). The timeouts in force are logged when they change.

        Args:
            skip_if_not_ready: Return False instead of raising when fewer than two heartbeats
                were observed (on every rank).

        Returns:
            True if timeouts were calculated and set.

        Raises:
            RankMonitorClientError: Not initialised, or not enough data and not skipping.
        """
        calc = self._require_calc("calculate_and_set_hb_timeouts")
        calc.synchronize_all()  # collective
        if not calc.can_get_hb_timeouts():
            if skip_if_not_ready:
                self._log.debug("not enough heartbeats to calculate timeouts yet; skipped")
                return False
            raise RankMonitorClientError(
                "cannot calculate heartbeat timeouts yet: at least two heartbeats must be sent "
                "after init_workload_monitoring() (pass skip_if_not_ready=True to skip)"
            )
        new = calc.get_hb_timeouts(current=self.hb_timeouts)
        observed = {"initial": calc.initial_max_time, "subsequent": calc.subsequent_max_time}
        derivations = heartbeat_derivations(observed, calc.safety_factor, self.hb_timeouts, new)
        raised = bound_heartbeat_timeouts(new, self._minimums)
        self.hb_timeouts = new
        self._send_hb_timeouts()
        self._in_force.heartbeats(new, raised, "calculated", derivations)
        return True

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Optional[Collection[str]] = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Calculate section timeouts from observed durations and send them to the monitor.

        A collective when a process group exists (see :meth:`calculate_and_set_hb_timeouts`);
        every rank must pass the same arguments. If no section is open, the running
        out-of-section interval counts as if it ended now (the last one may be the longest).
        New values are merged with the current ones (see
        :meth:`~ft_core.client.timeouts_calc.TimeoutsCalc.get_section_timeouts`), then raised to the
        config's ``min_calculated_section_timeout`` / ``min_calculated_out_of_section_timeout``
        (see :mod:`ft_core.client.timeout_bounds`). The timeouts in force are logged when they change.

        Args:
            selected_sections: Sections to update (default: all configured).
            calc_out_of_section: Also update the out-of-section timeout.
            skip_if_not_ready: Return False instead of raising when a selected section (or
                out-of-section time) was never observed (on any rank).

        Returns:
            True if timeouts were calculated and set.

        Raises:
            RankMonitorClientError: Not initialised, unknown section, or not enough data and not
                skipping.
        """
        calc = self._require_calc("calculate_and_set_section_timeouts")
        if selected_sections is None:
            selected = list(self._section_offsets)
        elif isinstance(selected_sections, str):
            raise RankMonitorClientError(
                f"selected_sections must be a list of section names, got the string {selected_sections!r}"
            )
        else:
            selected = list(selected_sections)
        for name in selected:
            if name not in self._section_offsets:
                raise self._unknown_section(name)
        calc.maybe_bump_oos_time()
        calc.synchronize_all()  # collective
        try:
            new = calc.get_section_timeouts(selected, calc_out_of_section, current=self.section_timeouts)
        except TimeoutsCalcError as err:
            if skip_if_not_ready:
                self._log.debug("section timeouts not calculated (%s); skipped", err)
                return False
            raise RankMonitorClientError(
                f"cannot calculate section timeouts yet: {err} (pass skip_if_not_ready=True to skip)"
            ) from None
        observed = {name: calc.section_to_max_time[name] for name in selected}
        if calc_out_of_section:
            observed[OUT_OF_SECTION] = calc.out_of_section_max_time
        derivations = section_derivations(observed, calc.safety_factor, self.section_timeouts, new)
        raised = bound_section_timeouts(new, self._minimums, selected, calc_out_of_section)
        self.section_timeouts = new
        self._send_section_timeouts()
        self._in_force.sections(new, raised, "calculated", derivations)
        return True

    def _require_calc(self, call: str) -> TimeoutsCalc:
        if not self.is_initialized:
            raise self._not_initialized(call)
        return self._calc  # type: ignore[return-value]  (set while initialised)

    def _send_hb_timeouts(self) -> None:
        self._request({
            "type": protocol.MSG_SET_HB_TIMEOUTS,
            "initial": self.hb_timeouts.initial,
            "subsequent": self.hb_timeouts.subsequent,
        })

    def _send_section_timeouts(self) -> None:
        known = {k: v for k, v in self.section_timeouts.section.items() if k in self._section_offsets}
        self._request({
            "type": protocol.MSG_SET_SECTION_TIMEOUTS,
            "section": known,
            "out_of_section": self.section_timeouts.out_of_section,
        })

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Timeouts as a JSON-serialisable dict, identical on all ranks after a calculation.

        Before ``init_workload_monitoring()`` and ``load_state_dict()`` there are none: the
        state then holds no timeout (a later load restores nothing from it).
        """
        hb = self.hb_timeouts if self.hb_timeouts is not None else HeartbeatTimeouts()
        sections = self.section_timeouts if self.section_timeouts is not None else SectionTimeouts()
        return client_state.make_state_dict(hb, sections)

    def load_state_dict(self, state: dict[str, Any], *, source: Optional[str] = None) -> None:
        """Restore timeouts saved by :meth:`state_dict`, before or after init.

        Only calculated timeouts are restored (configured ones come from the config), bounded
        like freshly calculated ones (:mod:`ft_core.client.timeout_bounds`). After
        init they are sent to the monitor at once; before init, at init (until then
        ``hb_timeouts`` and ``section_timeouts`` show the state as saved). A state saved by the
        reference's client (``{"current_timeouts": {"heartbeat": ..., "section": ...}}``) is
        read too (see :mod:`ft_core.client.state`).

        Restored calculated timeouts replace the configured ones (as in the reference); the line
        that lists the timeouts in force names each configured value replaced, and ``source``.

        Args:
            state: What :meth:`state_dict` returned (in this run or an earlier one).
            source: Where ``state`` came from (e.g. a state file's path), for log lines.

        Raises:
            RankMonitorClientError: The state has the wrong schema (the message names the key).
        """
        try:
            loaded = client_state.parse_state_dict(state)
        except ValueError as err:
            raise RankMonitorClientError(f"invalid fault tolerance state: {err}") from None
        self._state_source = source
        if self.is_initialized:
            self._apply_state(loaded)
        else:
            # Shown as saved until init, which applies them over the config's and bounds them.
            self._loaded_state = loaded
            self.hb_timeouts = copy.deepcopy(loaded.hb)
            self.section_timeouts = copy.deepcopy(loaded.sections)

    def _apply_state(self, loaded: client_state.LoadedState, report: bool = True) -> dict[str, dict[str, float]]:
        """Apply restored calculated timeouts, bounded like freshly calculated ones (a file may
        come from an earlier version or a run with other minimums).

        Returns:
            ``{"heartbeat" | "section": {timeout: value before}}`` for values that were bounded.
        """
        raised: dict[str, dict[str, float]] = {}
        hb = client_state.restored_hb_timeouts(loaded)
        if hb is not None:
            raised["heartbeat"] = bound_heartbeat_timeouts(hb, self._minimums)
            self.hb_timeouts = hb
            self._send_hb_timeouts()
            if report:
                self._in_force.heartbeats(hb, raised["heartbeat"], self._restored_words())
        sections = client_state.restored_section_timeouts(loaded, self.section_timeouts, self._section_offsets)
        if sections is not None:
            raised["section"] = bound_section_timeouts(sections, self._minimums)
            self.section_timeouts = sections
            self._send_section_timeouts()
            if report:
                self._in_force.sections(sections, raised["section"], self._restored_words())
        return raised

    def _restored_words(self) -> str:
        """``restored`` or ``restored from PATH``, for an in-force line."""
        return "restored" if self._state_source is None else f"restored from {self._state_source}"

    # ------------------------------------------------------------------ workload control

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Ask the launcher to change how it handles the workload (see ``WorkloadAction``).

        The request goes to the launcher's control socket (``FT_LAUNCHER_IPC_SOCKET``) and is
        acknowledged before this returns. It does not need an initialised client.

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher``, or the launcher did not
                acknowledge the request.
        """
        if not isinstance(req, WorkloadControlRequest):
            raise RankMonitorClientError(
                f"expected a WorkloadControlRequest, got {type(req).__name__}"
            )
        path = os.environ.get(FT_LAUNCHER_IPC_SOCKET_ENV_VAR)
        if not path:
            raise RankMonitorClientError(
                f"{FT_LAUNCHER_IPC_SOCKET_ENV_VAR} is not set: workload control requests need a "
                "rank started by ft_launcher"
            )
        sender = self.rank_info or _rank_info_from_env()
        try:
            reply = send_to_launcher(path, {"type": protocol.MSG_WORKLOAD_CONTROL, **req.to_dict(), **sender})
        except (OSError, ProtocolError, TimeoutError) as err:
            raise RankMonitorClientError(
                f"could not deliver {req.action.name} to the launcher at {path}: {err}"
            ) from None
        if reply["type"] != protocol.MSG_OK:
            raise RankMonitorClientError(
                f"the launcher rejected {req.action.name}: {reply.get('error', reply['type'])}"
            )
        log = self._log if self._log.rank is not None else rank_logger(__name__, sender.get("rank"))
        log.info("sent workload control request %s (%s)", req.action.name, req.description)


def _rank_info_from_env() -> dict[str, Any]:
    info: dict[str, Any] = {"hostname": socket.gethostname()}
    for key, env_name in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world_size", "WORLD_SIZE")):
        value = os.environ.get(env_name, "").strip()
        if re.fullmatch(r"-?[0-9]{1,9}", value):  # str.isdigit would also accept e.g. "²"
            info[key] = int(value)
    return info
