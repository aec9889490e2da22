"""Our short ``launch_agent``: torch's building blocks, our agent, one run object that cleans up.

torch's ``launch_agent`` hard-codes ``LocalElasticAgent``, so :func:`launch` builds the rendezvous
handler and ``WorkerSpec`` itself (:mod:`launcher.launch_config`, from the ``LaunchConfig`` that
torchrun's own ``config_from_args`` produced) and runs :class:`FaultTolerantAgent`.

:class:`LauncherRun` is one run of the launcher on this node. It owns the private run
directory, the event log, the sentinel, signal handling, the monitors, the warm template, the
control socket and the rendezvous. Each of them registers its release in the run's
``ExitStack`` when it is created, and every way out ends in the same place (:meth:`LauncherRun._end`):
what is left of the run killed, the run directory removed, the result recorded, the sentinel
told. The main thread gets there by releasing the stack, newest first; a forced stop (a third
stop signal, or a stop that takes too long) and a lost rendezvous store get there from their own
thread, at once, and end the process. Whichever takes the end first owns it. Nothing started
here outlives the launcher: its clean-up (which a second stop signal does not cut short), the
forced stop, and the sentinel (:mod:`launcher.node.sentinel`) if the launcher itself is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic import metrics
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous.api import RendezvousError

from ft_core.wire import protocol
from ft_core.wire.config import FaultToleranceConfig
from ft_core.wire.env import AUTORESUME_ATTEMPT_ENV_VAR, FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, FT_LAUNCHER_RUN_ENV_VAR
from ft_core.wire.osutil import STEP_SIGNALS, set_child_subreaper, set_parent_death_signal
from launcher import exit_codes
from launcher.agent import FaultTolerantAgent, NodeParts
from launcher.attempt_result import write_result
from launcher.decision.decide import OUTCOME_REPEATED, Action
from launcher.decision.restart_policy import RestartPolicy
from launcher.events.log import EventLog
from launcher.events.records import GracefulStopped, LauncherStart, MonitorsStarted, Result, StoreLost
from launcher.exit_codes import LauncherUsageError
from launcher.launch_config import (
    StartFailed,
    close_rendezvous,
    create_rendezvous_handler,
    format_rdzv_conf,
    launch_config_value,
    plan_rendezvous,
    read_launch_config,
    start_store_watchdog,
    worker_spec,
)
from launcher.node import processes
from launcher.node.check import NodeCheckFailed
from launcher.node.control_server import ControlServer
from launcher.node.environment import RunEnvironment, set_up_environment
from launcher.node.monitors import MonitorPool
from launcher.node.sentinel import HelperPids, Sentinel
from launcher.node.signals import JOB_WIDE_WINDOW, SignalHandling
from launcher.node.worker_stop import StopSettings
from launcher.options import LauncherOptions, config_sources
from launcher.rendezvous import master_port, membership, store_counter
from launcher.rendezvous import plugin as rendezvous_plugin
from launcher.rendezvous import poll as rendezvous_poll
from launcher.warm.cold import ColdStart, StartCoordinator
from launcher.warm.coordinator import WarmCoordinator, WarmTemplate

logger = logging.getLogger(__name__)

SHUTDOWN_ACK_TIMEOUT = 10.0
FALLBACK_TMP = "/tmp"
"""Where the run directory goes when ``$TMPDIR`` is unfit (see :func:`make_run_dir`)."""
FORCED_STOP_TIMEOUT = 60.0
"""How long the main thread's clean-up waits for a forced stop that took over to end the process."""
STOP_GRACE_MARGIN = 30.0
"""A stop by signal may take ``--term-timeout`` plus this long before it is forced."""


def rendezvous_error_text(err: BaseException) -> str:
    """``err``'s message; for torch's rendezvous errors raised without one, what happened and what
    to do (a bare ``RendezvousTimeoutError: `` told a user nothing)."""
    text = str(err).strip()
    if text:
        return text
    name = type(err).__name__
    if name == "RendezvousTimeoutError":
        return ("the round did not form within join_timeout (--rdzv-conf join_timeout, 600 s by "
                "default): fewer nodes than --nnodes (MIN) joined, e.g. a node was lost or never "
                "started; check the other nodes, and use --nnodes MIN:MAX to go on without a lost node")
    if name == "RendezvousClosedError":
        return ("the rendezvous was closed by another node (the job finished or stopped there, or its "
                "launcher gave up), so this node cannot join another round; see that node's log for why")
    return "no message (see the other nodes' logs)"


@dataclass(frozen=True)
class LauncherExit:
    """How the launcher ends.

    Attributes:
        exit_code: The launcher's exit code (:mod:`launcher.exit_codes`).
        hard_exit: A thread of ours or torch's may still be inside torch's C++ store client (the
            rendezvous-setup thread was abandoned, or the rendezvous was left open for the other
            nodes: torch's keep-alive thread still runs). Finalising the interpreter under such
            a thread aborts the process (``terminate called without an active exception``, exit
            -6), so the caller must leave with ``os._exit`` (the run is cleaned up already).
    """

    exit_code: int
    hard_exit: bool = False


@dataclass(frozen=True)
class _Result:
    """What the event log and autoresume's result file get: the outcome and the exit code."""

    outcome: str
    exit_code: int


def launch(args: argparse.Namespace, ft_cfg: FaultToleranceConfig, options: LauncherOptions) -> LauncherExit:
    """Run the workers under fault tolerance on this node; every resource of the run is released.

    Args:
        args: torchrun's parsed arguments (read only for torchrun's own options).
        ft_cfg: The fault tolerance config the monitors enforce.
        options: The launcher's own options.

    Raises:
        LauncherUsageError: The arguments or the launcher's environment cannot be run; nothing was
            started (and what was prepared is removed again).
    """
    return LauncherRun(args, ft_cfg, options).run()


class LauncherRun:
    """One run of ``ft_launcher`` on this node, from the run directory to the recorded result.

    The run's parts, in the order they are created (each registers its release then):

    ========================  =================================================
    run directory             removed
    run environment           autoresume's lock descriptor closed
    event log                 closed
    signal handling           closed (the handlers ignore signals from then on)
    sentinel                  :meth:`_end`: the end every way out shares
    store watchdog            stopped
    control socket            closed
    warm template             stopped
    monitors                  stopped
    ========================  =================================================

    The rendezvous is closed (or left open for the other nodes) as soon as the agent is done, not
    at the teardown: the other nodes wait for it.
    """

    def __init__(self, args: argparse.Namespace, ft_cfg: FaultToleranceConfig, options: LauncherOptions) -> None:
        self._args = args
        self._ft_cfg = ft_cfg
        self._options = options
        self._releases = contextlib.ExitStack()
        self._end_owner = threading.Lock()
        """Held by whoever ends the run: the main thread's teardown or a forced end."""
        self._result = _Result("failed", exit_codes.EXIT_FAILURE)
        self._run_dir = ""
        self._result_file: str | None = None
        self._events: EventLog | None = None
        self._sentinel: Sentinel | None = None
        self._signals: SignalHandling | None = None
        self._workers: processes.WorkerProcesses | None = None
        self._helpers = HelperPids()
        """The current pids of the run's helpers started again when they die (the sentinel)."""
        self._agent: FaultTolerantAgent | None = None
        self._stuck_threads: list[threading.Thread] = []
        self._rendezvous_left_open = False

    def run(self) -> LauncherExit:
        """Prepare, start, supervise and tear down the run; see :func:`launch`."""
        try:
            config, entrypoint, entry_args, env = self._prepare()
        except BaseException:
            self._releases.close()
            raise
        result = _Result("failed", exit_codes.EXIT_FAILURE)  # an unexpected error on the way
        try:
            result = self._start_and_supervise(config, entrypoint, entry_args, env)
        finally:
            self._teardown(result)
        return LauncherExit(result.exit_code, hard_exit=self._rendezvous_left_open
                       or any(thread.is_alive() for thread in self._stuck_threads))

    # ------------------------------------------------------------------ preparing (nothing runs yet)

    def _prepare(self) -> tuple[Any, Any, list[str], RunEnvironment]:
        """The run directory, torchrun's config, the environment and the event log.

        Raises:
            LauncherUsageError: Before any process of the run started.
        """
        self._run_dir = make_run_dir()
        self._releases.callback(shutil.rmtree, self._run_dir, ignore_errors=True)
        config, entrypoint, entry_args = read_launch_config(self._args, self._run_dir)
        env = set_up_environment(launch_config_value(config, "signals_to_handle"))
        self._result_file = env.result_file
        if env.keep_fd is not None:
            self._releases.callback(_close_quietly, env.keep_fd)
        self._events = EventLog(self._options.event_log, run_id=config.run_id)
        self._releases.callback(self._events.close)
        return config, entrypoint, entry_args, env

    # ------------------------------------------------------------------ starting and supervising

    def _start_and_supervise(self, config: Any, entrypoint: Any, entry_args: list[str],
                             env: RunEnvironment) -> _Result:
        try:
            return self._supervise(*self._start(config, entrypoint, entry_args, env))
        except SignalException as err:  # arrived before the agent ran (e.g. while monitors started)
            return self._stopped_by(err.sigval)
        except StartFailed as err:
            logger.error("%s", err)
            if err.stuck_thread is not None:
                self._stuck_threads.append(err.stuck_thread)
            return _Result(err.outcome, err.exit_code)

    def _start(self, config: Any, entrypoint: Any, entry_args: list[str],
               env: RunEnvironment) -> tuple[FaultTolerantAgent, Any, Any]:
        """Start every part of the run and build the agent; returns it, the rendezvous handler
        and the store watchdog (or None).

        Raises:
            StartFailed: The rendezvous settings or the rendezvous itself.
            SignalException: A stop signal arrived meanwhile.
        """
        assert self._events is not None
        events, options = self._events, self._options
        term_timeout = options.stop_timeout(launch_config_value(config, "shutdown_timeout"))
        workers = self._workers = processes.WorkerProcesses(config.nproc_per_node)
        sentinel, signals = self._start_guards(env, term_timeout)
        # torch's LaunchConfig is not edited: the plan holds a new one for torch, without our keys
        plan = plan_rendezvous(config)
        config, poll_interval = plan.config, plan.poll_interval
        if plan.defaulted:
            logger.info("rendezvous settings: %s (defaults of ft_launcher: %s; --rdzv-conf overrides)",
                        format_rdzv_conf(config), ",".join(sorted(plan.defaulted)))
        events.record_event(LauncherStart(
            nnodes=f"{config.min_nodes}:{config.max_nodes}",
            nproc_per_node=config.nproc_per_node, max_restarts=config.max_restarts,
            restart_policy=self._ft_cfg.restart_policy, rdzv_backend=config.rdzv_backend,
            run_id=config.run_id, config=self._ft_cfg.to_dict(), entrypoint=str(entrypoint),
            config_sources=config_sources(self._args), event_log_source=options.event_log_source,
            attempt=os.environ.get(AUTORESUME_ATTEMPT_ENV_VAR),
            sentinel_pid=sentinel.pid, rdzv_conf=dict(config.rdzv_configs),
            rdzv_poll_interval=poll_interval,
        ))
        polls_faster = self._change_torch(poll_interval)
        rdzv_handler = create_rendezvous_handler(config)
        if store_counter.install(rdzv_handler):  # FT_STORE_COUNTS: a debug counter for bench/scale.py
            self._releases.callback(store_counter.flush)
        if poll_interval is not None and polls_faster:
            rendezvous_poll.apply_to_handler(rdzv_handler, poll_interval)
            logger.info("rendezvous: waiting nodes read the store every %.2f s (--rdzv-conf %s=S)",
                        poll_interval, rendezvous_poll.POLL_INTERVAL_KEY)
        # waiting nodes that cannot fit (or, under min-healthy, any new node) stay spares
        rdzv_handler = membership.wrap(rdzv_handler, self._ft_cfg.restart_policy)
        watchdog = start_store_watchdog(config, plan.store_lost_after, self._store_lost)
        if watchdog is not None:
            self._releases.callback(watchdog.stop)
        control = ControlServer(os.path.join(self._run_dir, "launcher.sock"))
        self._releases.callback(control.close)
        spec = worker_spec(config, entrypoint, entry_args, rdzv_handler)
        starts = self._start_coordinator(spec)
        # Stack files go next to the event log, when there is one.
        stacks_dir = os.path.join(os.path.dirname(os.path.abspath(events.path)), "ft_stacks") if events.path else None
        monitors = MonitorPool(self._ft_cfg, self._run_dir, config.nproc_per_node, stacks_dir=stacks_dir)
        monitors.start()
        self._releases.callback(monitors.stop)
        events.record_event(MonitorsStarted(monitor_pids=monitors.pids()))
        self._agent = FaultTolerantAgent(
            spec, config.logs_specs, ft_cfg=self._ft_cfg,
            restart_policy=RestartPolicy(self._ft_cfg.restart_policy, config.min_nodes),
            parts=NodeParts(monitors=monitors, control=control, events=events, starts=starts, workers=workers),
            stop=StopSettings(term_timeout=term_timeout, workers_stop_timeout=options.workers_stop_timeout,
                              reassert_signal_handlers=signals.reinstall,
                              stop_signal_delivered=signals.stop_delivered, helper_pids=self._helpers,
                              stop_signal=lambda: signals.first_stop),
            start_method=config.start_method, log_line_prefix_template=config.log_line_prefix_template,
        )
        metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
        return self._agent, rdzv_handler, watchdog

    def _change_torch(self, poll_interval: float | None) -> bool:
        """Put the launcher's changes into torch for this run; its teardown undoes them (also after
        an error): torch is changed only while a launcher runs, never by importing a module.

        - torch's rendezvous picks the workers' store port below the ephemeral range
          (:mod:`launcher.rendezvous.master_port`);
        - waiting nodes poll the c10d rendezvous every ``poll_interval`` (None: torch's pace;
          :mod:`launcher.rendezvous.poll`);
        - ``--rdzv-backend ft-barrier`` is registered in torch's handler registry. That one stays:
          the registry has no way to remove an entry, and torch registers the same creator itself
          from our ``torchrun.handlers`` entry point wherever the package is installed.

        Returns:
            Whether the poll interval is in place.
        """
        rendezvous_plugin.register()
        self._releases.enter_context(master_port.installed())
        if poll_interval is None:
            return False
        return self._releases.enter_context(rendezvous_poll.installed(poll_interval))

    def _start_guards(self, env: RunEnvironment, term_timeout: float) -> tuple[Sentinel, SignalHandling]:
        """Start what guarantees the run's end, before anything else of the run: the sentinel
        (the end of every way out is registered with it) and the signal handling."""
        # A sentinel that dies is started again: each one is kept off the leftover clean-ups.
        sentinel = self._sentinel = Sentinel(self._run_dir, FT_LAUNCHER_RUN_ENV_VAR, env.token, STEP_SIGNALS,
                                             keep_fds=() if env.keep_fd is None else (env.keep_fd,),
                                             on_start=lambda pid: self._helpers.set("sentinel", pid))
        signals = self._signals = SignalHandling(
            route=self._route_signal, force=self._forced_stop,
            job_wide=lambda sig, received_at: sentinel.saw(sig, received_at, JOB_WIDE_WINDOW),
            grace_seconds=term_timeout + STOP_GRACE_MARGIN,
        )
        set_child_subreaper()
        self._releases.callback(signals.close)  # after the end: a third stop signal still forces until then
        self._releases.callback(self._end)
        sentinel.start()
        signals.install()
        if env.parent_pid is not None:
            # scripts/autoresume.sh: stop (as on SIGTERM) when it dies, even by SIGKILL.
            set_parent_death_signal(signal.SIGTERM)
            if os.getppid() != env.parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
        return sentinel, signals

    def _start_coordinator(self, spec: Any) -> StartCoordinator:
        """The warm template's coordinator when warm restarts are on and ``spec`` can use them
        (its command is rewritten then), else cold starts, as torchrun does."""
        if not self._options.warm_restarts:
            return ColdStart()
        assert self._events is not None
        warm = WarmCoordinator(WarmTemplate(os.path.join(self._run_dir, "warm.sock"), list(self._options.warm_preload)),
                               self._events, self._options.warm_start_delay)
        if not warm.adopt(spec):
            return ColdStart()
        self._releases.callback(warm.stop)
        return warm

    def _supervise(self, agent: FaultTolerantAgent, rdzv_handler: Any, watchdog: Any) -> _Result:
        """Run the agent; decide the result; close the rendezvous unless the others need it open."""
        close = True
        result = _Result("failed", exit_codes.EXIT_FAILURE)
        try:
            run_result = agent.run()
        except SignalException as err:
            close = False  # keep the rendezvous open for the other nodes' restarts
            result = self._stopped_by(err.sigval)
        except RendezvousError as err:
            logger.error("rendezvous failed: %s: %s", type(err).__name__, rendezvous_error_text(err))
            result = _Result("rendezvous failed", exit_codes.EXIT_FAILURE)
        except NodeCheckFailed as err:
            close = False  # the other nodes go on without this one (a spare takes its place)
            logger.error("the node check failed, so this node does not join the job: %s; leaving (exit %s, as "
                         "for ExcludeThisNode: scripts/autoresume.sh excludes the node at its next requeue)",
                         err, exit_codes.EXIT_NODE_EXCLUDED)
            result = _Result("node check failed", exit_codes.EXIT_NODE_EXCLUDED)
        else:
            ending = agent.ending  # the agent's decision that ended the run (launcher.decision.decide)
            if ending is not None and ending.outcome is not None and ending.exit_code is not None:
                if ending.action is Action.SHUTDOWN:
                    # keep the store (hosted here with c10d) up until the other nodes saw the request
                    agent.wait_for_shutdown_acks(SHUTDOWN_ACK_TIMEOUT)
                elif ending.action is Action.LEAVE:
                    close = False  # closing it would end the job for the remaining nodes
                result = _Result(ending.outcome, ending.exit_code)
            elif run_result is not None and not run_result.is_failed():
                # a run that stopped gracefully (e.g. on SLURM's SIGUSR1 warning) did not succeed:
                # it is unfinished; exit 0 all the same (autoresume.sh continues it)
                result = _Result(graceful_stop_outcome(agent.graceful_stops()) or "succeeded", exit_codes.EXIT_SUCCESS)
        finally:
            if watchdog is not None:
                watchdog.stop()
            if close:
                close_rendezvous(rdzv_handler)
            else:
                # torch's rendezvous keeps a keep-alive thread that calls into the C++ store
                # (see LauncherExit.hard_exit).
                self._rendezvous_left_open = True
        return result

    def _stopped_by(self, sig: signal.Signals) -> _Result:
        """A stop by signal (a preemption): exit 0 if every worker exited 0 within
        ``--term-timeout`` (or none was running), else 1."""
        clean = self._agent is None or self._agent.stopped_cleanly
        stopped = graceful_stop_outcome(self._agent.graceful_stops()) if clean and self._agent is not None else None
        return _Result(stopped or f"signal {sig.name}", exit_codes.EXIT_SUCCESS if clean else exit_codes.EXIT_FAILURE)

    def _route_signal(self, sig: signal.Signals, job_wide: bool, received_at: float | None = None) -> None:
        # Signal thread: a relayed signal (SIGUSR1, ...) for the workers.
        if self._agent is not None:
            self._agent.forward_signal(sig, job_wide, received_at)
        elif self._workers is not None:  # before the agent exists: queued for the first workers
            self._workers.route(sig, job_wide, received_at)

    # ------------------------------------------------------------------ the ways out

    def _teardown(self, result: _Result) -> None:
        """The main thread's way out, whatever happened: every release, newest first, then the end."""
        self._result = result
        if self._signals is not None:
            # From here on a stop signal does not interrupt: the clean-up runs to its end (a
            # third stop signal forces it on the signal thread, which leaves nothing behind either).
            self._signals.begin_cleanup()
        if self._workers is not None:
            dropped = self._workers.discard_queued()
            if dropped:
                logger.info("signals queued for workers that never came: %s", dropped)
        self._releases.close()

    def _end(self) -> None:
        """The end of the main thread's teardown (registered with the sentinel, before it starts)."""
        if not self._end_owner.acquire(blocking=False):
            time.sleep(FORCED_STOP_TIMEOUT)  # a forced stop is ending the process; it exits 128+N
        self._finish(self._result, summary=True)

    def _forced_stop(self, sig: signal.Signals) -> None:
        # Signal thread: a third stop signal, or the graceful stop did not finish in time.
        # Everything of the run goes now; the sentinel (kept) sweeps once more when told.
        if not self._end_owner.acquire(blocking=False):
            logger.warning("the clean-up is finishing already; not forcing it")
            return
        self._finish_and_exit(_Result(f"forced stop ({sig.name})", exit_codes.EXIT_SIGNAL_BASE + int(sig)))

    def _store_lost(self, why: str) -> None:
        # Watchdog thread: the store's host is gone; the main thread may be stuck in a store call
        # for minutes (a silent host), so end everything from here, as a forced stop does.
        if not self._end_owner.acquire(blocking=False):
            return
        sys.stderr.write(f"[ft_launcher] {why}: the rendezvous cannot go on; stopping every process of this "
                         f"node (exit {exit_codes.EXIT_FAILURE})\n")
        sys.stderr.flush()
        assert self._events is not None
        self._events.record_event(StoreLost(reason=why))
        self._finish_and_exit(_Result("rendezvous store lost", exit_codes.EXIT_FAILURE))

    def _finish_and_exit(self, result: _Result) -> None:
        self._finish(result, summary=False)
        logging.shutdown()
        os._exit(result.exit_code)

    def _finish(self, result: _Result, summary: bool) -> None:
        """What every way out ends with (its caller holds ``_end_owner``): every process of the
        run but the sentinel killed, the run directory removed, the result recorded, the sentinel
        told (it sweeps once more and exits)."""
        assert self._events is not None and self._sentinel is not None
        processes.kill_leftovers(worker_pids=self._agent.worker_pids if self._agent else [],
                                 keep={self._sentinel.pid} - {None}, keep_alone=set(self._helpers))
        shutil.rmtree(self._run_dir, ignore_errors=True)
        cycles = (self._agent.cycle + 1) if self._agent else 0
        # ft_report's "finished" for a run whose flag was not written under autoresume.sh (no history.tsv)
        flag = os.environ.get(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR) or None
        self._events.record_event(Result(outcome=result.outcome, exit_code=result.exit_code, cycles=cycles,
                                         finished_flag_file=flag, finished=os.path.exists(flag) if flag else None))
        if self._result_file is not None:
            failed = result.exit_code == exit_codes.EXIT_FAILURE or result.outcome == OUTCOME_REPEATED
            roots = self._events.last_cycle_root_nodes() if failed else []
            last = self._agent.last_fingerprint if self._agent is not None else None
            write_result(self._result_file, result.exit_code, result.outcome, roots,
                         (last.digest, last.describe()) if last is not None else None,
                         lost_nodes=self._events.lost_root_nodes())
        if summary:
            self._events.summary()
        self._sentinel.finish()


def graceful_stop_outcome(stops: Sequence[GracefulStopped]) -> str | None:
    """The result's outcome for a run whose workers stopped gracefully, or None if none did:
    ``stopped: graceful stop after step 447 on SIGUSR1, not finished`` (the stop leaves no
    finished flag: the next run resumes from its checkpoint). Ranks that disagree on the step
    (they never should: they agree on it) are named."""
    if not stops:
        return None
    steps = sorted({stop.step for stop in stops if stop.step is not None})
    signals = sorted({stop.signal for stop in stops if stop.signal})
    if len(steps) > 1:
        where = "after different steps (" + ", ".join(f"rank {stop.rank}: {stop.step}" for stop in stops) + ")"
    else:
        where = f"after step {steps[0]}" if steps else "after an unknown step"
    return f"stopped: graceful stop {where} on {'/'.join(signals) or 'a stop signal'}, not finished"


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class RunDirError(LauncherUsageError):
    """No directory is fit for the launcher's run directory (see :func:`make_run_dir`)."""


def make_run_dir() -> str:
    """Create the launcher's private (0700) run directory for sockets and temporary logs.

    Under ``$TMPDIR`` (Python's ``tempfile.gettempdir()``), unless another user could swap the
    run directory there (a ``$TMPDIR`` that others can write to without the sticky bit, or that
    belongs to another user) or its path is too long for Unix socket names: then under /tmp,
    with a warning saying why (:data:`FALLBACK_TMP`).

    Raises:
        RunDirError: Neither place is fit; the message says why and what to change.
    """
    problems: list[str] = []
    for base in dict.fromkeys((tempfile.gettempdir(), FALLBACK_TMP)):
        sample = os.path.join(base, "ft-" + "x" * 8, "launcher.sock")
        if len(os.fsencode(sample)) > protocol.MAX_SOCKET_PATH_BYTES:
            problems.append(f"{base} is too long for Unix socket paths")
            continue
        try:
            reason = protocol.unsafe_dir_reason(base)
        except OSError as err:
            reason = f"{base}: {err.strerror or err}"
        if reason is not None:
            problems.append(reason)
            continue
        if problems:
            logger.warning("not using TMPDIR for the launcher's sockets: %s; using %s instead",
                           "; ".join(problems), base)
        path = tempfile.mkdtemp(prefix="ft-", dir=base)
        protocol.check_socket_path(os.path.join(path, "launcher.sock"))
        return path
    raise RunDirError(
        "no safe directory for the launcher's sockets: " + "; ".join(problems)
        + ". Set TMPDIR to a short directory of your own (e.g. mkdir -m 700 /tmp/$USER-ft)"
    )
