"""Our short ``launch_agent``: torch's building blocks, our agent, our clean-up.

torch's ``launch_agent`` hard-codes ``LocalElasticAgent``, so this module builds the rendezvous
handler and ``WorkerSpec`` itself (from the ``LaunchConfig`` that torchrun's own
``config_from_args`` produced) and runs :class:`FaultTolerantAgent`. Around the run it owns the
private run directory, the sentinel, the monitors, the control socket, signal handling and the
event log, and it guarantees that nothing started here outlives the launcher: its own clean-up
at exit (which a second stop signal does not cut short), the forced stop on a third one, and the
sentinel (:mod:`launcher.sentinel`) if the launcher itself is killed.
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
import uuid
from typing import Any

import torch.distributed.elastic.rendezvous.registry as rdzv_registry
from torch.distributed import run as torch_run
from torch.distributed.elastic import metrics
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from ft_core.wire import protocol
from ft_core.wire.config import ConfigError, FaultToleranceConfig, parse_seconds
from ft_core.wire.env import (
    AUTORESUME_ATTEMPT_ENV_VAR,
    FT_LAUNCHER_KEEP_FD_ENV_VAR,
    FT_LAUNCHER_PARENT_PID_ENV_VAR,
    FT_LAUNCHER_RESULT_FILE_ENV_VAR,
    FT_LAUNCHER_RUN_ENV_VAR,
)
from ft_core.wire.osutil import STEP_SIGNALS, set_child_subreaper, set_parent_death_signal
from launcher import exit_codes, processes, rendezvous_poll
from launcher.agent import FaultTolerantAgent
from launcher.attempt_result import check_result_path, write_result
from launcher.cli import LauncherOptions, config_sources
from launcher.control_server import ControlServer
from launcher.events import EventLog
from launcher.monitors import MonitorPool
from launcher.restart_policy import OUTCOME_EXCLUDED, OUTCOME_SHUTDOWN, RestartPolicy
from launcher.sentinel import Sentinel
from launcher.signals import JOB_WIDE_WINDOW, SignalHandling
from launcher.store_watchdog import DEFAULT_STORE_LOST_TIMEOUT, STORE_LOST_KEY, StoreWatchdog
from launcher.warm.coordinator import WarmCoordinator, WarmTemplate

logger = logging.getLogger(__name__)

MAX_NPROC_PER_NODE = 1024
"""Bound of ``--nproc-per-node`` (each worker also gets a rank monitor process)."""
MAX_MONITOR_INTERVAL = 3600.0
"""Bound of torchrun's ``--monitor-interval`` (seconds)."""
SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch (read by its c10d rendezvous) for a fresh store per rendezvous round."""
SHUTDOWN_ACK_TIMEOUT = 10.0
FALLBACK_TMP = "/tmp"
"""Where the run directory goes when ``$TMPDIR`` is unfit (see :func:`make_run_dir`)."""
FORCED_STOP_TIMEOUT = 60.0
"""How long the clean-up waits for a forced stop that took over to end the process."""


def launch(args: argparse.Namespace, ft_cfg: FaultToleranceConfig, options: LauncherOptions,
           parser: argparse.ArgumentParser) -> int:
    """Run the workers under fault tolerance; return the launcher's exit code.

    Args:
        args: torchrun's parsed arguments (read only for torchrun's own options).
        ft_cfg: The fault tolerance config the monitors enforce.
        options: The launcher's own options.
        parser: For usage errors found by torchrun's ``config_from_args`` (exit 2).
    """
    parent_pid, keep_fd = _parent_binding(parser)
    result_file = _result_file(parser)
    _apply_torchrun_defaults(args)
    # Restarted gloo groups can read the previous round's peer addresses from a store shared
    # with the agent ("Connection refused"); a fresh store per round makes restarts clean.
    os.environ.setdefault(SHARE_STORE_ENV, "1")
    # Before anything starts: every process of the run inherits it (see launcher.sentinel).
    os.environ[FT_LAUNCHER_RUN_ENV_VAR] = f"{os.getpid()}-{uuid.uuid4().hex}"

    try:
        run_dir = make_run_dir()
    except RunDirError as err:
        parser.error(str(err))
    keep_torch_logs = bool(args.log_dir) or args.redirects != "0" or args.tee != "0"
    if not keep_torch_logs:
        args.log_dir = os.path.join(run_dir, "logs")
    try:
        config, entrypoint, entry_args = torch_run.config_from_args(args)
        check_worker_numbers(config)
    except (ValueError, AssertionError, ConfigError) as err:
        shutil.rmtree(run_dir, ignore_errors=True)
        parser.error(str(err) or "invalid torchrun arguments")
    if args.log_dir and not keep_torch_logs:
        args.log_dir = None  # do not advertise the temporary log dir
    ensure_run_id(config)
    config.signals_to_handle = ",".join(
        s for s in config.signals_to_handle.split(",") if s.strip() not in ("SIGUSR1", "SIGUSR2")
    )
    term_timeout = options.stop_timeout(config.shutdown_timeout)
    events = EventLog(options.event_log, run_id=config.run_id)
    # Stack files go next to the event log, when there is one.
    stacks_dir = os.path.join(os.path.dirname(os.path.abspath(events.path)), "ft_stacks") if events.path else None
    sentinel = Sentinel(run_dir, FT_LAUNCHER_RUN_ENV_VAR, os.environ[FT_LAUNCHER_RUN_ENV_VAR], STEP_SIGNALS,
                        keep_fds=() if keep_fd is None else (keep_fd,))
    monitors = MonitorPool(ft_cfg, run_dir, config.nproc_per_node, stacks_dir=stacks_dir)
    workers = processes.WorkerProcesses(config.nproc_per_node)
    warm = None
    if options.warm_restarts:
        warm = WarmCoordinator(WarmTemplate(os.path.join(run_dir, "warm.sock"), list(options.warm_preload)),
                               events, options.warm_start_delay)
    control: ControlServer | None = None
    agent: FaultTolerantAgent | None = None
    signals: SignalHandling | None = None
    exit_code = exit_codes.EXIT_FAILURE
    outcome = "failed"

    # Whoever holds this records the result and decides the exit code: the clean-up below, or a
    # forced stop on the signal thread (then the clean-up waits for it to end the process).
    ending = threading.Lock()

    def record_result(outcome: str, exit_code: int) -> None:
        events.record("result", outcome=outcome, exit_code=exit_code, cycles=(agent.cycle + 1) if agent else 0)
        if result_file is not None:
            roots = events.last_cycle_root_nodes() if exit_code == exit_codes.EXIT_FAILURE else []
            write_result(result_file, exit_code, outcome, roots)

    def forced_stop(sig: signal.Signals) -> None:
        # Signal thread: a third stop signal, or the graceful stop did not finish in time.
        # Everything of the run goes now; the sentinel (kept) sweeps once more when told.
        if not ending.acquire(blocking=False):
            logger.warning("the clean-up is finishing already; not forcing it")
            return
        processes.kill_leftovers(worker_pids=agent.worker_pids if agent else [], keep={sentinel.pid} - {None})
        shutil.rmtree(run_dir, ignore_errors=True)
        code = exit_codes.EXIT_SIGNAL_BASE + int(sig)
        record_result(f"forced stop ({sig.name})", code)
        sentinel.finish()
        logging.shutdown()
        os._exit(code)

    def store_lost(why: str) -> None:
        # Watchdog thread: the store's host is gone; the main thread may be stuck in a store call
        # for minutes (a silent host), so end everything from here, as a forced stop does.
        if not ending.acquire(blocking=False):
            return
        print(f"[ft_launcher] {why}: the rendezvous cannot go on; stopping every process of this "
              f"node (exit {exit_codes.EXIT_FAILURE})", file=sys.stderr, flush=True)
        events.record("store_lost", reason=why)
        processes.kill_leftovers(worker_pids=agent.worker_pids if agent else [], keep={sentinel.pid} - {None})
        shutil.rmtree(run_dir, ignore_errors=True)
        record_result("rendezvous store lost", exit_codes.EXIT_FAILURE)
        sentinel.finish()
        logging.shutdown()
        os._exit(exit_codes.EXIT_FAILURE)

    def route(sig: signal.Signals, job_wide: bool) -> None:
        if agent is not None:
            agent.forward_signal(sig, job_wide)
        else:  # before the agent exists: queued for the first workers
            workers.route(sig, job_wide)

    try:
        set_child_subreaper()
        sentinel.start()
        signals = SignalHandling(
            route=route, force=forced_stop,
            job_wide=lambda sig, received_at: sentinel.saw(sig, received_at, JOB_WIDE_WINDOW),
            grace_seconds=term_timeout + 30.0,
        )
        signals.install()
        if parent_pid is not None:
            # scripts/autoresume.sh: stop (as on SIGTERM) when it dies, even by SIGKILL.
            set_parent_death_signal(signal.SIGTERM)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
        store_lost_after = pop_store_lost_timeout(config)
        poll_interval = pop_poll_interval(config)
        rdzv_defaulted = apply_rendezvous_defaults(config)
        if rdzv_defaulted:
            logger.info("rendezvous settings: %s (defaults of ft_launcher: %s; --rdzv-conf overrides)",
                        _format_rdzv_conf(config), ",".join(sorted(rdzv_defaulted)))
        events.record(
            "launcher_start", nnodes=f"{config.min_nodes}:{config.max_nodes}",
            nproc_per_node=config.nproc_per_node, max_restarts=config.max_restarts,
            restart_policy=ft_cfg.restart_policy, rdzv_backend=config.rdzv_backend,
            run_id=config.run_id, config=ft_cfg.to_dict(), entrypoint=str(entrypoint),
            config_sources=config_sources(args), event_log_source=options.event_log_source,
            attempt=os.environ.get(AUTORESUME_ATTEMPT_ENV_VAR),
            sentinel_pid=sentinel.pid, rdzv_conf=dict(config.rdzv_configs),
            rdzv_poll_interval=poll_interval,
        )
        rdzv_handler = _rendezvous_handler(config)
        if poll_interval is not None and rendezvous_poll.install(poll_interval):
            rendezvous_poll.apply_to_handler(rdzv_handler, poll_interval)
            logger.info("rendezvous: waiting nodes read the store every %.2f s (--rdzv-conf %s=S)",
                        poll_interval, rendezvous_poll.POLL_INTERVAL_KEY)
        watchdog = _store_watchdog(config, store_lost_after, store_lost)
        monitors.start()
        events.record("monitors_started", monitor_pids=monitors.pids())
        control = ControlServer(os.path.join(run_dir, "launcher.sock"))
        agent = FaultTolerantAgent(
            worker_spec(config, entrypoint, entry_args, rdzv_handler), config.logs_specs,
            monitors=monitors, control=control, events=events,
            restart_policy=RestartPolicy(ft_cfg.restart_policy, config.min_nodes),
            start_method=config.start_method, log_line_prefix_template=config.log_line_prefix_template,
            term_timeout=term_timeout, reassert_signal_handlers=signals.reinstall,
            stop_signal_delivered=signals.stop_delivered, warm=warm, workers=workers,
            helper_pids=[sentinel.pid] if sentinel.pid else [],
            workers_stop_timeout=options.workers_stop_timeout,
        )
        shutdown_rdzv = True
        try:
            metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
            result = agent.run()
        except SignalException as err:
            if watchdog is not None:
                watchdog.stop()
            shutdown_rdzv = False  # keep the rendezvous open for the other nodes' restarts
            outcome, exit_code = _stopped_by(err.sigval, agent)
        except RendezvousError as err:
            logger.error("rendezvous failed: %s: %s", type(err).__name__, err)
            outcome = "rendezvous failed"
        else:
            if agent.outcome == OUTCOME_SHUTDOWN:
                # keep the store (hosted here with c10d) up until the other nodes saw the request
                agent.wait_for_shutdown_acks(SHUTDOWN_ACK_TIMEOUT)
                outcome, exit_code = OUTCOME_SHUTDOWN, exit_codes.EXIT_SHUTDOWN_REQUESTED
            elif agent.outcome == OUTCOME_EXCLUDED:
                shutdown_rdzv = False  # closing it would end the job for the remaining nodes
                outcome, exit_code = OUTCOME_EXCLUDED, exit_codes.EXIT_NODE_EXCLUDED
            elif result is not None and not result.is_failed():
                outcome, exit_code = "succeeded", exit_codes.EXIT_SUCCESS
        finally:
            if watchdog is not None:
                watchdog.stop()
            if shutdown_rdzv:
                _shutdown_rendezvous(rdzv_handler)
            else:
                # torch's rendezvous keeps a keep-alive thread that calls into the C++ store;
                # finalising the interpreter under it can abort the process (see below).
                _rendezvous_left_open.append(rdzv_handler)
    except SignalException as err:  # arrived before the agent ran (e.g. while monitors started)
        outcome, exit_code = _stopped_by(err.sigval, agent)
    except _StartFailed as err:
        logger.error("%s", err)
        outcome, exit_code = err.outcome, err.exit_code
    finally:
        # From here on a stop signal does not interrupt: the clean-up runs to its end (a third
        # stop signal forces it on the signal thread, which leaves nothing behind either).
        if signals is not None:
            signals.begin_cleanup()
        dropped = workers.discard_queued()
        if dropped:
            logger.info("signals queued for workers that never came: %s", dropped)
        monitors.stop()
        if warm is not None:
            warm.stop()
        if control is not None:
            control.close()
        processes.kill_leftovers(worker_pids=agent.worker_pids if agent else [], keep={sentinel.pid} - {None})
        shutil.rmtree(run_dir, ignore_errors=True)
        if not ending.acquire(blocking=False):
            time.sleep(FORCED_STOP_TIMEOUT)  # a forced stop is ending the process; it exits 128+N
        record_result(outcome, exit_code)
        events.summary()
        sentinel.finish()
        if signals is not None:
            signals.close()
        events.close()
        if keep_fd is not None:
            with contextlib.suppress(OSError):
                os.close(keep_fd)
    return exit_code


def _stopped_by(sig: signal.Signals, agent: FaultTolerantAgent | None) -> tuple[str, int]:
    """Outcome and exit code of a stop by signal (a preemption): 0 if every worker exited 0
    within ``--term-timeout`` (or none was running), else 1."""
    clean = agent is None or agent.stopped_cleanly
    return f"signal {sig.name}", exit_codes.EXIT_SUCCESS if clean else exit_codes.EXIT_FAILURE


def _parent_binding(parser: argparse.ArgumentParser) -> tuple[int | None, int | None]:
    """The parent to die with and the descriptor to keep, from ``scripts/autoresume.sh``.

    Both variables are removed from the environment, so that the workers do not inherit them.
    An invalid value is a usage error (exit 2) naming the variable.
    """
    values: list[int | None] = []
    for name, minimum in ((FT_LAUNCHER_PARENT_PID_ENV_VAR, 2), (FT_LAUNCHER_KEEP_FD_ENV_VAR, 3)):
        raw = os.environ.pop(name, None)
        if raw is None or raw == "":
            values.append(None)
            continue
        try:
            value = int(raw)
            if value < minimum:
                raise ValueError(raw)
            if name == FT_LAUNCHER_KEEP_FD_ENV_VAR:
                os.fstat(value)
        except (ValueError, OSError):
            what = "a process id" if name == FT_LAUNCHER_PARENT_PID_ENV_VAR else "an open file descriptor >= 3"
            parser.error(f"{name} must be {what}, got {raw!r}")
        values.append(value)
    return values[0], values[1]


def _result_file(parser: argparse.ArgumentParser) -> str | None:
    """Where to write the result for ``scripts/autoresume.sh`` (``FT_LAUNCHER_RESULT_FILE``).

    Removed from the environment, so that the workers do not inherit it. An unusable path is a
    usage error (exit 2) naming the variable.
    """
    path = os.environ.pop(FT_LAUNCHER_RESULT_FILE_ENV_VAR, None)
    if not path:
        return None
    problem = check_result_path(path)
    if problem:
        parser.error(f"{FT_LAUNCHER_RESULT_FILE_ENV_VAR} {problem}")
    return path


def check_worker_numbers(config: Any) -> None:
    """The torchrun numbers that go into our ``WorkerSpec`` and wait loop, bounded.

    torch asserts only part of them (``WorkerSpec`` raises a bare ``AssertionError``), and NaN or
    infinity would crash the agent's wait later.

    Raises:
        ConfigError: Naming the option and echoing the value.
    """
    nproc = config.nproc_per_node
    if not 1 <= nproc <= MAX_NPROC_PER_NODE:
        raise ConfigError(f"--nproc-per-node must be a whole number from 1 to {MAX_NPROC_PER_NODE}, got {nproc!r}")
    parse_seconds("--monitor-interval", config.monitor_interval, allow_none=False, maximum=MAX_MONITOR_INTERVAL)


class _StartFailed(Exception):
    """The launcher cannot start its agent; carries the outcome and exit code to record."""

    def __init__(self, message: str, outcome: str, exit_code: int) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.exit_code = exit_code


def ensure_run_id(config: Any) -> None:
    """Give the run a random id when ``--rdzv-id`` gave none (as torch's ``launch_agent`` does).

    Done before anything is recorded: every event record carries the run id.
    """
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
        logger.warning("no --rdzv-id given; using the random run id %s", config.run_id)


# Rendezvous settings ft_launcher uses for the c10d backend unless --rdzv-conf gives them, for a
# fast recovery across nodes (docs/multinode.md has the measurements). torch's defaults wait for a
# lost node's keep-alive to expire (5 s x 3) and then a 30 s last call before a smaller round
# completes: ~40-50 s from a node crash to the survivors training again with --nnodes 2:3.
# - keep_alive 1 s x 3: a node whose launcher is gone is dropped from the rendezvous after 3 s
#   (each launcher writes its keep-alive to the store once a second; a node that is merely slow
#   re-adds itself while it waits in the rendezvous);
# - last_call_timeout 2 s: with --nnodes MIN:MAX, once MIN nodes are in, wait 2 s for more. A node
#   that comes later joins at the next restart (it is counted as waiting, which starts one).
# With --nnodes N (MIN = MAX) the last call does not apply: the round completes when all N are in.
RDZV_DEFAULTS = {"keep_alive_interval": "1", "keep_alive_max_attempt": "3", "last_call_timeout": "2"}
RDZV_DEFAULT_BACKENDS = ("c10d",)


def apply_rendezvous_defaults(config: Any) -> list[str]:
    """Add :data:`RDZV_DEFAULTS` that ``--rdzv-conf`` did not set (c10d only); return their names."""
    if config.rdzv_backend not in RDZV_DEFAULT_BACKENDS:
        return []
    added = [key for key in RDZV_DEFAULTS if key not in config.rdzv_configs]
    for key in added:
        config.rdzv_configs[key] = RDZV_DEFAULTS[key]
    return added


def pop_poll_interval(config: Any) -> float | None:
    """``--rdzv-conf poll_interval=S`` (ft_launcher's own key, removed before torch sees the
    settings), else the default for ``--nnodes`` MAX: see :mod:`launcher.rendezvous_poll`.
    None unless the job is a multi-node c10d one (nothing polls otherwise). Invalid values are a
    usage error."""
    raw = config.rdzv_configs.pop(rendezvous_poll.POLL_INTERVAL_KEY, None)
    try:
        interval = (rendezvous_poll.default_poll_interval(config.max_nodes) if raw is None
                    else rendezvous_poll.parse_poll_interval(str(raw)))
    except ValueError as err:
        raise _StartFailed(str(err), "invalid arguments", exit_codes.EXIT_USAGE) from None
    return interval if config.rdzv_backend == "c10d" and config.max_nodes > 1 else None


def pop_store_lost_timeout(config: Any) -> float:
    """``--rdzv-conf store_lost_timeout=S`` (ft_launcher's own key, removed before torch sees the
    settings): see :mod:`launcher.store_watchdog`. Invalid values are a usage error."""
    raw = config.rdzv_configs.pop(STORE_LOST_KEY, None)
    if raw is None:
        return DEFAULT_STORE_LOST_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise _StartFailed(f"invalid rendezvous configuration: {STORE_LOST_KEY}={raw!r} "
                           "(seconds >= 0 and <= 86400; 0 = off)", "invalid arguments", exit_codes.EXIT_USAGE)
    return value


def _store_watchdog(config: Any, lost_after: float, on_lost: Any) -> StoreWatchdog | None:
    """Start the watchdog of a multi-node c10d rendezvous store (none for --standalone, one node)."""
    if lost_after <= 0 or config.rdzv_backend != "c10d" or config.max_nodes <= 1:
        return None
    host, port = parse_rendezvous_endpoint(config.rdzv_endpoint, default_port=29400)
    if port == 0:
        return None
    watchdog = StoreWatchdog(host, port, lost_after, on_lost)
    watchdog.start()
    return watchdog


def _rendezvous_parameters(config: Any) -> RendezvousParameters:
    ensure_run_id(config)
    return RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )


_abandoned_threads: list[Any] = []
_rendezvous_left_open: list[Any] = []


def must_exit_without_teardown() -> bool:
    """True when a thread of ours or torch's may still be inside torch's C++ store client.

    That is the case when the rendezvous-setup thread was abandoned, or when the launcher left
    the rendezvous open for the other nodes (ExcludeThisNode, a stop by signal): torch's
    keep-alive thread then still runs. Finalising the interpreter under such a thread aborts
    the process (``terminate called without an active exception``, exit -6) instead of exiting
    with the launcher's code, so :func:`launcher.cli.main` then leaves with ``os._exit`` (after
    :func:`launch` cleaned up).
    """
    return bool(_rendezvous_left_open) or any(thread.is_alive() for thread in _abandoned_threads)


def _rendezvous_handler(config: Any) -> Any:
    """Create the rendezvous handler, turning its failures into clear, bounded errors.

    torch's c10d backend connects to the store while the handler is created; a port held by a
    program that accepts connections but is not a store would block that forever inside C++.
    The creation therefore runs on a helper thread that the main thread waits for with a bound
    (and which signals can interrupt).

    Raises:
        _StartFailed: Invalid ``--rdzv-conf``/``--rdzv-endpoint`` values (exit 2), or the store
            cannot be reached (exit 1).
    """

    params = _rendezvous_parameters(config)
    outcome: dict[str, Any] = {}

    def create() -> None:
        try:
            outcome["handler"] = rdzv_registry.get_rendezvous_handler(params)
        except BaseException as err:  # handed to the main thread below
            outcome["error"] = err

    read_timeout = float(config.rdzv_configs.get("read_timeout", 60))
    thread = threading.Thread(target=create, name="ft-rendezvous-setup", daemon=True)
    thread.start()
    thread.join(read_timeout + 5.0)
    endpoint = config.rdzv_endpoint or "(none)"
    if thread.is_alive():
        _abandoned_threads.append(thread)
        raise _StartFailed(
            f"rendezvous failed: {endpoint} accepted a connection but did not answer as a c10d "
            f"store within {read_timeout + 5.0:.0f} s; is the port used by another program? "
            "(--rdzv-endpoint)", "rendezvous failed", exit_codes.EXIT_FAILURE)
    error = outcome.get("error")
    if isinstance(error, (ValueError, TypeError)):
        raise _StartFailed(
            f"invalid rendezvous configuration (--rdzv-conf {_format_rdzv_conf(config)!r}, "
            f"--rdzv-endpoint {endpoint}): {error}", "invalid arguments", exit_codes.EXIT_USAGE)
    if isinstance(error, RendezvousError):
        raise _StartFailed(
            f"rendezvous failed: cannot reach the rendezvous at {endpoint} (--rdzv-endpoint): "
            f"{type(error).__name__}: {error}", "rendezvous failed", exit_codes.EXIT_FAILURE)
    if error is not None:
        raise error
    return outcome["handler"]


def _format_rdzv_conf(config: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in config.rdzv_configs.items())


def worker_spec(config: Any, entrypoint: Any, entry_args: list[str], rdzv_handler: Any) -> WorkerSpec:
    """torch's ``WorkerSpec`` as torch's ``launch_agent`` builds it from a ``LaunchConfig``.

    Also sets ``TORCHELASTIC_SIGNALS_TO_HANDLE`` as ``launch_agent`` does.
    ``tests/unit/test_torch_hooks.py`` checks that the fields passed here are the ones
    ``launch_agent`` passes.
    """
    master_addr, master_port = _static_master(config)
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    return WorkerSpec(**worker_spec_kwargs(config, entrypoint, entry_args, rdzv_handler, master_addr, master_port))


def worker_spec_kwargs(config: Any, entrypoint: Any, entry_args: list[str], rdzv_handler: Any,
                       master_addr: str | None, master_port: int | None) -> dict[str, Any]:
    """The ``WorkerSpec`` fields, from torchrun's ``LaunchConfig``."""
    return {
        "role": config.role,
        "local_world_size": config.nproc_per_node,
        "entrypoint": entrypoint,
        "args": tuple(entry_args),
        "rdzv_handler": rdzv_handler,
        "max_restarts": config.max_restarts,
        "monitor_interval": config.monitor_interval,
        "master_addr": master_addr,
        "master_port": master_port,
        "local_addr": config.local_addr,
        "event_log_handler": config.event_log_handler,
        "numa_options": config.numa_options,
        "duplicate_stdout_filters": config.duplicate_stdout_filters,
        "duplicate_stderr_filters": config.duplicate_stderr_filters,
        "virtual_local_rank": config.virtual_local_rank,
    }


def _shutdown_rendezvous(rdzv_handler: Any) -> None:
    """Close the rendezvous for good (not after a signal or an exclusion: the others go on)."""
    try:
        rdzv_handler.shutdown()
    except Exception as err:  # broad on purpose: it protects the clean-up that follows
        # The handler comes from torch's backend registry (c10d, etcd, static or a plug-in),
        # each with its own errors; the run's outcome is decided already and the monitors,
        # template and run directory must still be cleaned up.
        logger.warning("could not close the rendezvous: %s: %s", type(err).__name__, err)


def _apply_torchrun_defaults(args: argparse.Namespace) -> None:
    """torchrun's own pre-processing of rendezvous arguments (standalone, single-node static)."""
    if args.standalone:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None:
        _, max_nodes = torch_run.parse_min_max_nnodes(args.nnodes)
        if max_nodes == 1:
            args.rdzv_backend = "c10d"
            args.rdzv_endpoint = "localhost:0"
            args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def _static_master(config: Any) -> tuple[str | None, int | None]:
    if config.rdzv_backend != "static":
        return None, None
    endpoint = config.rdzv_endpoint.strip()
    if not endpoint:
        raise ValueError("the static rendezvous needs --master-addr and --master-port")
    addr, port = parse_rendezvous_endpoint(endpoint, default_port=-1)
    if port == -1:
        raise ValueError(f"no port in rendezvous endpoint {endpoint!r}; add --master-port")
    return addr, port


class RunDirError(Exception):
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
