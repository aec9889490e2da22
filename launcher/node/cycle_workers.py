"""This cycle's workers as the launcher sees them: exits, monitor reports, evidence, clean ends.

:class:`CycleWorkers` is the agent's collaborator for watching one cycle's workers between
torch's polls: it reads the monitors' reports (hangs, escalations, finished training, connects,
a monitor lost), the workers' exit statuses without reaping them, gathers the evidence when the
first worker fails and stops the survivors fast (:class:`launcher.decision.incident.CycleWatch`
keeps what it learns), holds torch's poll while hung workers are still in their monitors' hands
or while a worker that finished cleanly waits for the others, and corrects torch's result (a
worker that aborted at exit after a clean end is no failure; a hang fails the cycle whatever the
exit status). It is reset at every cycle start.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

from ft_core.wire import messages
from ft_core.wire.config import FaultToleranceConfig
from launcher.clean_end import AT_EXIT_SIGNAL, CleanEnds
from launcher.decision.incident import CycleWatch, about_an_earlier_worker
from launcher.events.log import EventLog
from launcher.events.records import (
    AbortedAtExit,
    GracefulStopped,
    MonitorDied,
    MonitorReplaced,
    MonitorUnresponsive,
    RankEscalated,
    Resumed,
    SignalForwarded,
    WorkersReady,
)
from launcher.node import processes
from launcher.node.monitors import UNRESPONSIVE, MonitorPool
from launcher.node.survivor_save import SurvivorSave

logger = logging.getLogger(__name__)


class CycleWorkers:
    """One cycle's workers (see the module docstring).

    Args:
        monitors: The node's rank monitors.
        workers: The node's worker table.
        events: Where the records go.
        ft_cfg: The config (stack capture budget, termination grace and signal).
        workers_stop_timeout: ``--workers-stop-timeout``: after a worker failed, seconds from
            SIGTERM to SIGKILL for the surviving workers.
        on_ready: Called once every worker of the cycle connected to its monitor.
    """

    def __init__(self, monitors: MonitorPool, workers: processes.WorkerProcesses, events: EventLog,
                 ft_cfg: FaultToleranceConfig, workers_stop_timeout: float, on_ready: Callable[[], None]) -> None:
        self._monitors = monitors
        self._workers = workers
        self._events = events
        self._ft_cfg = ft_cfg
        self._workers_stop_timeout = workers_stop_timeout
        self._on_ready = on_ready
        self._survivor_save = SurvivorSave(monitors, events, ft_cfg)
        self.cycle = -1
        self.watch = CycleWatch()
        """This cycle's hangs, exits and evidence."""
        self.pids: dict[int, int] = {}
        """Local rank -> worker pid, as torch started it."""
        self.awaiting_ready: set[int] = set()
        """Local ranks not connected to their monitor yet."""
        self.stopped_by_us: set[int] = set()
        """This cycle's survivors the launcher stopped after a failure."""
        self._began = time.monotonic()
        self._clean_ends = CleanEnds()  # this cycle's workers that ended their training cleanly
        self._graceful_stops: dict[int, GracefulStopped] = {}  # this cycle's, by local rank

    def reset(self, cycle: int, began: float) -> None:
        """Before ``cycle``'s workers start (``began``: monotonic, when its start or restart
        began): replace the monitors that died or do not answer, forget the last cycle."""
        self.cycle, self._began = cycle, began
        # Liveness probe: a monitor that died or does not answer (stopped) is replaced before
        # this cycle's workers connect to it.
        for replaced in self._monitors.replace_dead():
            if replaced.reason == UNRESPONSIVE:
                logger.error("the rank monitor of local rank %s (pid %s) did not answer a ping; killed and "
                             "replaced it", replaced.local_rank, replaced.pid)
                self._events.record_event(MonitorUnresponsive(cycle=cycle, local_rank=replaced.local_rank,
                                                              monitor_pid=replaced.pid))
            else:
                logger.warning("replaced the rank monitor of local rank %s (it had exited with %s)",
                               replaced.local_rank, replaced.exit_code)
            self._events.record_event(MonitorReplaced(cycle=cycle, local_rank=replaced.local_rank,
                                                      exit_code=replaced.exit_code, reason=replaced.reason))
        self.watch.reset()
        self.stopped_by_us.clear()
        self._clean_ends.reset()
        self._graceful_stops.clear()

    def started(self, pids: dict[int, int]) -> None:
        """torch started the cycle's workers: local rank -> pid."""
        self.pids = dict(pids)
        self.awaiting_ready = set(pids)

    def graceful_stops(self) -> list[GracefulStopped]:
        """The cycle's workers that left their training in a graceful stop, by local rank.

        Reads the monitors' reports that came in meanwhile first (a stop by signal ends the run
        before the agent's loop read them); only the ``rank_finished`` reports are taken then:
        the run is over, nothing else of it is acted on.
        """
        for local_rank, event in self._monitors.poll_events():
            if isinstance(event, messages.RankFinished):
                self._on_event(local_rank, event)
        return [self._graceful_stops[rank] for rank in sorted(self._graceful_stops)]

    def holds_torchs_poll(self) -> bool:
        """Read the reports and statuses; on a first failure gather the evidence and stop the
        survivors. True when torch's poll must not run now: hung workers are still in their
        monitors' hands, or a worker that ended its training cleanly waits for the others (torch
        would stop them)."""
        self.poll_events()
        statuses = self.statuses()
        self.watch.observe(statuses)
        if self.watch.failed(statuses) and not self.watch.evidence_taken:
            self._handle_first_failure(statuses)
            statuses = self.statuses()
            self.watch.observe(statuses)
        hung = [r for r in self.watch.hung_still_running(statuses) if processes.running_child(self.pids[r])]
        if hung:
            # Their monitors signalled them (and SIGKILL them after rank_termination_grace);
            # torch's poll must not SIGTERM them meanwhile. The launcher kills them only if
            # they outlive that.
            if not self.watch.hung_overdue():
                return True
            self._workers.terminate([self.pids[r] for r in hung], 0.0, signal.SIGKILL)
        return self._clean_ends.others_still_running(self._raw_statuses())

    def corrected(self, worker_group: Any, result: RunResult) -> RunResult:
        """torch's result with what the launcher knows better: aborts at exit after a clean end
        are no failures; a hang fails the cycle whatever the hung worker's exit status."""
        if result.state == WorkerState.FAILED and result.failures:
            result = self._excuse_aborts_at_exit(worker_group, result)
        # Monitors report a hang before they signal the rank, so every hang behind a death
        # seen above is in these events.
        self.poll_events()
        return self._hangs_fail_the_cycle(worker_group, result)

    def training_ended(self) -> bool:
        """Whether a worker of this cycle said that its training ended cleanly (reports read first)."""
        self.poll_events()
        return self._clean_ends.any_finished()

    def statuses(self) -> dict[int, int | None]:
        """Exit status by local rank (None while running), without reaping; a worker that
        finished its training and then aborted at exit counts as exited 0."""
        return self._clean_ends.as_exited_zero(self._raw_statuses())

    def _raw_statuses(self) -> dict[int, int | None]:
        by_pid = self._workers.exit_statuses()
        statuses = {local_rank: by_pid.get(pid) for local_rank, pid in self.pids.items()}
        if any(status == -AT_EXIT_SIGNAL for status in statuses.values()):
            # Its monitor's rank_finished was sent before the worker could exit: read it now.
            self.poll_events()
        return statuses

    def _excuse_aborts_at_exit(self, worker_group: Any, result: RunResult) -> RunResult:
        """Take the workers that finished their training, then aborted at exit, out of torch's
        failures (recorded as ``aborted_at_exit``); none left: the cycle succeeded."""
        remaining, aborted = self._clean_ends.split(result.failures)
        for failure in aborted:
            pid = self._workers.worker_pid(failure.pid)
            rank = next((w.global_rank for w in worker_group.workers if w.local_rank == failure.local_rank), None)
            logger.warning("cycle %s: rank %s (local rank %s, pid %s) finished its training, then aborted at exit "
                           "(%s): not a failure, not restarted", self.cycle, rank, failure.local_rank, pid,
                           AT_EXIT_SIGNAL.name)
            self._events.record_event(AbortedAtExit(cycle=self.cycle, local_rank=failure.local_rank, rank=rank,
                                                    worker_pid=pid, signal=AT_EXIT_SIGNAL.name))
        if not aborted:
            return result
        if remaining:
            return RunResult(state=WorkerState.FAILED, failures=remaining)
        return RunResult(state=WorkerState.SUCCEEDED, return_values={w.global_rank: None for w in worker_group.workers})

    def _handle_first_failure(self, statuses: dict[int, int | None]) -> None:
        """A worker crashed or hung: take the evidence from the monitors, let one survivor save its
        just-in-time state (:mod:`launcher.node.survivor_save`), then stop the others.

        torch would SIGTERM the others and wait 30 s for them; a worker whose peer died is often
        stuck in a collective (or in a SIGTERM handler that runs one), so they get a short grace
        and then SIGKILL, for a fast restart. They are remembered, so their deaths are recorded
        as consequences, not causes. Hung workers are left to their monitors.
        """
        running = [local_rank for local_rank, status in statuses.items() if status is None]
        self.watch.gather_evidence(self._monitors, sorted(self.pids), running,
                                   self._ft_cfg.stack_capture_budget or 0.0)
        self.poll_events()  # hangs reported while we asked
        # Before anyone is stopped: one survivor saves the state of its last completed step.
        self._survivor_save.run(self.cycle, [r for r, status in self.statuses().items() if status is None],
                                self.watch.reports)
        survivors = [self.pids[r] for r in running if r not in self.watch.hangs]
        self.stopped_by_us.update(survivors)
        self._workers.terminate(survivors, self._workers_stop_timeout)

    def save_before_restart(self) -> bool:
        """torch restarts this node's workers for another node (it failed, or a node joined): one
        survivor saves its just-in-time state first, as after a failure here (the workers of a
        node whose peer failed are blocked in a collective, holding the state of their last step).
        True if a state of this cycle is saved."""
        running = [r for r, status in self.statuses().items() if status is None]
        return self._survivor_save.run(self.cycle, running, self.watch.reports)

    def _hangs_fail_the_cycle(self, worker_group: Any, result: RunResult) -> RunResult:
        """A detected hang fails the cycle whatever the hung worker's exit status (a SIGTERM
        handler may exit 0): add the hung workers torch saw succeed."""
        if not self.watch.hangs or result.state == WorkerState.UNHEALTHY:
            return result
        self.watch.observe(self.statuses())
        failures = dict(result.failures) if result.state == WorkerState.FAILED else {}
        added = self.watch.hung_failures(self.pids, {w.local_rank: w.global_rank for w in worker_group.workers},
                                         failures)
        if not added:
            return result
        return RunResult(state=WorkerState.FAILED, failures={**failures, **added})

    def poll_events(self) -> None:
        """Act on every report the monitors sent since the last call."""
        for local_rank, event in self._monitors.poll_events():
            self._on_event(local_rank, event)

    def _on_event(self, local_rank: int, event: messages.Message) -> None:
        if (isinstance(event, (messages.RankHang, messages.RankEscalatedMessage))
                and about_an_earlier_worker(event, self._workers.worker_pids.get(local_rank))):
            logger.info("cycle %s: ignored a late %s report of local rank %s about pid %s, a worker of an "
                        "earlier cycle (the current one is pid %s)", self.cycle, event.TYPE, local_rank, event.pid,
                        self._workers.worker_pids.get(local_rank))
            return
        if isinstance(event, messages.RankHang):
            # Keyed by local rank: with warm starts torch knows the trampoline's pid, the
            # monitor the forked worker's.
            self.watch.on_hang(local_rank, event, self._ft_cfg.rank_termination_grace or 0.0)
        elif isinstance(event, messages.RankEscalatedMessage):
            logger.error("rank %s (local rank %s, pid %s) outlived %s by %.1f s; its monitor sent SIGKILL",
                         event.rank, local_rank, event.pid,
                         self._ft_cfg.rank_termination_signal.name, event.after or 0.0)
            self._events.record_event(RankEscalated(cycle=self.cycle, local_rank=local_rank, rank=event.rank,
                                                    worker_pid=event.pid, signal=event.signal, after=event.after))
        elif isinstance(event, messages.RankFinished):
            if event.pid in (self.pids.get(local_rank), self._workers.worker_pids.get(local_rank)):
                self._clean_ends.finished(local_rank, event.pid)
                if event.stop_step is not None:
                    self._graceful_stops[local_rank] = self._events.record_event(GracefulStopped(
                        cycle=self.cycle, local_rank=local_rank, rank=event.rank, worker_pid=event.pid,
                        step=event.stop_step, run_steps=event.stop_run_steps, signal=event.stop_signal))
        elif isinstance(event, messages.RankResumed):
            self._events.record_event(Resumed(cycle=self.cycle, rank=event.rank, local_rank=local_rank,
                                              worker_pid=event.pid, step=event.step, source=event.source))
        elif isinstance(event, messages.RankConnected) and local_rank not in self.awaiting_ready:
            self._clean_ends.reconnected(local_rank)  # training again (a second fit)
        elif isinstance(event, messages.RankConnected):
            pid, delivered = self._workers.connected(local_rank)
            self.record_queued_delivery(pid, delivered)
            self.awaiting_ready.discard(local_rank)
            if not self.awaiting_ready:
                self._on_ready()
                ready_s = time.monotonic() - self._began
                self._events.record_event(WorkersReady(cycle=self.cycle, ready_s=round(ready_s, 4)))
        elif isinstance(event, messages.MonitorLost):
            logger.error(
                "the rank monitor of local rank %s exited (code %s); that rank is not watched "
                "until the next cycle, when the monitor is replaced", local_rank, event.exit_code,
            )
            self._events.record_event(MonitorDied(cycle=self.cycle, local_rank=local_rank,
                                                  exit_code=event.exit_code))

    def record_queued_delivery(self, pid: int | None, delivered: list[signal.Signals]) -> None:
        """Log and record the queued signals delivered to worker ``pid``."""
        for sig in delivered:
            logger.info("delivered the queued %s to worker pid %s", sig.name, pid)
            self._events.record_event(SignalForwarded(cycle=self.cycle, signal=sig.name, worker_pids=[pid],
                                                      queued=True))
