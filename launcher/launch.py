"""Our short ``launch_agent``: torch's building blocks, our agent, our clean-up.

torch's ``launch_agent`` hard-codes ``LocalElasticAgent``, so this module builds the rendezvous
handler and ``WorkerSpec`` itself (from the ``LaunchConfig`` that torchrun's own
``config_from_args`` produced) and runs :class:`FaultTolerantAgent`. Around the run it owns the
private run directory, the monitors, the control socket, signal handling and the event log, and
it guarantees that nothing started here outlives the launcher.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import tempfile
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

from ft_core import protocol
from ft_core.config import FaultToleranceConfig
from launcher import exit_codes, processes
from launcher.agent import OUTCOME_EXCLUDED, OUTCOME_SHUTDOWN, SHUTDOWN_ACK_KEY, FaultTolerantAgent
from launcher.control_server import ControlServer
from launcher.events import EventLog
from launcher.monitors import MonitorPool
from launcher.signals import SignalHandling
from launcher.warm import WarmTemplate

logger = logging.getLogger(__name__)

SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
SHUTDOWN_ACK_TIMEOUT = 10.0
EVENT_LOG_ENV = "FT_LAUNCHER_EVENT_LOG"


def launch(args: argparse.Namespace, ft_cfg: FaultToleranceConfig, parser: argparse.ArgumentParser) -> int:
    """Run the workers under fault tolerance; return the launcher's exit code."""
    _apply_torchrun_defaults(args)
    # Restarted gloo groups can read the previous round's peer addresses from a store shared
    # with the agent ("Connection refused"); a fresh store per round makes restarts clean.
    os.environ.setdefault(SHARE_STORE_ENV, "1")

    run_dir = make_run_dir()
    keep_torch_logs = bool(args.log_dir) or args.redirects != "0" or args.tee != "0"
    if not keep_torch_logs:
        args.log_dir = os.path.join(run_dir, "logs")
    try:
        config, entrypoint, entry_args = torch_run.config_from_args(args)
    except (ValueError, AssertionError) as err:
        shutil.rmtree(run_dir, ignore_errors=True)
        parser.error(str(err) or "invalid torchrun arguments")
    if args.log_dir and not keep_torch_logs:
        args.log_dir = None  # do not advertise the temporary log dir
    config.signals_to_handle = ",".join(
        s for s in config.signals_to_handle.split(",") if s.strip() not in ("SIGUSR1", "SIGUSR2")
    )
    shutdown_timeout = args.term_timeout if args.term_timeout is not None else config.shutdown_timeout
    event_path = args.ft_event_log or os.environ.get(EVENT_LOG_ENV) or (
        os.path.join(args.log_dir, "ft_events.jsonl") if args.log_dir else None
    )
    events = EventLog(event_path)
    monitors = MonitorPool(ft_cfg, run_dir, config.nproc_per_node)
    warm = None
    if args.warm_restarts and os.environ.get("FT_LAUNCHER_WARM_RESTARTS", "1") != "0":
        warm = WarmTemplate(os.path.join(run_dir, "warm.sock"), [m for m in args.warm_preload.split(",") if m])
    control: ControlServer | None = None
    agent: FaultTolerantAgent | None = None
    signals: SignalHandling | None = None
    exit_code = exit_codes.EXIT_FAILURE
    outcome = "failed"

    def emergency_stop(sig: signal.Signals) -> None:
        # Watchdog thread: the main thread did not manage a graceful stop in time.
        processes.kill_leftovers(worker_pids=list(agent._worker_pids.values()) if agent else [], keep=set())
        shutil.rmtree(run_dir, ignore_errors=True)
        os._exit(exit_codes.EXIT_SIGNAL_BASE + int(sig))

    try:
        processes.set_child_subreaper()
        signals = SignalHandling(
            forward=lambda sig: agent.forward_signal(sig) if agent else None,
            emergency_stop=emergency_stop,
            grace_seconds=float(shutdown_timeout) + 30.0,
        )
        signals.install()
        events.record(
            "launcher_start", nnodes=f"{config.min_nodes}:{config.max_nodes}",
            nproc_per_node=config.nproc_per_node, max_restarts=config.max_restarts,
            restart_policy=ft_cfg.restart_policy, rdzv_backend=config.rdzv_backend,
            run_id=config.run_id, config=ft_cfg.to_dict(), entrypoint=str(entrypoint),
        )
        rdzv_handler = _rendezvous_handler(config)
        monitors.start()
        events.record("monitors_started", monitor_pids=monitors.pids())
        control = ControlServer(os.path.join(run_dir, "launcher.sock"))
        agent = _build_agent(config, entrypoint, entry_args, rdzv_handler, ft_cfg, monitors, control,
                             events, int(shutdown_timeout), on_workers_started=signals.reinstall, warm=warm)
        shutdown_rdzv = True
        try:
            metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
            result = agent.run()
        except SignalException as err:
            shutdown_rdzv = False  # keep the rendezvous open for the other nodes' restarts
            outcome, exit_code = f"signal {err.sigval.name}", exit_codes.EXIT_SIGNAL_BASE + int(err.sigval)
        except RendezvousError as err:
            logger.error("rendezvous failed: %s: %s", type(err).__name__, err)
            outcome = "rendezvous failed"
        else:
            if agent.outcome == OUTCOME_SHUTDOWN:
                _wait_for_shutdown_acks(agent)
                outcome, exit_code = OUTCOME_SHUTDOWN, exit_codes.EXIT_SHUTDOWN_REQUESTED
            elif agent.outcome == OUTCOME_EXCLUDED:
                shutdown_rdzv = False  # closing it would end the job for the remaining nodes
                outcome, exit_code = OUTCOME_EXCLUDED, exit_codes.EXIT_NODE_EXCLUDED
            elif result is not None and not result.is_failed():
                outcome, exit_code = "succeeded", exit_codes.EXIT_SUCCESS
        finally:
            if shutdown_rdzv:
                with contextlib.suppress(Exception):
                    agent.get_worker_group().spec.rdzv_handler.shutdown()
    except SignalException as err:  # arrived before the agent ran (e.g. while monitors started)
        outcome, exit_code = f"signal {err.sigval.name}", exit_codes.EXIT_SIGNAL_BASE + int(err.sigval)
    except _StartFailed as err:
        logger.error("%s", err)
        outcome, exit_code = err.outcome, err.exit_code
    finally:
        if signals is not None:
            signals.close()
        monitors.stop()
        if warm is not None:
            warm.stop()
        if control is not None:
            control.close()
        processes.kill_leftovers(worker_pids=list(agent._worker_pids.values()) if agent else [], keep=set())
        shutil.rmtree(run_dir, ignore_errors=True)
        events.record("result", outcome=outcome, exit_code=exit_code,
                      cycles=(agent.cycle + 1) if agent else 0)
        events.summary()
        events.close()
    return exit_code


class _StartFailed(Exception):
    """The launcher cannot start its agent; carries the outcome and exit code to record."""

    def __init__(self, message: str, outcome: str, exit_code: int) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.exit_code = exit_code


def _rendezvous_parameters(config: Any) -> RendezvousParameters:
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
        logger.warning("no --rdzv-id given; using the random run id %s", config.run_id)
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


def must_exit_without_teardown() -> bool:
    """True when a helper thread was left inside torch's C++ store client.

    Finalising the interpreter under such a thread aborts the process (``terminate called
    without an active exception``, exit -6) instead of exiting with the launcher's code, so
    :func:`launcher.cli.main` then leaves with ``os._exit`` (after :func:`launch` cleaned up).
    """
    return any(thread.is_alive() for thread in _abandoned_threads)


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
    import threading

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


def _build_agent(config: Any, entrypoint: Any, entry_args: list[str], rdzv_handler: Any,
                 ft_cfg: FaultToleranceConfig, monitors: MonitorPool, control: ControlServer,
                 events: EventLog, shutdown_timeout: int, on_workers_started: Any = None,
                 warm: WarmTemplate | None = None) -> FaultTolerantAgent:
    master_addr, master_port = _static_master(config)
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(entry_args),
        rdzv_handler=rdzv_handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=config.numa_options,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
        virtual_local_rank=config.virtual_local_rank,
    )
    return FaultTolerantAgent(
        spec,
        config.logs_specs,
        monitors=monitors,
        control=control,
        events=events,
        restart_policy=ft_cfg.restart_policy,
        min_nodes=config.min_nodes,
        start_method=config.start_method,
        log_line_prefix_template=config.log_line_prefix_template,
        shutdown_timeout=shutdown_timeout,
        on_workers_started=on_workers_started,
        warm=warm,
    )


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


def _wait_for_shutdown_acks(agent: FaultTolerantAgent) -> None:
    """Keep the store up until the other nodes saw the shutdown (bounded)."""
    store = agent._store
    group = agent.get_worker_group()
    if store is None or group.group_world_size in (None, 1):
        return
    deadline = time.monotonic() + SHUTDOWN_ACK_TIMEOUT
    with contextlib.suppress(Exception):
        while time.monotonic() < deadline:
            if store.add(SHUTDOWN_ACK_KEY, 0) >= group.group_world_size - 1:
                return
            time.sleep(0.1)


def make_run_dir() -> str:
    """Create the launcher's private (0700) run directory for sockets and temporary logs.

    Under ``$TMPDIR`` (or /tmp); if that path is too long for Unix socket names, /tmp is used
    instead (with a log line), and if even that is too long the error says what to change.
    """
    base = tempfile.gettempdir()
    sample = os.path.join(base, "ft-" + "x" * 8, "launcher.sock")
    if len(os.fsencode(sample)) > protocol.MAX_SOCKET_PATH_BYTES and base != "/tmp":
        logger.warning("TMPDIR %s is too long for Unix socket paths; using /tmp for sockets", base)
        base = "/tmp"
    path = tempfile.mkdtemp(prefix="ft-", dir=base)
    protocol.check_socket_path(os.path.join(path, "launcher.sock"))
    return path
