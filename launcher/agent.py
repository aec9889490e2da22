"""``FaultTolerantAgent``: torch's ``LocalElasticAgent`` plus rank monitors and failure causes.

The agent reuses torch's template (rendezvous, start, monitor, restart, exit barrier) and only
overrides its hooks; each hook calls into a unit that owns one concern:

- ``_rendezvous``: the node check first (:mod:`launcher.node.join_check`); timing; the round's
  store for the cross-node channel, this node's name in it (:mod:`launcher.rendezvous.store_channel`);
  a round whose rank assignment failed (``_assign_worker_ranks``: a member died as it closed,
  :mod:`launcher.rendezvous.round_failure`) is a restart, and the next round is joined.
- ``_start_workers``: dead or unresponsive monitors replaced, template readiness, monitors told
  the worker pids, ``cycle_start`` (:mod:`launcher.node.cycle_workers`, :mod:`launcher.warm.coordinator`).
- ``_setup_local_watchdog``: per-rank environment (monitor / control / template sockets, cycle).
- ``_monitor_workers``: wait for activity; the cycle's workers watched (reports, evidence, fast
  stop of survivors, hangs: :mod:`launcher.node.cycle_workers`); control requests and
  ShutdownWorkload from other nodes (:mod:`launcher.node.workload_requests`); after a failure the
  facts gathered (:mod:`launcher.decision.gather`), :func:`launcher.decision.decide.decide`
  decides, and :meth:`FaultTolerantAgent._steer_torch`, the one place that steers torch's loop,
  carries the decision out.
- ``_restart_workers``: "another node restarted" record.
- ``_stop_workers`` / ``_shutdown``: ``--term-timeout`` to the fraction of a second, SIGKILL for a
  node that leaves; what workers left behind (:mod:`launcher.node.worker_stop`).

The agent is given the node's started parts as one :class:`NodeParts` and how workers stop as
one :class:`launcher.node.worker_stop.StopSettings`. What the agent is doing is one explicit
phase (:class:`launcher.agent_phase.AgentPhase`: idle, starting, running, failed, waiting,
succeeded, shutdown, excluded, repeated), changed only through :meth:`FaultTolerantAgent._enter`,
which checks the transition. How workers start is a start coordinator's business
(:mod:`launcher.warm.coordinator` or :mod:`launcher.warm.cold`).

Its public surface for :mod:`launcher.launch`: :attr:`cycle`, :attr:`phase`,
:attr:`worker_pids`, :attr:`stopped_cleanly`, :attr:`ending`, :attr:`last_fingerprint`,
:meth:`graceful_stops`, :meth:`forward_signal`, :meth:`wait_for_shutdown_acks`. Nothing else
reads torch's or the agent's private attributes; ``tests/unit/test_torch_hooks.py`` checks every
hook signature and private torch attribute used here against the installed torch.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousGracefulExitError

from ft_core.wire.config import FaultToleranceConfig, Role
from ft_core.wire.env import (
    FT_CYCLE_ENV_VAR,
    FT_LAUNCHER_IPC_SOCKET_ENV_VAR,
    FT_RANK_CONFIG_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)
from launcher.agent_phase import AgentPhase
from launcher.decision.crash_loop import Fingerprint
from launcher.decision.decide import Action, Decision, decide
from launcher.decision.gather import CycleFailures
from launcher.decision.restart_policy import RestartPolicy
from launcher.events.log import EventLog
from launcher.events.records import (
    GracefulStopped,
    JoinDeclined,
    MinHealthyRestart,
    ReplaceRefused,
    Restart,
    SignalForwarded,
    SignalReceived,
    WorkersSucceeded,
)
from launcher.node import cycle_record, error_files, processes, torch_logs
from launcher.node.control_server import ControlServer
from launcher.node.cycle_workers import CycleWorkers
from launcher.node.join_check import JoinCheck
from launcher.node.monitors import MonitorPool
from launcher.node.survivor_save import state_dir
from launcher.node.worker_stop import StopSettings, WorkerStop
from launcher.node.workload_requests import WorkloadRequests
from launcher.rendezvous import round_failure, state_agreement, store_counter
from launcher.rendezvous.store_channel import StoreChannel
from launcher.torch_compat import agent_shutdown_kwargs
from launcher.warm.cold import StartCoordinator

logger = logging.getLogger(__name__)

_FAILED_STATES = (WorkerState.FAILED, WorkerState.UNHEALTHY)
LEAVING_PUBLISH_BOUND = 1.0
"""Seconds a stopped launcher waits to tell the other nodes it leaves before stopping its workers."""
DROPPED_MEMBER_REASON = ("restarting the worker group with the node(s) waiting in the rendezvous "
                         "(torch's restart for a new membership; not counted against --max-restarts)")
_ENDING_PHASES = {Action.LEAVE: AgentPhase.EXCLUDED, Action.REPEATED: AgentPhase.REPEATED,
                  Action.SHUTDOWN: AgentPhase.SHUTDOWN}


@dataclass(frozen=True)
class NodeParts:
    """The node's parts the launcher started and the agent drives (the run owns and releases them).

    Attributes:
        monitors: The node's started :class:`MonitorPool`.
        control: The launcher's :class:`ControlServer`.
        events: Where failure lines and records go.
        starts: How workers start: the node's warm template coordinator (workers forked from
            the template, see :mod:`launcher.warm.coordinator`) or ``ColdStart`` (as torchrun).
        workers: The node's worker table (shared with the launcher's signal dispatcher, which
            routes signals to the workers through :meth:`FaultTolerantAgent.forward_signal`
            from its own thread).
    """

    monitors: MonitorPool
    control: ControlServer
    events: EventLog
    starts: StartCoordinator
    workers: processes.WorkerProcesses


class FaultTolerantAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` whose workers are watched by rank monitors.

    Args:
        spec, logs_specs, start_method, log_line_prefix_template: As for ``LocalElasticAgent``
            (``spec`` as the start coordinator adopted it).
        ft_cfg: The fault tolerance config (the monitors enforce it; the agent reads the
            termination grace and signal, the stack budget, and what ranks get of it).
        restart_policy: What a failure leads to.
        parts: The node's started parts.
        stop: How workers are stopped (``stop.term_timeout`` is torch's ``shutdown_timeout``).
    """

    def __init__(
        self,
        spec: Any,
        logs_specs: Any,
        *,
        ft_cfg: FaultToleranceConfig,
        restart_policy: RestartPolicy,
        parts: NodeParts,
        stop: StopSettings,
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
    ) -> None:
        monitors, control, events, workers = parts.monitors, parts.control, parts.events, parts.workers
        self._starts = parts.starts
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
                         log_line_prefix_template=log_line_prefix_template,
                         **agent_shutdown_kwargs(stop.term_timeout))
        self._monitors = monitors
        self._stopper = WorkerStop(stop, workers, monitors, parts.starts, events)
        self._control = control
        self._events = events
        self._join_check = JoinCheck(ft_cfg, events)
        self._channel = StoreChannel()
        self._jit_state_dir = state_dir(monitors.run_dir) if ft_cfg.jit_state else None
        self._jit_resume: state_agreement.Agreement | None = None
        self._failures = CycleFailures(restart_policy, ft_cfg, self._channel, events, workers)
        self._requests = WorkloadRequests(control, self._channel, events)
        self.ending: Decision | None = None
        """The decision that ended the run whatever restarts were left (leave, repeated failure,
        shutdown: its outcome and exit code are the launcher's), None if none did."""
        self.cycle = -1
        """Index of the latest cycle (-1 before the first start)."""
        self._phase = AgentPhase.IDLE
        self._cycle_began = time.monotonic()  # the latest start or restart began, for the timings
        self._last_failure_at: float | None = None
        self._join_declined_in: int | None = None  # the cycle whose join_declined was said
        self._rendezvous_s: float | None = None
        self._workers = workers
        torch_logs.install(workers)
        self._cycle_workers = CycleWorkers(monitors, workers, events, ft_cfg, stop.workers_stop_timeout,
                                           on_ready=self._workers_ready)
        self.stopped_cleanly = True
        """After the last stop: every worker exited 0 within the timeout (True if none ran)."""
        self._ended_as_spare = False  # the rendezvous closed while this node waited for a place

    # ------------------------------------------------------------------ public surface

    def graceful_stops(self) -> list[GracefulStopped]:
        """The current cycle's workers that left their training in a graceful stop, by local rank
        (see :meth:`launcher.node.cycle_workers.CycleWorkers.graceful_stops`)."""
        return self._cycle_workers.graceful_stops()

    @property
    def last_fingerprint(self) -> Fingerprint | None:
        """The root failure of the latest failed cycle (for the result file), None before one."""
        return self._failures.last_fingerprint

    @property
    def phase(self) -> AgentPhase:
        """What the agent is doing (SHUTDOWN or EXCLUDED once a control request decided the run)."""
        return self._phase

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the latest cycle's workers: as torch started them and, under warm restarts,
        the forked workers' own."""
        return self._workers.all_pids

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
        self._join_check.run(self.cycle + 1)
        started = time.monotonic()
        try:
            with self._starts.rendezvous_wait(self.cycle + 1):
                while True:
                    try:
                        super()._rendezvous(worker_group)
                        break
                    except round_failure.RoundFailed as failed:  # a member died as the round closed
                        self._round_failed(worker_group, failed)
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
        # which just-in-time state this round's workers resume from, the same step on every node
        self._jit_resume = state_agreement.resume_for_round(self._store, worker_group.group_rank or 0,
                                                            worker_group.group_world_size or 1,
                                                            self._jit_state_dir, self.cycle + 1,
                                                            self._ft_cfg.jit_heal_timeout, self._events)

    def _assign_worker_ranks(self, store: Any, group_rank: int, group_world_size: int, spec: Any) -> list[Any]:
        # torch's exchange right after the round, bounded; a member that never came is RoundFailed
        return round_failure.assign_ranks(
            lambda: super(FaultTolerantAgent, self)._assign_worker_ranks(store, group_rank, group_world_size, spec),
            store, group_rank, group_world_size, spec.rdzv_handler)

    def _round_failed(self, worker_group: WorkerGroup, failed: round_failure.RoundFailed) -> None:
        """A failed round is a restart like a failed cycle: counted, then the next round; raised
        (the launcher's "rendezvous failed", exit 1) when no restart is left."""
        left = self._remaining_restarts
        round_failure.report(self._events, self.cycle, failed, left, worker_group.spec.max_restarts)
        if left <= 0:
            raise failed
        # our loop (the retry in _rendezvous), not torch's, restarts here: the restart is spent by us
        self._steer_torch(Decision(Action.RESTART, str(failed)), RunResult(state=WorkerState.FAILED),
                          spent_by_torch=False)
        round_failure.forget_missing(worker_group.spec.rdzv_handler, failed)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.cycle += 1
        self._enter(AgentPhase.STARTING)
        self._cycle_workers.reset(self.cycle, self._cycle_began)  # dead or mute monitors replaced first
        warm_ready = self._starts.before_cycle(self.cycle)
        pids = super()._start_workers(worker_group)
        spawned_at = time.monotonic()
        self._cycle_workers.started(pids)
        self._workers.started(pids)
        # Under warm starts torch started stand-ins; logs, events, monitors and signals want the workers.
        worker_pids = self._starts.resolve_workers(pids)
        self._workers.resolved(worker_pids)
        for worker in worker_group.workers:
            self._monitors.worker_started(worker.local_rank, worker_pids[worker.local_rank], self.cycle,
                                          worker.global_rank)
        self._control.set_workers([*pids.values(), *worker_pids.values()],
                                  template_pid=self._starts.pid)
        self._starts.workers_started(spawned_at)
        since_failure = None if self._last_failure_at is None else spawned_at - self._last_failure_at
        self._events.record_event(cycle_record.cycle_start(
            self.cycle, worker_group, self._remaining_restarts, pids, worker_pids, self._starts, warm_ready,
            {"rendezvous_s": self._rendezvous_s, "spawn_s": spawned_at - self._cycle_began,
             "since_failure_s": since_failure}))
        if not warm_ready and self.cycle > 0 and self._starts.uses_stand_ins:
            logger.info("cycle %s: workers start cold: %s", self.cycle, self._starts.cold_reason)
        self._last_failure_at = None
        logger.info("cycle %s: started workers %s", self.cycle, sorted(worker_pids.values()))
        self._stopper.reassert_signal_handlers()  # torch's start installed its own
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
            env.update(state_agreement.worker_env(self._jit_state_dir, self._jit_resume))

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        if self._last_failure_at is None and self._training_ended():
            return  # torch's loop goes on polling: the workers exit, the job ends
        self._cycle_began = time.monotonic()
        if self._last_failure_at is None:
            # Not our failure: another node restarted or joined (torch saw nodes waiting), or the
            # round lost a node (torch dropped it) and a spare now counts as waiting.
            noticed_at, noticed = time.time(), time.monotonic()
            self._cycle_workers.save_before_restart()  # torch's restart stops this node's workers next
            dropped = self._failures.after_dropped_member(worker_group, self.cycle, self._cycle_workers.watch,
                                                          noticed_at)
            if dropped:
                self._last_failure_at = noticed
                self._failures.write(dropped, DROPPED_MEMBER_REASON, stopped_reason=DROPPED_MEMBER_REASON)
            self._events.record_event(Restart(cycle=self.cycle, reason="another node entered the rendezvous"))
        super()._restart_workers(worker_group)

    def _training_ended(self) -> bool:
        """torch restarts a healthy node's workers whenever nodes wait in the rendezvous; not once
        the training ended (a worker here said so, or another node's workers all succeeded): the
        finished ranks would train again with the newcomer while the other nodes wait for this
        one in torch's exit barrier. Says so once per cycle (a line and a ``join_declined`` record)."""
        ended_on = self._events.node if self._cycle_workers.training_ended() else self._channel.training_ended_on()
        if ended_on is None:
            return False
        if self._join_declined_in != self.cycle:
            self._join_declined_in = self.cycle
            logger.info("cycle %s: node(s) wait in the rendezvous, but the training ended (on %s): this node's "
                        "workers are not restarted for the waiting node(s), which stay out of this job",
                        self.cycle, ended_on or "another node")
            self._events.record_event(JoinDeclined(cycle=self.cycle, ended_on=ended_on or None))
        return True

    # ------------------------------------------------------------------ monitoring

    def _torch_monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """torch's poll, which survives a worker's error file that is not JSON.

        Such a file is removed with a warning (:mod:`launcher.node.error_files`), and the failure
        is judged by the exit code, as for a worker that wrote none.
        """
        try:
            return super()._monitor_workers(worker_group)
        except ValueError:  # json.JSONDecodeError
            # torch's process context holds the error files (tests/torch_source_checks.py checks it)
            if not error_files.drop_unreadable(getattr(getattr(self, "_pcontext", None), "error_files", None) or {}):
                raise
            return super()._monitor_workers(worker_group)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        # Wait up to the monitor interval, returning early when anything happens.
        processes.wait_for_any([*self._workers.fds(), *self._monitors.filenos(), self._control.notify_fileno()],
                               self._poll_interval)
        self._control.clear_notify()
        for pid, delivered in self._workers.overdue(processes.QUEUED_SIGNAL_FALLBACK):
            self._cycle_workers.record_queued_delivery(pid, delivered)
        self._starts.maybe_start(self.cycle, workers_up=not self._cycle_workers.awaiting_ready)
        if self._phase is AgentPhase.WAITING:
            return self._wait_while_unhealthy(worker_group)
        if self._cycle_workers.holds_torchs_poll():
            return RunResult(state=WorkerState.HEALTHY)  # no decision: torch's loop polls again
        result = self._cycle_workers.corrected(worker_group, self._torch_monitor_workers(worker_group))
        self._requests.drain(self.cycle)
        self._requests.check_other_nodes(self.cycle)
        if self._requests.current is not None:
            facts = self._failures.at_request(worker_group, self._remaining_restarts, self._requests.current,
                                              self._requests.cause)
            decision = decide(facts)
            if decision.action is not Action.KEEP:
                return self._stop_for_request(worker_group, result, decision)
            self._requests.refuse(self.cycle, ReplaceRefused(
                cycle=self.cycle, reason=decision.reason, nodes=facts.group_world_size,
                min_nodes=facts.policy.min_nodes, spares_waiting=facts.spares_waiting))
            # the workers go on: on to their failure or success
        if result.state in _FAILED_STATES:
            return self._on_failure(worker_group, result)
        if result.state == WorkerState.SUCCEEDED:
            if (worker_group.group_world_size or 1) > 1:
                self._channel.publish_training_ended(self._events.node)
            self._enter(AgentPhase.SUCCEEDED)
            self._events.record_event(WorkersSucceeded(cycle=self.cycle))
        return result

    def _workers_ready(self) -> None:
        """Every worker of the cycle connected to its monitor."""
        if self._phase is AgentPhase.STARTING:
            self._enter(AgentPhase.RUNNING)

    def _on_failure(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
        # "Time to restart" counts from the failure itself (a crash, a hang's detection), not
        # from the end of the grace the others got.
        first = self._cycle_workers.watch.first_failure_at
        self._last_failure_at = min(first, time.monotonic()) if first is not None else time.monotonic()
        # A peer's ShutdownWorkload often reaches us as a failed collective first.
        self._requests.check_other_nodes(self.cycle, force=True)
        if self._requests.current is not None:
            return self._stop_for_request(worker_group, result)
        facts = self._failures.after_failure(worker_group, result.failures, self.cycle, self._cycle_workers.watch,
                                             self._cycle_workers.stopped_by_us, self._remaining_restarts)
        decision = decide(facts)
        self._failures.write(facts.records, decision.reason)
        return self._steer_torch(decision, result)

    def _wait_while_unhealthy(self, worker_group: WorkerGroup) -> RunResult:
        facts = self._failures.while_waiting(worker_group, self._remaining_restarts)
        decision = decide(facts)
        if decision.action is Action.RESTART:
            self._events.record_event(MinHealthyRestart(cycle=self.cycle, healthy_nodes=facts.healthy_nodes,
                                                        min_nodes=facts.policy.min_nodes))
            logger.warning("%s", decision.reason)
        return self._steer_torch(decision, RunResult(state=WorkerState.FAILED))

    def _stop_for_request(self, worker_group: WorkerGroup, result: RunResult,
                          decision: Decision | None = None) -> RunResult:
        """A workload control request decided the run: the failures or the request's line, then the stop
        (``decision``: already taken on the request, else taken here)."""
        if decision is None:
            decision = decide(self._failures.at_request(worker_group, self._remaining_restarts,
                                                        self._requests.current, self._requests.cause))
        if result.state in _FAILED_STATES:
            self._failures.write(self._failures.records(worker_group, result.failures, self.cycle,
                                                        self._cycle_workers.watch, self._cycle_workers.stopped_by_us),
                                 decision.reason)
        else:  # the workers are still up: the request is the whole story
            if decision.action is Action.LEAVE:
                self._failures.publish_leaving(worker_group, self._cycle_workers.pids, decision.cause)
            self._events.outcome_line(self.cycle, decision.cause, decision.reason)
        return self._steer_torch(decision, result)

    def _steer_torch(self, decision: Decision, result: RunResult, spent_by_torch: bool = True) -> RunResult:
        """Carry ``decision`` out in torch's loop: the one place that steers it.

        torch's ``_invoke_run`` acts on what ``_monitor_workers`` returns: HEALTHY keeps it
        polling; FAILED makes it restart the worker group while ``_remaining_restarts`` > 0 and
        stop the workers otherwise. So WAIT is HEALTHY (nothing restarts, the next poll re-checks
        the healthy nodes); RESTART and STOP are the failed result (torch's counter tells them
        apart as :func:`decide` did); a decision that ends the run whatever restarts are left
        (leave, repeated failure, shutdown) sets the counter to 0 and becomes :attr:`ending`.
        The agent's phase follows the decision here. A restart our own loop makes (a failed
        round, retried in :meth:`_rendezvous`: ``spent_by_torch`` False) is taken off the counter here.
        """
        action = decision.action
        if action is Action.WAIT:
            if self._phase is not AgentPhase.WAITING:
                self._enter(AgentPhase.WAITING)
            return RunResult(state=WorkerState.HEALTHY)
        if not action.overrides_restarts:
            if not spent_by_torch:
                self._remaining_restarts -= 1
                return result
            self._enter(AgentPhase.FAILED)
            return result
        self.ending = decision
        if self._phase is not _ENDING_PHASES[action]:
            self._enter(_ENDING_PHASES[action])
        self._remaining_restarts = 0  # torch's loop then stops the workers instead of restarting
        return RunResult(state=WorkerState.FAILED, failures=result.failures)

    # ------------------------------------------------------------------ stopping

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        # torch's LocalElasticAgent._stop_workers is `self._shutdown()` with its default 30 s
        # (test_torch_hooks checks); our stops between cycles take --term-timeout instead, or
        # SIGKILL at once when this node leaves the job (WorkerStop.between_cycles says why).
        death_sig, timeout = self._stopper.between_cycles(leaving=self._phase is AgentPhase.EXCLUDED)
        self._shutdown(death_sig, timeout=timeout)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: float | None = None) -> None:
        """Stop the workers: ``death_sig`` to their process groups, SIGKILL after ``timeout`` s.

        torch calls this from its ``run`` with our ``--term-timeout`` (as ``shutdown_timeout``),
        also after a signal to the launcher (``death_sig`` is that signal), and we call it from
        :meth:`_stop_workers`. The wait to the fraction of a second, a stop signal the workers
        got themselves not sent again, torch's own ``_shutdown`` and the leftovers are
        :meth:`launcher.node.worker_stop.WorkerStop.stop`'s; :attr:`stopped_cleanly` tells how
        it ended. No ``timeout`` (torch < 2.12 calls it without one) means ``--term-timeout``.
        """
        stop_signal = self._stopper.settings.stop_signal
        if stop_signal is not None and stop_signal() == death_sig and self._phase in (AgentPhase.STARTING,
                                                                                   AgentPhase.RUNNING):
            # stopped by a signal to this launcher: say this node leaves before its ranks die, so
            # that its peers name a node that left, not a lost (bad) one (rule 0 of culprit)
            self._failures.publish_leaving(self.get_worker_group(), dict(self._cycle_workers.pids),
                                           f"its launcher got {death_sig.name}", bound=LEAVING_PUBLISH_BOUND)
        self.stopped_cleanly = self._stopper.stop(super()._shutdown, death_sig, timeout, self.cycle)

