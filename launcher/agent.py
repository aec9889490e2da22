"""``FaultTolerantAgent``: torch's ``LocalElasticAgent`` plus rank monitors and failure causes.

The agent reuses torch's template (rendezvous, start, monitor, restart, exit barrier) and only
overrides its hooks; each hook calls into a unit that owns one concern:

- ``_rendezvous``: timing; the round's store for the cross-node channel, this node's name in it
  (:mod:`launcher.rendezvous.store_channel`).
- ``_start_workers``: dead or unresponsive monitors replaced, template readiness, monitors told
  the worker pids, ``cycle_start`` (:mod:`launcher.node.monitors`, :mod:`launcher.warm.coordinator`).
- ``_setup_local_watchdog``: per-rank environment (monitor / control / template sockets, cycle).
- ``_monitor_workers``: wait for activity; evidence (progress, stacks) then fast stop of
  survivors; hang causes (a hang fails the cycle whatever the exit status); root and collateral
  across nodes; control requests; ShutdownWorkload from other nodes; restart policy
  (:mod:`launcher.decision.incident`, :mod:`launcher.decision.failures`, :mod:`launcher.decision.culprit`,
  :mod:`launcher.decision.restart_policy`, :mod:`launcher.node.control_server`).
- ``_restart_workers``: "another node restarted" record.
- ``_stop_workers`` / ``_shutdown``: ``--term-timeout`` to the fraction of a second; what workers
  left behind (:mod:`launcher.node.processes`).

What the agent is doing is one explicit phase (:class:`launcher.agent_phase.AgentPhase`: idle,
starting, running, failed, waiting, succeeded, shutdown, excluded), changed only through
:meth:`FaultTolerantAgent._enter`, which checks the transition. How workers start is a start
coordinator's business (:mod:`launcher.warm.coordinator` or :mod:`launcher.warm.cold`).

Its public surface for :mod:`launcher.launch`: :attr:`cycle`, :attr:`phase`,
:attr:`worker_pids`, :attr:`stopped_cleanly`, :meth:`forward_signal`,
:meth:`wait_for_shutdown_acks`. Nothing else reads
torch's or the agent's private attributes; ``tests/unit/test_torch_hooks.py`` checks every hook
signature and private torch attribute used here against the installed torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import signal
import time
from collections.abc import Callable, Collection
from typing import Any

from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousGracefulExitError

from ft_core.wire import messages
from ft_core.wire.config import FaultToleranceConfig, Role
from ft_core.wire.data import WorkloadAction
from ft_core.wire.env import (
    FT_CYCLE_ENV_VAR,
    FT_LAUNCHER_IPC_SOCKET_ENV_VAR,
    FT_RANK_CONFIG_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)
from launcher.agent_phase import AgentPhase
from launcher.clean_end import AT_EXIT_SIGNAL, CleanEnds
from launcher.decision import culprit
from launcher.decision.crash_loop import CrashLoopGuard, CycleFailure, Fingerprint
from launcher.decision.culprit import ROOT, LostNode, RankState
from launcher.decision.failures import (
    KIND_TERMINATED,
    Exchanged,
    FailureRecord,
    failure_records,
    group_unhealthy_record,
)
from launcher.decision.incident import CycleWatch, about_an_earlier_worker
from launcher.decision.restart_policy import (
    OUTCOME_EXCLUDED,
    OUTCOME_SHUTDOWN,
    WAIT,
    RestartPolicy,
    outcome_decision,
)
from launcher.events.log import EventLog
from launcher.events.records import (
    AbortedAtExit,
    ControlRequest,
    CycleStart,
    GracefulStopped,
    LeftoversKilled,
    MinHealthyRestart,
    MonitorDied,
    MonitorReplaced,
    MonitorUnresponsive,
    NodeCheck,
    RankEscalated,
    Restart,
    SignalForwarded,
    SignalReceived,
    Straggler,
    WorkersReady,
    WorkersSucceeded,
)
from launcher.node import check as node_check
from launcher.node import processes
from launcher.node.control_server import ControlServer, ReceivedStragglerReport
from launcher.node.monitors import UNRESPONSIVE, MonitorPool
from launcher.rendezvous import store_counter
from launcher.rendezvous.store_channel import StoreChannel
from launcher.torch_compat import agent_shutdown_kwargs, torch_shutdown_kwargs
from launcher.warm.cold import StartCoordinator

logger = logging.getLogger(__name__)

TORCH_PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"
TORCH_PID_LINES = {  # torch's message -> index of its pid argument (checked by test_torch_hooks)
    "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s": 2,
    "Sending process %s closing signal %s": 0,
}
_FAILED_STATES = (WorkerState.FAILED, WorkerState.UNHEALTHY)
_OUTCOMES = {AgentPhase.SHUTDOWN: OUTCOME_SHUTDOWN, AgentPhase.EXCLUDED: OUTCOME_EXCLUDED}


class _WrongRankLineFilter(logging.Filter):
    """Drops torch's "failed (exitcode: ...) local_rank: N" line.

    torch names the failure with the earliest timestamp, which has a resolution of a second and
    often names a collateral rank; our own failure line names the root and says why.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("failed (exitcode"))


_wrong_rank_filter = _WrongRankLineFilter()


class FaultTolerantAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` whose workers are watched by rank monitors.

    Args:
        spec, logs_specs, start_method, log_line_prefix_template: As for ``LocalElasticAgent``
            (``spec`` as the start coordinator adopted it).
        ft_cfg: The fault tolerance config (the monitors enforce it; the agent reads the
            termination grace and signal, the stack budget, and what ranks get of it).
        monitors: The node's started :class:`MonitorPool`.
        control: The launcher's :class:`ControlServer`.
        events: Where failure lines and records go.
        restart_policy: What a failure leads to.
        term_timeout: Seconds from SIGTERM to SIGKILL whenever workers are stopped by torch's
            loop or a signal to the launcher (fractions kept, see :meth:`_shutdown`).
        reassert_signal_handlers: Called after each worker start and before each stop (the
            launcher re-asserts its signal handlers there, since torch installs its own).
        stop_signal_delivered: ``f(sig)``: True when the launcher is stopping because of
            ``sig`` and the workers got it themselves (a job-wide signal); the stop then does
            not send it again (see :mod:`launcher.node.signals`).
        starts: How workers start: the node's warm template coordinator (workers forked from
            the template, see :mod:`launcher.warm.coordinator`) or ``ColdStart`` (as torchrun).
        workers_stop_timeout: ``--workers-stop-timeout``: after a worker failed, seconds from
            SIGTERM to SIGKILL for the surviving workers.
        workers: The node's worker table (shared with the launcher's signal dispatcher, which
            routes signals to the workers through :meth:`forward_signal` from its own thread).
        helper_pids: Processes of the launcher that are not leftovers of workers (the sentinel).
    """

    def __init__(
        self,
        spec: Any,
        logs_specs: Any,
        *,
        ft_cfg: FaultToleranceConfig,
        monitors: MonitorPool,
        control: ControlServer,
        events: EventLog,
        restart_policy: RestartPolicy,
        starts: StartCoordinator,
        workers: processes.WorkerProcesses,
        workers_stop_timeout: float,
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
        term_timeout: float = 30.0,
        reassert_signal_handlers: Callable[[], None] | None = None,
        stop_signal_delivered: Callable[[signal.Signals], bool] | None = None,
        helper_pids: Collection[int] = (),
    ) -> None:
        self._workers_stop_timeout = workers_stop_timeout
        self._starts = starts
        self._ft_cfg = ft_cfg
        # torch's loop sleeps monitor_interval before each _monitor_workers call; we make that
        # sleep negligible and instead wait in _monitor_workers for the first of: a worker
        # exit (pidfd), a monitor report, a control request, or the interval.
        self._poll_interval = spec.monitor_interval
        spec.monitor_interval = 0.001
        # torch passes shutdown_timeout back only as _shutdown(timeout=...), which is ours: a
        # fractional --term-timeout arrives there intact (test_torch_hooks checks). torch < 2.12
        # takes none: _shutdown then gets no timeout and uses --term-timeout (launcher.torch_compat).
        super().__init__(spec=spec, logs_specs=logs_specs, start_method=start_method,
                         log_line_prefix_template=log_line_prefix_template, **agent_shutdown_kwargs(term_timeout))
        self._term_timeout = term_timeout
        self._monitors = monitors
        self._reassert_signal_handlers = reassert_signal_handlers
        self._stop_signal_delivered = stop_signal_delivered
        self._helper_pids = set(helper_pids)
        self._control = control
        self._events = events
        self._policy = restart_policy
        self._crash_loop = CrashLoopGuard(ft_cfg.max_no_progress_cycles, ft_cfg.min_progress_iterations)
        self._node_check = node_check.NodeCheckSettings(
            dirs=node_check.default_dirs() if ft_cfg.node_check_dirs is None else ft_cfg.node_check_dirs,
            min_free_mb=ft_cfg.node_check_min_free_mb, max_write_seconds=ft_cfg.node_check_max_write_seconds,
            command=ft_cfg.node_health_check_cmd, command_timeout=ft_cfg.node_health_check_timeout)
        self._said_skipped: set[str] = set()
        self.last_fingerprint: Fingerprint | None = None
        """The root failure of the latest failed cycle (for the result file), None before one."""
        self._channel = StoreChannel()
        self.cycle = -1
        """Index of the latest cycle (-1 before the first start)."""
        self._phase = AgentPhase.IDLE
        self._cycle_began = time.monotonic()  # the latest start or restart began, for the timings
        self._last_failure_at: float | None = None
        self._rendezvous_s: float | None = None
        self._watch = CycleWatch()  # this cycle's hangs, exits and evidence
        self._pids: dict[int, int] = {}  # local rank -> worker pid (as torch started it)
        self._workers = workers
        logging.getLogger(TORCH_PROCESS_LOGGER).addFilter(_WorkerPidLogFilter(self._workers))
        logging.getLogger(TORCH_PROCESS_LOGGER).addFilter(_wrong_rank_filter)
        self._awaiting_ready: set[int] = set()  # local ranks not connected to their monitor yet
        self._stopped_by_us: set[int] = set()  # this cycle's survivors we stopped after a failure
        self._clean_ends = CleanEnds()  # this cycle's workers that ended their training cleanly
        self._graceful_stops: dict[int, GracefulStopped] = {}  # this cycle's, by local rank
        self._outcome_cause = ""  # who asked for SHUTDOWN or EXCLUDED and why, for the stop line
        self.stopped_cleanly = True
        """After the last stop: every worker exited 0 within the timeout (True if none ran)."""
        self._ended_as_spare = False  # the rendezvous closed while this node waited for a place

    # ------------------------------------------------------------------ public surface

    def graceful_stops(self) -> list[GracefulStopped]:
        """The current cycle's workers that left their training in a graceful stop, by local rank.

        Reads the monitors' reports that came in meanwhile first (a stop by signal ends the run
        before the agent's loop read them); only the ``rank_finished`` reports are taken then:
        the run is over, nothing else of it is acted on.
        """
        for local_rank, event in self._monitors.poll_events():
            if isinstance(event, messages.RankFinished):
                self._on_monitor_event(local_rank, event)
        return [self._graceful_stops[rank] for rank in sorted(self._graceful_stops)]

    @property
    def phase(self) -> AgentPhase:
        """What the agent is doing (SHUTDOWN or EXCLUDED once a control request decided the run)."""
        return self._phase

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the latest cycle's workers: as torch started them and, under warm restarts,
        the forked workers' own."""
        return sorted({*self._workers.pids, *self._workers.worker_pids.values()})

    def forward_signal(self, sig: signal.Signals, job_wide: bool = False, received_at: float | None = None) -> None:
        """Pass ``sig`` (e.g. SLURM's SIGUSR1 warning) on to the workers that need it from us.

        Thread-safe (the launcher's signal dispatcher calls it). Workers that got it themselves
        (``job_wide``) get nothing; ranks without a worker ready for it when it was received
        (``received_at``, monotonic), a worker a restart started since included, get it queued
        (see :meth:`launcher.node.processes.WorkerProcesses.route`).
        """
        sent, queued = self._workers.route(sig, job_wide, received_at)
        self._events.record_event(SignalReceived(cycle=self.cycle, signal=sig.name, job_wide=job_wide,
                                                 queued_for_local_ranks=queued))
        if sent:
            self._events.record_event(SignalForwarded(cycle=self.cycle, signal=sig.name, worker_pids=sorted(sent),
                                                      queued=False))
        if queued:
            logger.info("%s queued for local rank(s) %s: delivered when their next worker connects",
                        sig.name, queued)

    def wait_for_shutdown_acks(self, timeout: float) -> bool:
        """After a ShutdownWorkload requested here: wait (bounded) until every other node saw it."""
        nodes = self.get_worker_group().group_world_size
        if nodes in (None, 1):
            return True
        return self._channel.wait_for_acks(nodes - 1, timeout)

    def _enter(self, phase: AgentPhase) -> None:
        """Change the phase: the only place that does (``AgentPhase.check`` refuses a transition
        the agent cannot make)."""
        if phase is not self._phase:
            logger.debug("agent: %s -> %s", self._phase.name, phase.name)
        self._phase = self._phase.check(phase)

    # ------------------------------------------------------------------ starting

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """torch's ``run``; ends SUCCEEDED (exit 0) when the job ended while this node waited as a
        spare (see :meth:`_rendezvous`), where torch's returns nothing (the launcher's exit 1)."""
        result = super().run(role)
        if result is None and self._ended_as_spare:
            return RunResult(state=WorkerState.SUCCEEDED)
        return result

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        self._check_node()
        started = time.monotonic()
        try:
            with self._starts.rendezvous_wait(self.cycle + 1):
                super()._rendezvous(worker_group)
        except (RendezvousClosedError, RendezvousGracefulExitError):
            # The job ended (its rendezvous closed) while this node waited for a place: a spare, or
            # a healthy node that lost the race for a slot in a restart. Nothing of it failed, as in
            # the reference (its spares exit 0). A node here after its own failure still fails.
            if self._phase in (AgentPhase.FAILED, AgentPhase.WAITING):
                raise
            self._ended_as_spare = True
            logger.info("the job ended while this node waited as a spare (the rendezvous is closed); "
                        "no worker of this node was needed: exit 0")
            raise RendezvousGracefulExitError("the rendezvous closed while this node waited as a spare") from None
        self._rendezvous_s = time.monotonic() - started
        self._channel.attach(self._store)  # this round's store (torch sets it in _rendezvous)
        if (worker_group.group_world_size or 1) > 1 and worker_group.group_rank is not None:
            # names this node if it later sends no view of a failure (rule 4 of launcher.decision.culprit)
            self._channel.publish_member(worker_group.group_rank, self._events.node)
        store_counter.mark(self.cycle + 1)  # the store operations until this round (FT_STORE_COUNTS)

    def _check_node(self) -> None:
        """The node check before a rendezvous (:mod:`launcher.node.check`).

        Raises:
            node_check.NodeCheckFailed: A check failed: this node does not join (torch's ``run``
                stops the workers; the launcher exits 65).
        """
        results = node_check.run_checks(self._node_check)
        for result in results:
            if result.skipped and result.name not in self._said_skipped:
                self._said_skipped.add(result.name)
                logger.info("node check: %s %s", result.name, result.detail)
        failed = node_check.failures(results)
        if not failed:
            logger.debug("node check passed: %s", node_check.describe(results))
            return
        self._events.record_event(NodeCheck(cycle=self.cycle + 1, passed=False,
                                            checks=[dataclasses.asdict(r) for r in results]))
        raise node_check.NodeCheckFailed(node_check.describe(failed))

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.cycle += 1
        self._enter(AgentPhase.STARTING)
        # Liveness probe: a monitor that died or does not answer (stopped) is replaced before
        # this cycle's workers connect to it.
        for replaced in self._monitors.replace_dead():
            if replaced.reason == UNRESPONSIVE:
                logger.error("the rank monitor of local rank %s (pid %s) did not answer a ping; killed and "
                             "replaced it", replaced.local_rank, replaced.pid)
                self._events.record_event(MonitorUnresponsive(cycle=self.cycle, local_rank=replaced.local_rank,
                                                              monitor_pid=replaced.pid))
            else:
                logger.warning("replaced the rank monitor of local rank %s (it had exited with %s)",
                               replaced.local_rank, replaced.exit_code)
            self._events.record_event(MonitorReplaced(cycle=self.cycle, local_rank=replaced.local_rank,
                                                      exit_code=replaced.exit_code, reason=replaced.reason))
        warm_ready = self._starts.before_cycle(self.cycle)
        self._watch.reset()
        self._stopped_by_us.clear()
        self._clean_ends.reset()
        self._graceful_stops.clear()
        pids = super()._start_workers(worker_group)
        spawned_at = time.monotonic()
        self._pids = dict(pids)
        self._workers.started(pids)
        # Under warm starts torch started stand-ins; logs, events, monitors and signals want the workers.
        worker_pids = self._starts.resolve_workers(pids)
        self._workers.resolved(worker_pids)
        for worker in worker_group.workers:
            self._monitors.worker_started(worker.local_rank, worker_pids[worker.local_rank], self.cycle,
                                          worker.global_rank)
        self._control.set_workers([*pids.values(), *worker_pids.values()],
                                  template_pid=self._starts.pid)
        self._awaiting_ready = set(pids)
        self._starts.workers_started(spawned_at)
        since_failure = None if self._last_failure_at is None else spawned_at - self._last_failure_at
        self._events.record_event(CycleStart(
            cycle=self.cycle,
            restart_count=worker_group.spec.max_restarts - self._remaining_restarts,
            group_rank=worker_group.group_rank,
            group_world_size=worker_group.group_world_size,
            ranks={str(w.local_rank): w.global_rank for w in worker_group.workers},
            worker_pids={str(k): v for k, v in worker_pids.items()},
            stand_in_pids={str(k): v for k, v in pids.items()} if self._starts.uses_stand_ins else None,
            rendezvous_s=_round(self._rendezvous_s),
            spawn_s=_round(spawned_at - self._cycle_began),
            since_failure_s=_round(since_failure),
            warm_start=warm_ready,
            cold_reason=None if warm_ready else self._starts.cold_reason,
        ))
        if not warm_ready and self.cycle > 0 and self._starts.uses_stand_ins:
            logger.info("cycle %s: workers start cold: %s", self.cycle, self._starts.cold_reason)
        self._last_failure_at = None
        logger.info("cycle %s: started workers %s", self.cycle, sorted(worker_pids.values()))
        if self._reassert_signal_handlers is not None:
            self._reassert_signal_handlers()
        return pids

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        # torch builds each worker's environment and hands it to this hook right before the
        # processes start: the one place to add per-rank variables without copying torch code.
        super()._setup_local_watchdog(envs)
        rank_config = json.dumps(self._ft_cfg.sent_to(Role.RANK))
        for local_rank, env in envs.items():
            env[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = self._monitors.socket_path(local_rank)
            env[FT_LAUNCHER_IPC_SOCKET_ENV_VAR] = self._control.path
            env[FT_CYCLE_ENV_VAR] = str(self.cycle)
            env[FT_RANK_CONFIG_ENV_VAR] = rank_config  # to go on unwatched if the monitor is mute
            env.update(self._starts.worker_env())

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        self._cycle_began = time.monotonic()
        if self._last_failure_at is None:
            # Not our failure: another node restarted or joined (torch saw nodes waiting).
            self._events.record_event(Restart(cycle=self.cycle, reason="another node entered the rendezvous"))
        super()._restart_workers(worker_group)

    # ------------------------------------------------------------------ monitoring

    def _torch_monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """torch's poll, which survives a worker's error file that is not JSON.

        torch reads a failed worker's error file with ``json.load`` and lets a decode error end
        the launcher. The file is empty or cut short when the worker died while writing it (a
        SIGKILL in the middle of torch's ``json.dump``). Such a file is removed with a warning,
        and the failure is judged by the exit code, as for a worker that wrote none.
        """
        try:
            return super()._monitor_workers(worker_group)
        except ValueError:  # json.JSONDecodeError
            if not self._drop_unreadable_error_files():
                raise
            return super()._monitor_workers(worker_group)

    def _drop_unreadable_error_files(self) -> bool:
        """Remove the workers' error files that do not parse as JSON; True if there was one."""
        pcontext = getattr(self, "_pcontext", None)
        dropped = False
        for local_rank, path in dict(getattr(pcontext, "error_files", None) or {}).items():
            if not os.path.isfile(path):  # none written, or os.devnull (torch's stand-in)
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as file:
                    json.load(file)
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                logger.warning("local rank %s's error file %s is not JSON (empty or cut short: the worker died "
                               "while writing it); its failure is judged by its exit code", local_rank, path)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                dropped = True
        return dropped

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        # Wait up to the monitor interval, returning early when anything happens.
        processes.wait_for_any([*self._workers.fds(), *self._monitors.filenos(), self._control.notify_fileno()],
                               self._poll_interval)
        self._control.clear_notify()
        for pid, delivered in self._workers.overdue(processes.QUEUED_SIGNAL_FALLBACK):
            self._record_queued_delivery(pid, delivered)
        self._starts.maybe_start(self.cycle, workers_up=not self._awaiting_ready)
        if self._phase is AgentPhase.WAITING:
            return self._wait_while_unhealthy(worker_group)
        self._poll_monitor_events()
        statuses = self._statuses()
        self._watch.observe(statuses)
        if self._watch.failed(statuses) and not self._watch.evidence_taken:
            self._handle_first_failure(statuses)
            statuses = self._statuses()
            self._watch.observe(statuses)
        hung = [r for r in self._watch.hung_still_running(statuses) if processes.running_child(self._pids[r])]
        if hung:
            # Their monitors signalled them (and SIGKILL them after rank_termination_grace);
            # torch's poll must not SIGTERM them meanwhile. The launcher kills them only if
            # they outlive that.
            if not self._watch.hung_overdue():
                return RunResult(state=WorkerState.HEALTHY)
            self._workers.terminate([self._pids[r] for r in hung], 0.0, signal.SIGKILL)
        if self._clean_ends.others_still_running(self._raw_statuses()):
            return RunResult(state=WorkerState.HEALTHY)  # torch's poll would stop the others
        result = self._torch_monitor_workers(worker_group)
        if result.state == WorkerState.FAILED and result.failures:
            result = self._excuse_aborts_at_exit(worker_group, result)
        # Monitors report a hang before they signal the rank, so every hang behind a death
        # seen above is in these events.
        self._poll_monitor_events()
        result = self._hangs_fail_the_cycle(worker_group, result)
        self._drain_control_requests()
        self._check_other_nodes()
        if self._phase.requested:
            return self._stop_for_outcome(worker_group, result)
        if result.state in _FAILED_STATES:
            return self._on_failure(worker_group, result)
        if result.state == WorkerState.SUCCEEDED:
            self._enter(AgentPhase.SUCCEEDED)
            self._events.record_event(WorkersSucceeded(cycle=self.cycle))
        return result

    def _statuses(self) -> dict[int, int | None]:
        """Exit status by local rank (None while running), without reaping; a worker that
        finished its training and then aborted at exit counts as exited 0."""
        return self._clean_ends.as_exited_zero(self._raw_statuses())

    def _raw_statuses(self) -> dict[int, int | None]:
        by_pid = self._workers.exit_statuses()
        statuses = {local_rank: by_pid.get(pid) for local_rank, pid in self._pids.items()}
        if any(status == -AT_EXIT_SIGNAL for status in statuses.values()):
            # Its monitor's rank_finished was sent before the worker could exit: read it now.
            self._poll_monitor_events()
        return statuses

    def _excuse_aborts_at_exit(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
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
        """A worker crashed or hung: take the evidence from the monitors, then stop the others.

        torch would SIGTERM the others and wait 30 s for them; a worker whose peer died is often
        stuck in a collective (or in a SIGTERM handler that runs one), so they get a short grace
        and then SIGKILL, for a fast restart. They are remembered, so their deaths are recorded
        as consequences, not causes. Hung workers are left to their monitors.
        """
        running = [local_rank for local_rank, status in statuses.items() if status is None]
        self._watch.gather_evidence(self._monitors, sorted(self._pids), running,
                                    self._ft_cfg.stack_capture_budget or 0.0)
        self._poll_monitor_events()  # hangs reported while we asked
        survivors = [self._pids[r] for r in running if r not in self._watch.hangs]
        self._stopped_by_us.update(survivors)
        self._workers.terminate(survivors, self._workers_stop_timeout)

    def _hangs_fail_the_cycle(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
        """A detected hang fails the cycle whatever the hung worker's exit status (a SIGTERM
        handler may exit 0): add the hung workers torch saw succeed."""
        if not self._watch.hangs or result.state == WorkerState.UNHEALTHY:
            return result
        self._watch.observe(self._statuses())
        failures = dict(result.failures) if result.state == WorkerState.FAILED else {}
        added = self._watch.hung_failures(self._pids, {w.local_rank: w.global_rank for w in worker_group.workers},
                                          failures)
        if not added:
            return result
        return RunResult(state=WorkerState.FAILED, failures={**failures, **added})

    def _poll_monitor_events(self) -> None:
        for local_rank, event in self._monitors.poll_events():
            self._on_monitor_event(local_rank, event)

    def _on_monitor_event(self, local_rank: int, event: messages.Message) -> None:
        if (isinstance(event, (messages.RankHang, messages.RankEscalated))
                and about_an_earlier_worker(event, self._workers.worker_pids.get(local_rank))):
            logger.info("cycle %s: ignored a late %s report of local rank %s about pid %s, a worker of an "
                        "earlier cycle (the current one is pid %s)", self.cycle, event.TYPE, local_rank, event.pid,
                        self._workers.worker_pids.get(local_rank))
            return
        if isinstance(event, messages.RankHang):
            # Keyed by local rank: with warm starts torch knows the trampoline's pid, the
            # monitor the forked worker's.
            self._watch.on_hang(local_rank, event, self._ft_cfg.rank_termination_grace or 0.0)
        elif isinstance(event, messages.RankEscalated):
            logger.error("rank %s (local rank %s, pid %s) outlived %s by %.1f s; its monitor sent SIGKILL",
                         event.rank, local_rank, event.pid,
                         self._ft_cfg.rank_termination_signal.name, event.after or 0.0)
            self._events.record_event(RankEscalated(cycle=self.cycle, local_rank=local_rank, rank=event.rank,
                                                    worker_pid=event.pid, signal=event.signal, after=event.after))
        elif isinstance(event, messages.RankFinished):
            if event.pid in (self._pids.get(local_rank), self._workers.worker_pids.get(local_rank)):
                self._clean_ends.finished(local_rank, event.pid)
                if event.stop_step is not None:
                    self._graceful_stops[local_rank] = self._events.record_event(GracefulStopped(
                        cycle=self.cycle, local_rank=local_rank, rank=event.rank, worker_pid=event.pid,
                        step=event.stop_step, run_steps=event.stop_run_steps, signal=event.stop_signal))
        elif isinstance(event, messages.RankConnected) and local_rank not in self._awaiting_ready:
            self._clean_ends.reconnected(local_rank)  # training again (a second fit)
        elif isinstance(event, messages.RankConnected):
            pid, delivered = self._workers.connected(local_rank)
            self._record_queued_delivery(pid, delivered)
            self._awaiting_ready.discard(local_rank)
            if not self._awaiting_ready:
                if self._phase is AgentPhase.STARTING:
                    self._enter(AgentPhase.RUNNING)
                ready_s = time.monotonic() - self._cycle_began
                self._events.record_event(WorkersReady(cycle=self.cycle, ready_s=_round(ready_s)))
        elif isinstance(event, messages.MonitorLost):
            logger.error(
                "the rank monitor of local rank %s exited (code %s); that rank is not watched "
                "until the next cycle, when the monitor is replaced", local_rank, event.exit_code,
            )
            self._events.record_event(MonitorDied(cycle=self.cycle, local_rank=local_rank,
                                                  exit_code=event.exit_code))

    def _record_queued_delivery(self, pid: int | None, delivered: list[signal.Signals]) -> None:
        for sig in delivered:
            logger.info("delivered the queued %s to worker pid %s", sig.name, pid)
            self._events.record_event(SignalForwarded(cycle=self.cycle, signal=sig.name, worker_pids=[pid],
                                                      queued=True))

    def _on_failure(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
        # "Time to restart" counts from the failure itself (a crash, a hang's detection), not
        # from the end of the grace the others got.
        first = self._watch.first_failure_at
        self._last_failure_at = min(first, time.monotonic()) if first is not None else time.monotonic()
        # A peer's ShutdownWorkload often reaches us as a failed collective first.
        self._check_other_nodes(force=True)
        if self._phase.requested:
            return self._stop_for_outcome(worker_group, result)
        healthy = None
        if self._policy.checks_node_health(worker_group.group_world_size) and self._channel.mark_unhealthy(
                worker_group.group_rank, self.cycle):
            healthy = self._channel.healthy_nodes(worker_group.group_world_size, _live_group_ranks(worker_group))
        spec = worker_group.spec
        records = self._failure_records(worker_group, result)
        first = records[0]  # every record of a cycle carries its root's fingerprint (None: no root)
        self.last_fingerprint = first.fingerprint
        # One node fewer must still make a round (--nnodes MIN) for a node to leave instead of a stop.
        can_lose_a_node = (worker_group.group_world_size or 1) - 1 >= self._policy.min_nodes
        verdict = (self._crash_loop.on_failure(
            CycleFailure(self.cycle, first.fingerprint, first.root_step, self._root_node(first, worker_group),
                         first.root_before_first_step),
            can_lose_a_node) if first.fingerprint is not None else None)
        if verdict is not None and verdict.stop:
            # Every node chose the same root from the same views, so every node stops here too.
            self._write_failures(records, verdict.text)
            self._enter(AgentPhase.REPEATED)
            self._remaining_restarts = 0  # torch's loop then stops the workers instead of restarting
            return RunResult(state=WorkerState.FAILED, failures=result.failures)
        if verdict is not None and verdict.exclude is not None and first.role == ROOT:
            # Every node reached this verdict alike; this node is the one it names: it leaves as
            # for ExcludeThisNode (exit 65, the rendezvous left open for the others and a spare).
            self._outcome_cause = verdict.text
            self._write_failures(records, f"{verdict.text}: this node leaves the job (exit 65, as for ExcludeThisNode)")
            self._enter(AgentPhase.EXCLUDED)
            self._remaining_restarts = 0  # torch's loop then stops the workers instead of restarting
            return RunResult(state=WorkerState.FAILED, failures=result.failures)
        decision = self._policy.on_failure(remaining_restarts=self._remaining_restarts,
                                           max_restarts=spec.max_restarts, healthy_nodes=healthy)
        excluded = verdict is not None and verdict.exclude is not None
        self._write_failures(records, f"{verdict.text}; {decision.text}" if excluded else decision.text)
        if decision.action == WAIT:
            self._enter(AgentPhase.WAITING)
            return RunResult(state=WorkerState.HEALTHY)
        self._enter(AgentPhase.FAILED)
        return result

    def _root_node(self, first: FailureRecord, worker_group: WorkerGroup) -> str | None:
        """The root's node as every node names it: its host and its rank in this round (the host
        alone does not tell apart several launchers on one host); None if not known."""
        if first.role == ROOT:
            host, group_rank = self._events.node, worker_group.group_rank
        else:
            host, group_rank = first.detail.get("root_node"), first.detail.get("root_group_rank")
        if not host:
            return None
        return f"{host} (group rank {group_rank})" if group_rank is not None else str(host)

    def _wait_while_unhealthy(self, worker_group: WorkerGroup) -> RunResult:
        healthy = self._channel.healthy_nodes(worker_group.group_world_size, _live_group_ranks(worker_group))
        if not self._policy.restart_while_waiting(healthy):
            return RunResult(state=WorkerState.HEALTHY)
        self._events.record_event(MinHealthyRestart(cycle=self.cycle, healthy_nodes=healthy,
                                                    min_nodes=self._policy.min_nodes))
        logger.warning("min-healthy: only %s healthy node(s) left (< %s); restarting the workload",
                       healthy, self._policy.min_nodes)
        self._enter(AgentPhase.FAILED)
        return RunResult(state=WorkerState.FAILED)

    def _log_failures(self, worker_group: WorkerGroup, result: RunResult, decision: str) -> None:
        self._write_failures(self._failure_records(worker_group, result), decision)

    def _failure_records(self, worker_group: WorkerGroup, result: RunResult) -> list[FailureRecord]:
        now = time.time()
        evidence = self._watch.evidence(self._events.node, worker_group.group_rank)
        return failure_records(
            result.failures, local_ranks={w.global_rank: w.local_rank for w in worker_group.workers},
            hangs=self._watch.hangs, stopped_by_us=self._stopped_by_us, cycle=self.cycle, now=now,
            evidence=evidence, exchange=lambda states: self._exchange_views(worker_group, states),
        ) or [group_unhealthy_record(self.cycle, now)]

    def _write_failures(self, records: list[FailureRecord], decision: str) -> None:
        for record in records:
            if record.pid is not None:  # torch's pid is the stand-in's under warm restarts
                record = dataclasses.replace(record, pid=self._workers.worker_pid(record.pid))
            self._events.failure(record, decision if record.kind != KIND_TERMINATED else "stopped by the launcher")

    def _exchange_views(self, worker_group: WorkerGroup, states: list[RankState]) -> Exchanged:
        """Publish this node's ranks of the failed cycle; read the other nodes' (bounded) and
        name the nodes that sent none (only if this node's own view got through)."""
        nodes = worker_group.group_world_size or 1
        if nodes <= 1 or not self._channel.attached:
            return Exchanged()
        published = self._channel.publish_view(worker_group.group_rank, [s.to_json() for s in states])
        views = self._channel.gather_views(nodes, worker_group.group_rank)
        remote = [RankState.from_json(item) for item in views.states]
        lost = [LostNode(group_rank, host) for group_rank, host in views.missing.items()] if published else []
        return Exchanged([state for state in remote if state is not None], lost, views.waited)

    def _publish_leaving(self, worker_group: WorkerGroup) -> None:
        """Before this node kills its workers to leave: publish them as this node's view of the
        failure its peers are about to see (rule 0 of :mod:`launcher.decision.culprit`), so that the peers
        name this node's leaving as the root, not their own ranks whose collectives fail, and do
        not wait for a view from a node that is gone."""
        if (worker_group.group_world_size or 1) <= 1 or not self._channel.attached:
            return
        at = time.time()
        cause = f"its node left the job ({self._outcome_cause})"
        pids = {rank: self._workers.worker_pid(pid) for rank, pid in self._pids.items()}
        states = [RankState(rank=w.global_rank, local_rank=w.local_rank, node=self._events.node,
                            group_rank=worker_group.group_rank, pid=pids.get(w.local_rank),
                            outcome=culprit.LEFT, cause=cause, event_at=at).to_json()
                  for w in worker_group.workers]
        self._channel.publish_view(worker_group.group_rank, states)

    # ------------------------------------------------------------------ workload control

    def _drain_control_requests(self) -> None:
        while True:
            try:
                item = self._control.requests.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, ReceivedStragglerReport):
                self._record_stragglers(item)
                continue
            action = item.request.action
            self._events.record_event(ControlRequest(
                cycle=self.cycle, action=action.name,
                description=item.request.description, sender_pid=item.sender_pid, rank=item.rank,
            ))
            logger.warning("rank %s (pid %s) requested %s: %s", item.rank, item.sender_pid,
                           action.name, item.request.description or "(no reason given)")
            if action is WorkloadAction.ShutdownWorkload:
                if self._phase is not AgentPhase.SHUTDOWN:
                    self._outcome_cause = (f"rank {item.rank} (pid {item.sender_pid}) requested ShutdownWorkload: "
                                           f"{item.request.description or '(no reason given)'}")
                    self._enter(AgentPhase.SHUTDOWN)
                self._channel.publish_shutdown(self._events.node, item.rank, item.request.description)
            elif action is WorkloadAction.ExcludeThisNode and not self._phase.requested:
                self._outcome_cause = (f"rank {item.rank} (pid {item.sender_pid}) requested ExcludeThisNode: "
                                       f"{item.request.description or '(no reason given)'}")
                self._enter(AgentPhase.EXCLUDED)

    def _record_stragglers(self, report: ReceivedStragglerReport) -> None:
        for entry in report.entries:
            self._events.record_event(Straggler(
                cycle=self.cycle, scope=entry.scope, rank=entry.rank, relative=entry.relative,
                individual=entry.individual, interval_s=report.interval_s, consecutive=entry.consecutive,
                action=entry.action, sender_pid=report.sender_pid,
                reported_node=entry.node if entry.node != self._events.node else None,
            ))
            who = f"rank {entry.rank}" if entry.rank is not None else "the node"
            logger.warning("straggler: %s on node %s is slow (relative score %s, individual score %s; "
                           "flagged in %d report(s) in a row; action: %s)", who, entry.node,
                           _score_text(entry.relative), _score_text(entry.individual), entry.consecutive,
                           entry.action)

    def _check_other_nodes(self, force: bool = False) -> None:
        """Learn about a ShutdownWorkload requested on another node."""
        if self._phase.requested:
            return
        notice = self._channel.poll_shutdown(force=force)
        if notice is None:
            return
        self._enter(AgentPhase.SHUTDOWN)
        self._outcome_cause = f"node {notice.node} requested ShutdownWorkload: {notice.description}"
        self._events.record_event(ControlRequest(cycle=self.cycle, action=WorkloadAction.ShutdownWorkload.name,
                                                 description=notice.description, rank=notice.rank,
                                                 from_node=notice.node))
        logger.warning("node %s requested ShutdownWorkload: %s", notice.node, notice.description)

    def _stop_for_outcome(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
        decision = outcome_decision(_OUTCOMES[self._phase])
        if result.state in _FAILED_STATES:
            self._log_failures(worker_group, result, decision)
        else:  # the workers are still up: the request is the whole story
            if self._phase is AgentPhase.EXCLUDED:
                self._publish_leaving(worker_group)
            self._events.outcome_line(self.cycle, self._outcome_cause, decision)
        self._remaining_restarts = 0  # torch's loop then stops the workers instead of restarting
        return RunResult(state=WorkerState.FAILED, failures=result.failures)

    # ------------------------------------------------------------------ stopping

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        # torch's LocalElasticAgent._stop_workers is `self._shutdown()` with its default 30 s
        # (test_torch_hooks checks); our stops between cycles take --term-timeout instead.
        if self._phase is AgentPhase.EXCLUDED:
            # This node leaves and the others go on: its ranks must take part in no further
            # collective. A SIGTERM would let a rank's graceful-stop handler (ours, Lightning's)
            # propose a stop that every rank agrees to, ending the whole job "successfully" (seen
            # on the cluster with the straggler replace action). SIGKILL makes the peers'
            # collectives fail at once, so they restart, with a spare in this node's place.
            logger.info("this node leaves the job: its workers are stopped with SIGKILL (no graceful stop)")
            self._shutdown(signal.SIGKILL, timeout=0.0)
            return
        self._shutdown(timeout=self._term_timeout)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: float | None = None) -> None:
        """Stop the workers: ``death_sig`` to their process groups, SIGKILL after ``timeout`` s.

        torch calls this from its ``run`` with our ``--term-timeout`` (as ``shutdown_timeout``),
        also after a signal to the launcher (``death_sig`` is that signal), and we call it from
        :meth:`_stop_workers`. torch's own stop path takes whole seconds, so the wait itself is
        ours (:meth:`launcher.node.processes.WorkerProcesses.terminate`, exact to the fraction);
        torch's ``_shutdown`` then finds the workers gone and only releases its resources (given
        the timeout rounded up, in case a worker started after our pid list). When the workers
        got ``death_sig`` themselves (sent to the whole job), it is not sent again: they only get
        their ``timeout``, warm and cold alike. :attr:`stopped_cleanly` tells how it ended.
        No ``timeout`` (torch < 2.12 calls it without one) means ``--term-timeout``.
        """
        if timeout is None:
            timeout = self._term_timeout
        if self._reassert_signal_handlers is not None:
            self._reassert_signal_handlers()  # torch's own handlers would raise on a second signal
        delivered = self._stop_signal_delivered(death_sig) if self._stop_signal_delivered is not None else False
        killed = self._workers.terminate(self._workers.pids, timeout, death_sig, already_signalled=delivered)
        statuses = self._workers.exit_statuses()
        self.stopped_cleanly = not killed and all(status == 0 for status in statuses.values())
        super()._shutdown(death_sig, **torch_shutdown_kwargs(timeout))
        self._workers.close()
        self._reap_leftovers()

    def _reap_leftovers(self) -> None:
        """Kill what workers left behind: their process groups and re-parented orphans."""
        killed = processes.kill_leftovers(worker_pids=self.worker_pids, keep=set(self._monitors.pids()),
                                          keep_alone={self._starts.pid, *self._helper_pids} - {None})
        if killed:
            logger.warning("killed %s process(es) left behind by workers: %s", len(killed), sorted(killed))
            self._events.record_event(LeftoversKilled(cycle=self.cycle, pids=sorted(killed)))


class _WorkerPidLogFilter(logging.Filter):
    """torch's own log lines name the process torch started, under warm restarts a stand-in;
    this makes them name the worker's own pid, as every line of ours does."""

    def __init__(self, workers: processes.WorkerProcesses) -> None:
        super().__init__()
        self.workers = workers

    def filter(self, record: logging.LogRecord) -> bool:
        index = TORCH_PID_LINES.get(record.msg) if isinstance(record.msg, str) else None
        if index is not None and isinstance(record.args, tuple) and len(record.args) > index:
            pid = record.args[index]
            if isinstance(pid, int):
                args = list(record.args)
                args[index] = self.workers.worker_pid(pid)
                record.args = tuple(args)
        return True


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _score_text(score: float | None) -> str:
    """A straggler score for a log line: 2 decimals (``0.51``), ``-`` when not computed."""
    return "-" if score is None else f"{score:.2f}"


def _live_group_ranks(worker_group: WorkerGroup) -> frozenset[int] | None:
    """The round's nodes whose launcher is alive, from the membership proxy (:mod:`launcher.rendezvous.membership`)."""
    live = getattr(worker_group.spec.rdzv_handler, "live_group_ranks", None)
    return live() if callable(live) else None
