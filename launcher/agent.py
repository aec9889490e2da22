"""``FaultTolerantAgent``: torch's ``LocalElasticAgent`` plus rank monitors and failure causes.

The agent reuses torch's template (rendezvous, start, monitor, restart, exit barrier) and fills
in four hooks:

- ``_start_workers``: replaces dead monitors, gives each worker its monitor's socket (through
  the per-rank environment, see ``_setup_local_watchdog``), tells each monitor its worker pid,
  and records the cycle.
- ``_monitor_workers``: after torch polls the processes, drains monitor events (hang causes),
  workload control requests and cross-node signals, and turns every failure into one log line
  and one event record saying why it happened and what happens next.
- ``_stop_workers`` / ``_shutdown``: after torch stops the workers, kills whatever they left
  (their process groups, orphans re-parented to the launcher).

Private hook signatures drift between torch releases; ``tests/unit/test_torch_hooks.py``
checks the ones we override against the pinned torch range.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from ft_core.env import (
    FT_CYCLE_ENV_VAR,
    FT_LAUNCHER_IPC_SOCKET_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)
from ft_core.workload_control import WorkloadAction
from launcher import processes
from launcher.control_server import ControlServer, ReceivedRequest
from launcher.events import EventLog, FailureRecord
from launcher.monitors import MonitorPool
from launcher.warm import ZYGOTE_SOCKET_ENV, WarmTemplate, warm_entrypoint, warm_start_delay

logger = logging.getLogger(__name__)

STORE_PREFIX = "ft_launcher/"
SHUTDOWN_KEY = STORE_PREFIX + "shutdown"
SHUTDOWN_ACK_KEY = STORE_PREFIX + "shutdown_ack"
STORE_CHECK_INTERVAL = 0.5
RESTART_GRACE_SECONDS = 2.0
"""After a worker failed, the others get SIGTERM and this long before SIGKILL."""

OUTCOME_SHUTDOWN = "shutdown_requested"
OUTCOME_EXCLUDED = "node_excluded"


class FaultTolerantAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` whose workers are watched by rank monitors.

    Args:
        spec, logs_specs, start_method, log_line_prefix_template, shutdown_timeout: As for
            ``LocalElasticAgent``.
        monitors: The node's started :class:`MonitorPool`.
        control: The launcher's :class:`ControlServer`.
        events: Where failure lines and records go.
        restart_policy: ``any-failed`` or ``min-healthy``.
        min_nodes: The minimum of ``--nnodes`` (used by ``min-healthy``).
        on_workers_started: Called after each worker start (the launcher re-asserts its
            signal handlers there, since torch installs its own).
        warm: The node's warm template; workers are then forked from it (see
            :mod:`launcher.warm`). None starts every worker cold, as torchrun does.
    """

    def __init__(
        self,
        spec: Any,
        logs_specs: Any,
        *,
        monitors: MonitorPool,
        control: ControlServer,
        events: EventLog,
        restart_policy: str = "any-failed",
        min_nodes: int = 1,
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
        shutdown_timeout: int = 30,
        on_workers_started: Callable[[], None] | None = None,
        warm: WarmTemplate | None = None,
    ) -> None:
        if warm is not None:
            command = warm_entrypoint(spec.entrypoint, spec.args)
            if command is None:
                logger.info("warm restarts need a Python entry point run by this interpreter; starting cold")
                warm = None
            else:
                spec.entrypoint, spec.args = command
        self._warm = warm
        # torch's loop sleeps monitor_interval before each _monitor_workers call; we make that
        # sleep negligible and instead wait in _monitor_workers for the first of: a worker
        # exit (pidfd), a monitor report, a control request, or the interval.
        self._poll_interval = spec.monitor_interval
        spec.monitor_interval = 0.001
        super().__init__(
            spec=spec,
            logs_specs=logs_specs,
            start_method=start_method,
            log_line_prefix_template=log_line_prefix_template,
            shutdown_timeout=shutdown_timeout,
        )
        self._monitors = monitors
        self._on_workers_started = on_workers_started
        self._control = control
        self._events = events
        self._restart_policy = restart_policy
        self._min_nodes = min_nodes
        self.cycle = -1
        self.outcome: str | None = None
        self._phase_started = time.monotonic()
        self._last_failure_at: float | None = None
        self._rendezvous_s: float | None = None
        self._hangs: dict[int, dict[str, Any]] = {}  # by local rank
        self._worker_pids: dict[int, int] = {}
        self._awaiting_ready: set[int] = set()
        self._cycle_started_at = 0.0
        self._next_store_check = 0.0
        self._unhealthy_wait: RunResult | None = None
        self._pidfds: dict[int, int] = {}
        self._stopped_by_us: set[int] = set()

    # ------------------------------------------------------------------ starting

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        started = time.monotonic()
        super()._rendezvous(worker_group)
        self._rendezvous_s = time.monotonic() - started

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.cycle += 1
        self._unhealthy_wait = None
        for local_rank, exit_code in self._monitors.replace_dead():
            logger.warning("replaced the rank monitor of local rank %s (it had exited with %s)",
                           local_rank, exit_code)
            self._events.record("monitor_replaced", cycle=self.cycle, local_rank=local_rank,
                                exit_code=exit_code)
        warm_ready = False
        if self._warm is not None:
            exit_code = self._warm.forget_if_dead()
            if exit_code is not None:
                self._events.record("warm_template_replaced", cycle=self.cycle, exit_code=exit_code)
            was_ready = self._warm.status is not None
            status = self._warm.poll_ready()
            warm_ready = status is not None and self._warm.alive()
            if status is not None and not was_ready:
                self._events.record("warm_template_ready", cycle=self.cycle, pid=self._warm.pid, **status)
        self._hangs.clear()
        self._stopped_by_us.clear()
        pids = super()._start_workers(worker_group)
        spawned_at = time.monotonic()
        self._worker_pids = dict(pids)
        self._open_pidfds()
        for worker in worker_group.workers:
            pid = pids[worker.local_rank]
            self._monitors.worker_started(worker.local_rank, pid, self.cycle, worker.global_rank)
        self._control.set_workers(list(pids.values()))
        self._awaiting_ready = set(pids)
        self._cycle_started_at = spawned_at
        since_failure = None if self._last_failure_at is None else spawned_at - self._last_failure_at
        self._events.record(
            "cycle_start",
            cycle=self.cycle,
            restart_count=worker_group.spec.max_restarts - self._remaining_restarts,
            group_rank=worker_group.group_rank,
            group_world_size=worker_group.group_world_size,
            ranks={str(w.local_rank): w.global_rank for w in worker_group.workers},
            worker_pids={str(k): v for k, v in pids.items()},
            rendezvous_s=_round(self._rendezvous_s),
            spawn_s=_round(spawned_at - self._phase_started),
            since_failure_s=_round(since_failure),
            warm_start=warm_ready,
        )
        self._last_failure_at = None
        logger.info("cycle %s: started workers %s", self.cycle, sorted(pids.values()))
        if self._on_workers_started is not None:
            self._on_workers_started()
        return pids

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        # torch builds each worker's environment and hands it to this hook right before the
        # processes start: the one place to add per-rank variables without copying torch code.
        super()._setup_local_watchdog(envs)
        for local_rank, env in envs.items():
            env[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = self._monitors.socket_path(local_rank)
            env[FT_LAUNCHER_IPC_SOCKET_ENV_VAR] = self._control.path
            env[FT_CYCLE_ENV_VAR] = str(self.cycle)
            if self._warm is not None:
                env[ZYGOTE_SOCKET_ENV] = self._warm.socket_path

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        self._phase_started = time.monotonic()
        if self._last_failure_at is None:
            # Not our failure: another node restarted or joined (torch saw nodes waiting).
            self._events.record("restart", cycle=self.cycle, reason="another node entered the rendezvous")
        super()._restart_workers(worker_group)

    # ------------------------------------------------------------------ monitoring

    def _open_pidfds(self) -> None:
        self._close_pidfds()
        for pid in self._worker_pids.values():
            with contextlib.suppress(OSError):
                self._pidfds[pid] = os.pidfd_open(pid)

    def _close_pidfds(self) -> None:
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()

    def _wait_for_activity(self) -> None:
        """Block up to the monitor interval, returning early when anything happens."""
        with selectors.DefaultSelector() as selector:
            for fd in [*self._pidfds.values(), *self._monitors.filenos(), self._control.notify_fileno()]:
                with contextlib.suppress(ValueError, KeyError, OSError):
                    selector.register(fd, selectors.EVENT_READ)
            selector.select(self._poll_interval)
        self._control.clear_notify()

    def _maybe_start_warm_template(self) -> None:
        """Start the template once this cycle's workers are up (see :mod:`launcher.warm`)."""
        warm = self._warm
        if warm is None or warm.started:
            return
        if not self._awaiting_ready or time.monotonic() >= self._cycle_started_at + warm_start_delay():
            warm.start()
            self._events.record("warm_template_started", cycle=self.cycle, pid=warm.pid)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self._wait_for_activity()
        self._maybe_start_warm_template()
        if self._unhealthy_wait is not None:
            return self._wait_while_unhealthy(worker_group)
        # A worker that failed before torch's poll: stop the others ourselves (fast) and
        # remember them, so their deaths are recorded as consequences, not causes.
        statuses = {pid: processes.peek_exit_status(pid) for pid in self._worker_pids.values()}
        if any(status not in (None, 0) for status in statuses.values()):
            # torch would SIGTERM the others and wait 30 s for them; a worker whose peer died is
            # often stuck in a collective (or in a SIGTERM handler that runs one), so give them
            # a short grace and then SIGKILL, for a fast restart.
            survivors = [pid for pid, status in statuses.items() if status is None]
            self._stopped_by_us.update(survivors)
            processes.terminate_groups(survivors, self._pidfds, RESTART_GRACE_SECONDS)
        result = super()._monitor_workers(worker_group)
        # Monitors report a hang before they signal the rank, so every hang behind a death
        # seen above is in these events.
        for local_rank, event in self._monitors.poll_events():
            self._on_monitor_event(local_rank, event)
        requests = self._drain_control_requests()
        self._check_store()
        if self.outcome is not None:
            return self._stop_for_outcome(worker_group, result, requests)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            return self._on_failure(worker_group, result)
        if result.state == WorkerState.SUCCEEDED:
            self._events.record("workers_succeeded", cycle=self.cycle)
        return result

    def _on_monitor_event(self, local_rank: int, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "rank_hang":
            # Keyed by local rank: with warm starts torch knows the trampoline's pid, the
            # monitor the forked worker's.
            self._hangs[local_rank] = event
        elif kind == "rank_connected" and local_rank in self._awaiting_ready:
            self._awaiting_ready.discard(local_rank)
            if not self._awaiting_ready:
                ready_s = time.monotonic() - self._phase_started
                self._events.record("workers_ready", cycle=self.cycle, ready_s=_round(ready_s))
        elif kind == "monitor_lost":
            logger.error(
                "the rank monitor of local rank %s exited (code %s); that rank is not watched "
                "until the next cycle, when the monitor is replaced", local_rank, event.get("exit_code"),
            )
            self._events.record("monitor_died", cycle=self.cycle, local_rank=local_rank,
                                exit_code=event.get("exit_code"))

    def _on_failure(self, worker_group: WorkerGroup, result: RunResult) -> RunResult:
        self._last_failure_at = time.monotonic()
        spec = worker_group.spec
        # A peer's ShutdownWorkload often reaches us as a failed collective first.
        self._next_store_check = 0.0
        self._check_store()
        if self.outcome is not None:
            return self._stop_for_outcome(worker_group, result, [])
        if self._restart_policy == "min-healthy" and worker_group.group_world_size > 1:
            decision = self._enter_unhealthy_wait(worker_group)
            if decision is not None:
                self._log_failures(worker_group, result, decision)
                return RunResult(state=WorkerState.HEALTHY)
        if self._remaining_restarts > 0:
            done = spec.max_restarts - self._remaining_restarts + 1
            decision = f"restarting the worker group (restart {done}/{spec.max_restarts})"
        else:
            decision = f"no restarts left (--max-restarts={spec.max_restarts}); stopping"
        self._log_failures(worker_group, result, decision)
        return result

    def _log_failures(self, worker_group: WorkerGroup, result: RunResult, decision: str) -> None:
        records = self._failure_records(worker_group, result)
        if not records:
            records = [FailureRecord(self.cycle, None, -1, None, "worker group unhealthy", "unhealthy", time.time())]
        for record in records:
            self._events.failure(record, decision if record.kind != "terminated" else "stopped by the launcher")

    def _failure_records(self, worker_group: WorkerGroup, result: RunResult) -> list[FailureRecord]:
        """Turn torch's failures into records; root causes first."""
        by_rank = {w.global_rank: w for w in worker_group.workers}
        # torch's own poll SIGTERMs the survivors when it sees a failure we had not peeked yet;
        # a SIGTERM beside any other cause is that consequence, not a second root cause.
        other_causes = any(f.exitcode != -signal.SIGTERM for f in result.failures.values())
        records = []
        for global_rank, failure in result.failures.items():
            worker = by_rank.get(global_rank)
            local_rank = worker.local_rank if worker is not None else failure.local_rank
            hang = self._hangs.get(local_rank)
            detail: dict[str, Any] = {"exit_code": failure.exitcode}
            if hang is not None:
                kind, cause = "hang", hang["cause"]
                detail.update(hang_kind=hang["kind"], section=hang.get("section"),
                              elapsed=hang["elapsed"], timeout=hang["timeout"], signal=hang["signal"])
                detected_at = hang["detected_at"]
            else:
                if failure.pid in self._stopped_by_us or (failure.exitcode == -signal.SIGTERM and other_causes):
                    kind = "terminated"
                    cause = f"stopped after another worker failed ({_exit_text(failure.exitcode)})"
                elif failure.exitcode < 0:
                    kind, cause = "signal", _exit_text(failure.exitcode)
                else:
                    kind, cause = "exit", _exit_text(failure.exitcode)
                detected_at = time.time()
                message = getattr(failure, "message", "")
                if isinstance(message, dict):  # torch's @record stores {"message": ..., "extraInfo": ...}
                    message = str(message.get("message", ""))
                if isinstance(message, str) and message and not message.startswith(("To enable traceback", "Signal ")):
                    detail["error"] = message[:1000]
            records.append(FailureRecord(self.cycle, global_rank, local_rank, failure.pid, cause, kind,
                                         detected_at, detail))
        records.sort(key=lambda r: (r.kind == "terminated", r.kind != "hang", r.detected_at, r.local_rank))
        return records

    # ------------------------------------------------------------------ workload control

    def _drain_control_requests(self) -> list[ReceivedRequest]:
        received = []
        while True:
            try:
                item = self._control.requests.get_nowait()
            except Exception:  # queue.Empty
                break
            received.append(item)
            action = item.request.action
            self._events.record(
                "control_request", cycle=self.cycle, action=action.name,
                description=item.request.description, sender_pid=item.sender_pid, rank=item.rank,
            )
            logger.warning("rank %s (pid %s) requested %s: %s", item.rank, item.sender_pid,
                           action.name, item.request.description or "(no reason given)")
            if action is WorkloadAction.ShutdownWorkload:
                self.outcome = OUTCOME_SHUTDOWN
                self._publish_shutdown(item)
            elif action is WorkloadAction.ExcludeThisNode and self.outcome is None:
                self.outcome = OUTCOME_EXCLUDED
        return received

    def _publish_shutdown(self, item: ReceivedRequest) -> None:
        store = self._store
        if store is None:
            return
        try:
            store.set(SHUTDOWN_KEY, json.dumps({
                "node": self._events.node, "rank": item.rank, "description": item.request.description,
            }))
        except Exception as err:  # the store may be gone with its host node
            logger.warning("could not tell the other nodes about the shutdown request: %s", err)

    def _check_store(self) -> None:
        """Learn about a ShutdownWorkload requested on another node (at most every 0.5 s)."""
        now = time.monotonic()
        if self.outcome is not None or self._store is None or now < self._next_store_check:
            return
        self._next_store_check = now + STORE_CHECK_INTERVAL
        try:
            if not self._store.check([SHUTDOWN_KEY]):
                return
            info = json.loads(self._store.get(SHUTDOWN_KEY))
        except Exception as err:
            logger.debug("store check failed: %s", err)
            return
        self.outcome = OUTCOME_SHUTDOWN
        with contextlib.suppress(Exception):
            self._store.add(SHUTDOWN_ACK_KEY, 1)
        self._events.record("control_request", cycle=self.cycle, action="ShutdownWorkload",
                            description=info.get("description", ""), rank=info.get("rank"),
                            from_node=info.get("node"))
        logger.warning("node %s requested ShutdownWorkload: %s", info.get("node"), info.get("description"))

    def _stop_for_outcome(self, worker_group: WorkerGroup, result: RunResult,
                          requests: list[ReceivedRequest]) -> RunResult:
        decision = ("ShutdownWorkload requested: stopping all workers, no restart"
                    if self.outcome == OUTCOME_SHUTDOWN
                    else "ExcludeThisNode requested: stopping this node's workers and leaving the job")
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            self._log_failures(worker_group, result, decision)
        else:
            logger.warning("%s", decision)
        self._remaining_restarts = 0
        return RunResult(state=WorkerState.FAILED, failures=result.failures)

    # ------------------------------------------------------------------ min-healthy

    def _unhealthy_key(self, group_rank: int) -> str:
        return f"{STORE_PREFIX}unhealthy/{group_rank}"

    def _healthy_nodes(self, worker_group: WorkerGroup) -> int | None:
        keys = [self._unhealthy_key(r) for r in range(worker_group.group_world_size)]
        try:
            unhealthy = sum(1 for key in keys if self._store.check([key]))
        except Exception as err:
            logger.warning("cannot read node health from the store: %s", err)
            return None
        return worker_group.group_world_size - unhealthy

    def _enter_unhealthy_wait(self, worker_group: WorkerGroup) -> str | None:
        """Mark this node unhealthy; return the decision text if the others keep running."""
        try:
            self._store.set(self._unhealthy_key(worker_group.group_rank), str(self.cycle))
        except Exception as err:
            logger.warning("cannot publish node health: %s", err)
            return None
        healthy = self._healthy_nodes(worker_group)
        if healthy is None or healthy < self._min_nodes:
            return None
        self._unhealthy_wait = RunResult(state=WorkerState.FAILED)
        return (f"min-healthy: {healthy} healthy node(s) >= minimum {self._min_nodes}; "
                "this node's workers are not restarted for now")

    def _wait_while_unhealthy(self, worker_group: WorkerGroup) -> RunResult:
        healthy = self._healthy_nodes(worker_group)
        if healthy is not None and healthy < self._min_nodes:
            self._events.record("min_healthy_restart", cycle=self.cycle, healthy_nodes=healthy,
                                min_nodes=self._min_nodes)
            logger.warning("min-healthy: only %s healthy node(s) left (< %s); restarting the workload",
                           healthy, self._min_nodes)
            self._unhealthy_wait = None
            return RunResult(state=WorkerState.FAILED)
        return RunResult(state=WorkerState.HEALTHY)

    # ------------------------------------------------------------------ stopping

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        super()._stop_workers(worker_group)
        self._close_pidfds()
        self._reap_leftovers()

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        # torch's _stop_workers calls _shutdown() with its default 30 s; --term-timeout rules.
        super()._shutdown(death_sig, self._shutdown_timeout)
        self._close_pidfds()
        self._reap_leftovers()

    def _reap_leftovers(self) -> None:
        """Kill what workers left behind: their process groups and re-parented orphans."""
        killed = processes.kill_leftovers(
            worker_pids=list(self._worker_pids.values()), keep=set(self._monitors.pids()),
            keep_alone={self._warm.pid} if self._warm is not None and self._warm.pid else set(),
        )
        if killed:
            logger.warning("killed %s process(es) left behind by workers: %s", len(killed), sorted(killed))
            self._events.record("leftovers_killed", cycle=self.cycle, pids=sorted(killed))

    def forward_signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every worker's process group (e.g. SLURM's SIGUSR1 warning)."""
        for pid in self._worker_pids.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        self._events.record("signal_forwarded", cycle=self.cycle, signal=sig.name,
                            worker_pids=sorted(self._worker_pids.values()))


def _exit_text(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
