"""Stopping a node's workers for torch's stop hooks: ``--term-timeout`` to the fraction of a second.

:class:`WorkerStop` carries out what the agent's ``_stop_workers`` and ``_shutdown`` hooks ask:
the signal and grace of a stop between cycles (SIGKILL at once for a node that leaves the job),
the launcher's signal handlers re-asserted over torch's, the stop signal not sent again to
workers that got it themselves (a job-wide signal, see :mod:`launcher.node.signals`), the wait to
the fraction of a second (:meth:`launcher.node.processes.WorkerProcesses.terminate`), then torch's
own ``_shutdown`` (which finds the workers gone and only releases its resources), and last what
the workers left behind killed (their process groups, orphans re-parented to the launcher).

:class:`StopSettings` is what the launcher decided about stopping workers (its options and its
signal handling), handed to the agent as one value.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from launcher.events.log import EventLog
from launcher.events.records import LeftoversKilled
from launcher.node import processes
from launcher.node.monitors import MonitorPool
from launcher.torch_compat import torch_shutdown_kwargs
from launcher.warm.cold import StartCoordinator

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopSettings:
    """How the launcher stops its workers.

    Attributes:
        term_timeout: ``--term-timeout``: seconds from SIGTERM to SIGKILL whenever workers are
            stopped by torch's loop or a signal to the launcher (fractions kept).
        workers_stop_timeout: ``--workers-stop-timeout``: after a worker failed, seconds from
            SIGTERM to SIGKILL for the surviving workers.
        reassert_signal_handlers: Called after each worker start and before each stop (the
            launcher re-asserts its signal handlers there, since torch installs its own).
        stop_signal_delivered: ``f(sig)``: True when the launcher is stopping because of
            ``sig`` and the workers got it themselves (a job-wide signal); the stop then does
            not send it again (see :mod:`launcher.node.signals`).
        helper_pids: Processes of the launcher that are not leftovers of workers (the sentinel);
            read each time leftovers are killed (the run's ``HelperPids`` gives the pids of then).
        stop_signal: ``f()``: the stop signal the launcher received, None before one (the agent
            then tells the other nodes that this node leaves before it stops its workers).
    """

    term_timeout: float
    workers_stop_timeout: float
    reassert_signal_handlers: Callable[[], None] | None = None
    stop_signal_delivered: Callable[[signal.Signals], bool] | None = None
    helper_pids: Collection[int] = ()
    stop_signal: Callable[[], signal.Signals | None] | None = None


class WorkerStop:
    """The stops of one node's workers (see the module docstring).

    Args:
        settings: How workers are stopped.
        workers: The node's worker table.
        monitors: The node's rank monitors (never leftovers).
        starts: The start coordinator (its warm template is never a leftover).
        events: Where the ``leftovers_killed`` records go.
    """

    def __init__(self, settings: StopSettings, workers: processes.WorkerProcesses, monitors: MonitorPool,
                 starts: StartCoordinator, events: EventLog) -> None:
        self.settings = settings
        self._workers = workers
        self._monitors = monitors
        self._starts = starts
        self._events = events

    def reassert_signal_handlers(self) -> None:
        """Re-assert the launcher's signal handlers (torch installs its own when it starts workers)."""
        if self.settings.reassert_signal_handlers is not None:
            self.settings.reassert_signal_handlers()

    def between_cycles(self, leaving: bool) -> tuple[signal.Signals, float]:
        """The signal and the grace of a stop by torch's loop (``_stop_workers``): SIGTERM and
        ``--term-timeout``, or SIGKILL at once when this node is ``leaving`` the job."""
        if not leaving:
            return signal.SIGTERM, self.settings.term_timeout
        # This node leaves and the others go on: its ranks must take part in no further
        # collective. A SIGTERM would let a rank's graceful-stop handler (ours, Lightning's)
        # propose a stop that every rank agrees to, ending the whole job "successfully" (seen
        # on the cluster with the straggler replace action). SIGKILL makes the peers'
        # collectives fail at once, so they restart, with a spare in this node's place.
        logger.info("this node leaves the job: its workers are stopped with SIGKILL (no graceful stop)")
        return signal.SIGKILL, 0.0

    def stop(self, torch_shutdown: Callable[..., Any], death_sig: signal.Signals, timeout: float | None,
             cycle: int) -> bool:
        """Stop the workers: ``death_sig`` to their process groups, SIGKILL after ``timeout`` s.

        torch's own stop path takes whole seconds, so the wait is ours (exact to the fraction);
        ``torch_shutdown`` (torch's ``_shutdown``) then finds the workers gone and only releases
        its resources (given the timeout rounded up, in case a worker started after our pid
        list). When the workers got ``death_sig`` themselves (sent to the whole job), it is not
        sent again: they only get their ``timeout``, warm and cold alike. Last, what the workers
        left behind is killed (recorded for ``cycle``).

        Args:
            torch_shutdown: torch's ``LocalElasticAgent._shutdown`` of the agent.
            death_sig: The stop signal (the signal to the launcher, when one stops it).
            timeout: Seconds from ``death_sig`` to SIGKILL; None (torch < 2.12 calls the hook
                without one) means ``--term-timeout``.
            cycle: The cycle whose workers stop.

        Returns:
            Whether every worker exited 0 within the timeout (True if none ran).
        """
        if timeout is None:
            timeout = self.settings.term_timeout
        self.reassert_signal_handlers()  # torch's own handlers would raise on a second signal
        delivered = self.settings.stop_signal_delivered is not None and self.settings.stop_signal_delivered(death_sig)
        killed = self._workers.terminate(self._workers.pids, timeout, death_sig, already_signalled=delivered)
        statuses = self._workers.exit_statuses()
        stopped_cleanly = not killed and all(status == 0 for status in statuses.values())
        torch_shutdown(death_sig, **torch_shutdown_kwargs(timeout))
        self._workers.close()
        self._reap_leftovers(cycle)
        return stopped_cleanly

    def _reap_leftovers(self, cycle: int) -> None:
        """Kill what workers left behind: their process groups and re-parented orphans."""
        killed = processes.kill_leftovers(worker_pids=self._workers.all_pids, keep=set(self._monitors.pids()),
                                          keep_alone={self._starts.pid, *self.settings.helper_pids} - {None})
        if killed:
            logger.warning("killed %s process(es) left behind by workers: %s", len(killed), sorted(killed))
            self._events.record_event(LeftoversKilled(cycle=cycle, pids=sorted(killed)))
