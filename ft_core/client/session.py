"""One front end's run with its rank monitor: the set-up every front end performs, in one order.

Every front end (:class:`ft_core.client.integration.FaultToleranceIntegration` for a hand-written
loop, the two Lightning callbacks of ``ptl_resiliency``) holds a :class:`FrontEndSession` and
opens and closes it through these steps, in this order::

    session.begin(rank, collectives)       # logging (INFO until the monitor's level is known), rank
    session.use_state_file(path)           # the timeouts file of this run
    session.connect(restore=...)           # client; saved timeouts restored; monitoring initialised;
                                           # the monitor's log level; the step publisher
    session.check_config(check)            # the monitor's config can watch this front end
    ...                                    # the front end's own: sections, hooks, a simulated fault
    session.arm_graceful_stop(config)      # the graceful stop (None: off)
    session.started(message, *args)        # the "set up" line; the run's hooks work from here
    ...
    session.close()                        # undo all of it, in reverse order

The order is the session's contract, enforced here rather than described: each step checks the
:class:`SessionPhase` it follows and raises :class:`SessionOrderError` when called out of turn;
a step moves the phase on only when it succeeded.
Everything a step acquires (the connection, the step publisher, a simulated fault, the graceful
stop's signal handlers, and what the front end hands to :meth:`FrontEndSession.hold`) is released
by :meth:`~FrontEndSession.close` in reverse order of acquisition, each release even when an
earlier one failed, and ``close`` never raises. :meth:`~FrontEndSession.opening` closes the
session when its block raises, so an exception in the middle of set-up leaves nothing behind.

A closed session can be opened again (a callback used for a second ``fit``, ``setup`` after
``shutdown``).
"""

from __future__ import annotations

import contextlib
import enum
import operator
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional, Union

from ft_core.client.collectives import Collectives
from ft_core.client.graceful_stop import GracefulStop, GracefulStopConfig
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.ranklog import RankLoggerAdapter, configure_rank_logging
from ft_core.client.simulated_fault import (
    SimulatedFault,
    SimulatedFaultParams,
    setup_simulated_fault,
)
from ft_core.client.state_file import StateFile
from ft_core.client.timeout_bounds import (
    Snapshot,
    heartbeat_snapshot,
    section_snapshot,
    significant_change,
)
from ft_core.wire.config_values import ConfigError
from ft_core.wire.errors import RankMonitorClientError

__all__ = ["FrontEndSession", "SessionOrderError", "SessionPhase", "session_attribute"]

ConfigCheck = Callable[[RankMonitorClient], Optional[ConfigError]]
Release = Callable[[], None]


class SessionPhase(enum.IntEnum):
    """How far a session is opened; each step of the set-up moves it one phase on."""

    IDLE = 0
    """Holds nothing: before :meth:`~FrontEndSession.begin`, and again after ``close``."""
    BEGUN = 1
    """Logging is set up and the rank is known."""
    STATE_FILE = 2
    """The timeouts file is named."""
    CONNECTED = 3
    """The client is initialised, with the saved timeouts restored."""
    CHECKED = 4
    """The monitor's configuration can watch this front end."""
    STOP_ARMED = 5
    """The graceful stop is decided (armed, or off)."""
    RUNNING = 6
    """Set up: the front end's run hooks act."""


class SessionOrderError(RuntimeError):
    """A session step was called out of its turn (a front end's bug, not the user's)."""


class FrontEndSession:
    """A front end's connection to its rank monitor, opened and closed in one order.

    See the module docstring for the steps. The attributes below are plain attributes, not
    properties, because the front ends' per-step hooks read them on every training step.

    Attributes:
        client: The connected client, from :meth:`connect` until :meth:`close`; else None.
        set_step: ``client.set_step`` while connected (an extension of the reference's client
            API; None for a client without it).
        graceful_stop: This run's :class:`~ft_core.client.graceful_stop.GracefulStop` from
            :meth:`arm_graceful_stop` until :meth:`close`; None when off.
        fault: The simulated fault armed in this run, if any, until :meth:`close`.
        collectives: How this run's ranks agree (from :meth:`begin` on).
        rank: This process's global rank (from :meth:`begin` on).

    Args:
        log: The front end's logger; its name is the logger :meth:`begin` and :meth:`connect`
            configure, and :meth:`begin` sets its rank.
        part: The state file's part this front end reads and writes
            (:data:`~ft_core.client.state_file.PART_HEARTBEATS` or ``PART_SECTIONS``).
    """

    def __init__(self, log: RankLoggerAdapter, part: str) -> None:
        self.log = log
        self.part = part
        self.phase = SessionPhase.IDLE
        self._clean_end = False
        self._stopped: Optional[GracefulStop] = None  # the graceful stop close() reports, if any
        self.client: Optional[RankMonitorClient] = None
        self.set_step: Optional[Callable[[int], None]] = None
        self.graceful_stop: Optional[GracefulStop] = None
        self.fault: Optional[SimulatedFault] = None
        self.collectives: Optional[Collectives] = None
        self.rank = 0
        self.state_file: Optional[StateFile] = None
        self._saved: Optional[Snapshot] = None  # the timeouts the state file holds (as far as we know)
        self._releases: list[tuple[str, Release]] = []  # what close() undoes, in order of acquisition

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """True from :meth:`begin` until :meth:`close`."""
        return self.phase is not SessionPhase.IDLE

    @property
    def state_file_path(self) -> Optional[str]:
        """Where calculated timeouts are loaded from and saved to (known from
        :meth:`use_state_file` on, and kept after ``close``)."""
        return None if self.state_file is None else self.state_file.path

    # ------------------------------------------------------------------ the steps, in order

    def begin(self, rank: int, collectives: Collectives) -> None:
        """Set up logging (INFO, on the console when nothing else is set up) and this rank."""
        self._require(SessionPhase.IDLE, "begin")
        configure_rank_logging(None, "ft_core", self.log.logger.name)
        self.log.set_rank(rank)
        self.rank = rank
        self.collectives = collectives
        self.phase = SessionPhase.BEGUN

    def use_state_file(self, path: str) -> StateFile:
        """Name this run's timeouts file (read by :meth:`connect`, written by :meth:`save_timeouts`)."""
        self._require(SessionPhase.BEGUN, "use_state_file")
        self.state_file = StateFile(path, self.part, self.log)
        self.phase = SessionPhase.STATE_FILE
        return self.state_file

    def connect(self, restore: bool) -> RankMonitorClient:
        """Create the client, restore the saved timeouts, initialise monitoring.

        With ``restore`` a collective (rank 0 reads the state file and broadcasts it). Then the
        monitor's ``log_level`` applies, and the step publisher is ready.

        Raises:
            RankMonitorClientError: Not started by ``ft_launcher``, or the monitor cannot be
                reached (the session stays in its phase; :meth:`close` it).
        """
        self._require(SessionPhase.STATE_FILE, "connect")
        client = RankMonitorClient()
        if restore:
            assert self.state_file is not None and self.collectives is not None
            self.state_file.restore(client, self.collectives)  # collective
        client.init_workload_monitoring()
        self.client = client
        self._hold("disconnect", self._disconnect)
        configure_rank_logging(client.cfg.log_level if client.cfg is not None else None, self.log.logger.name)
        self.set_step = getattr(client, "set_step", None)
        self._hold("step publisher", self._drop_step_publisher)
        self._saved = _snapshot(client)  # right after set-up: what the state file gave (or the config)
        self.phase = SessionPhase.CONNECTED
        return client

    def check_config(self, check: ConfigCheck) -> None:
        """Raise the ``ConfigError`` that ``check(client)`` returns: hang detection could not work."""
        self._require(SessionPhase.CONNECTED, "check_config")
        assert self.client is not None
        error = check(self.client)
        if error is not None:
            raise error
        self.phase = SessionPhase.CHECKED

    def arm_graceful_stop(self, config: Optional[GracefulStopConfig]) -> Optional[GracefulStop]:
        """Create the graceful stop of this run (None for ``config`` None); ``close`` uninstalls it.

        The front end installs its handlers (at once, or when its run starts).
        """
        self._require(SessionPhase.CHECKED, "arm_graceful_stop")
        if config is not None:
            self.graceful_stop = GracefulStop(config)
            self._hold("graceful stop", self._uninstall_graceful_stop)
        self.phase = SessionPhase.STOP_ARMED
        return self.graceful_stop

    def started(self, message: str, *args: object) -> None:
        """The set-up is complete: log ``message % args`` once (rank 0 at INFO)."""
        self._require(SessionPhase.STOP_ARMED, "started")
        self.phase = SessionPhase.RUNNING
        self.log.rank_zero_info(message, *args, stacklevel=3)  # the record names the front end

    # ------------------------------------------------------------------ while open

    def hold(self, name: str, release: Release) -> None:
        """Have :meth:`close` call ``release`` (in reverse order with the session's own)."""
        if not self.is_open:
            raise SessionOrderError(f"FrontEndSession.hold({name!r}): the session is not open")
        self._hold(name, release)

    def arm_fault(self, params: Union[SimulatedFaultParams, Mapping[str, Any]]) -> SimulatedFault:
        """Schedule a simulated fault (a collective), replacing this run's earlier one; ``close``
        cancels it.

        Raises:
            ValueError: Invalid parameters, or ``rank_to_fail`` outside the world.
        """
        if self.phase < SessionPhase.CHECKED:
            raise SessionOrderError(f"FrontEndSession.arm_fault() needs a checked connection, but the "
                                    f"session is {self.phase.name}")
        self.cancel_fault()
        if not any(name == "simulated fault" for name, _ in self._releases):
            self._hold("simulated fault", self._drop_fault)
        self.fault = setup_simulated_fault(params, collectives=self.collectives)  # collective
        return self.fault

    def cancel_fault(self) -> None:
        """Keep the simulated fault from firing (the run is ending first). Safe to repeat."""
        if self.fault is not None:
            self.fault.cancel()

    def save_timeouts(self) -> bool:
        """On rank 0, write the client's timeouts to the state file (the other ranks have the same).

        The file is written after every update (it follows the merged values); the "saved" line
        is INFO only when the timeouts changed significantly since the last one, else DEBUG.

        Returns:
            False when this rank (0) had timeouts to save and they were not saved (the state
            file said why, at set-up or now); True otherwise.
        """
        client, state_file = self.client, self.state_file
        if client is None:
            return True
        snapshot = _snapshot(client)
        if self.rank != 0:
            self._saved = snapshot
        elif state_file is not None:
            if not state_file.save(client.state_dict(), significant_change(self._saved, snapshot)):
                return False
            self._saved = snapshot
        return True

    # ------------------------------------------------------------------ tear-down

    def close(self, clean_end: bool = False) -> None:
        """Release everything the session holds, last acquired first; back to ``IDLE``.

        Every release runs even when one before it failed (that one is logged); never raises.
        Safe to call in any phase and more than once. Called while the rank is handling an
        exception (its run failed: a peer died, a collective broke), a release that fails is a
        consequence of that failure (e.g. Lightning's SIGTERM handler runs a collective to the
        dead peer inside it): one DEBUG line, no traceback; the rank's own error says what
        happened. Otherwise a failed release is an ERROR with its traceback.

        Args:
            clean_end: The run completed or stopped gracefully: stop signals that had their
                default action are absorbed from now on (:meth:`GracefulStop.uninstall`), so a
                signal that comes after the end cannot fail a finished rank, and the monitor is
                told (``shutdown_workload_monitoring(clean_end=True)``), so an abort at the
                process's exit does not either; after a graceful stop it is told the stop's
                step and signal too.
        """
        self._clean_end = clean_end
        stop = self.graceful_stop
        # Read before the releases: the graceful stop is released before the disconnect.
        self._stopped = stop if clean_end and stop is not None and stop.stop_step is not None else None
        releases, self._releases = self._releases, []
        self.phase = SessionPhase.IDLE
        unwinding = sys.exc_info()[1] is not None  # an error is ending the run
        for name, release in reversed(releases):
            try:
                release()
            except Exception as err:  # the next releases (the disconnect last) must still run
                if unwinding:
                    self.log.debug("fault tolerance: releasing the %s after the run's error failed too: %s",
                                   name, _first_line(err))
                else:
                    self.log.exception("fault tolerance: releasing the %s failed", name)

    @contextlib.contextmanager
    def opening(self) -> Iterator[FrontEndSession]:
        """The set-up block: when it raises, :meth:`close` the session, then re-raise."""
        try:
            yield self
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ internals

    def _require(self, phase: SessionPhase, step: str) -> None:
        """Each step moves the session on from one phase only: the phase it follows."""
        if self.phase is not phase:
            raise SessionOrderError(f"FrontEndSession.{step}() comes after the {phase.name} phase, but the session "
                                    f"is {self.phase.name}")

    def _hold(self, name: str, release: Release) -> None:
        self._releases.append((name, release))

    def _disconnect(self) -> None:
        """Shut the client down; a failure is one ERROR line, never an exception."""
        client, self.client = self.client, None
        if client is None:
            return
        try:
            # A clean end is the monitor's (and the launcher's) to know: an abort in the teardown
            # that follows is then no reason to restart a finished job.
            stop = self._stopped
            if stop is None:
                client.shutdown_workload_monitoring(clean_end=self._clean_end)
            else:  # the launcher records every rank's stop step (docs/launcher.md, graceful_stop)
                client.shutdown_workload_monitoring(
                    clean_end=self._clean_end, stop_step=stop.named_step, stop_run_steps=stop.stop_step,
                    stop_signal=stop.stop_signal.name if stop.stop_signal is not None else None)
        except (OSError, RankMonitorClientError) as err:
            self.log.error("fault tolerance: disconnecting from the monitor failed: %s", err)

    def _drop_step_publisher(self) -> None:
        self.set_step = None

    def _drop_fault(self) -> None:
        fault, self.fault = self.fault, None
        if fault is not None:
            fault.cancel()

    def _uninstall_graceful_stop(self) -> None:
        stop, self.graceful_stop = self.graceful_stop, None
        if stop is not None:
            stop.uninstall(absorb=self._clean_end)


def _first_line(err: BaseException, limit: int = 200) -> str:
    """``Type: message`` of ``err``, its message's first line, at most ``limit`` characters."""
    text = f"{type(err).__name__}: {str(err).strip().partition(chr(10))[0]}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def session_attribute(name: str, doc: str) -> Any:
    """A read-only property of a front end that shows its session's attribute ``name``.

    For a front end that holds its :class:`FrontEndSession` in ``_session``.
    """
    return property(operator.attrgetter(f"_session.{name}"), doc=doc)


def _snapshot(client: RankMonitorClient) -> Snapshot:
    both = {f"heartbeat {k}": v for k, v in heartbeat_snapshot(client.hb_timeouts).items()}
    both.update({f"section {k}": v for k, v in section_snapshot(client.section_timeouts).items()})
    return both
