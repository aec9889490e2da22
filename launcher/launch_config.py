"""From torchrun's arguments to torch's building blocks: the ``LaunchConfig``, the rendezvous, the ``WorkerSpec``.

torch's ``launch_agent`` hard-codes ``LocalElasticAgent``, so :mod:`launcher.launch` rebuilds it;
this module holds the pieces that turn torchrun's parsed arguments into what torch's agent needs,
as torchrun and ``launch_agent`` do (``tests/unit/test_torch_hooks.py`` and
``tests/torch_source_checks.py`` check each against torch): torchrun's pre-processing
(:func:`apply_torchrun_defaults`), the ``LaunchConfig`` (:func:`read_launch_config`),
ft_launcher's own rendezvous settings and their defaults, the rendezvous handler (created with a
bound), the store watchdog and the ``WorkerSpec``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import torch.distributed.elastic.rendezvous.registry as rdzv_registry
from torch.distributed import run as torch_run
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
    DEFAULT_PORT as C10D_DEFAULT_PORT,
)
from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config, parse_rendezvous_endpoint

from ft_core.wire.config import MAX_SECONDS, ConfigError, parse_seconds, parse_seconds_or_off
from ft_core.wire.config_values import short_repr
from launcher import exit_codes
from launcher.exit_codes import LauncherUsageError
from launcher.node.path_checks import directory_problem
from launcher.options import torchrun_default
from launcher.rendezvous import barrier as barrier_rendezvous
from launcher.rendezvous import poll as rendezvous_poll
from launcher.rendezvous.store_watchdog import DEFAULT_STORE_LOST_TIMEOUT, STORE_LOST_KEY, StoreWatchdog
from launcher.torch_compat import LAUNCH_CONFIG_FIELDS, WORKER_SPEC_FIELDS

logger = logging.getLogger(__name__)

MAX_NPROC_PER_NODE = 1024
"""Bound of ``--nproc-per-node`` (each worker also gets a rank monitor process)."""
MAX_MONITOR_INTERVAL = 3600.0
"""Bound of torchrun's ``--monitor-interval`` (seconds)."""
TORCHRUN_MASTER_PORT = 29500
"""The ``--master-port`` torchrun's ``run()`` sets when none is given (not a parser default;
``tests/unit/test_torch_hooks.py`` checks it is torch's)."""
C10D_DEFAULT_READ_TIMEOUT = 60.0
"""torch's c10d ``read_timeout`` when ``--rdzv-conf`` gives none (seconds; a literal in torch's
backend, not a constant: ``tests/torch_source_checks.py`` checks it is torch's)."""
LAUNCH_CONFIG_WITHOUT_FIELD = {
    "shutdown_timeout": 30,
    "signals_to_handle": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
}
"""``LaunchConfig`` fields the launcher reads that older torch lacks -> what such a torch does
instead: before 2.12 its process context gives workers 30 s from the signal to SIGKILL, before
2.10 its workers' context handles these four signals, always (``tests/torch_source_checks.py`` checks both on the
releases without the field). :func:`launch_config_value` reads them so on such a torch (the config is
not changed)."""
WORKER_SPEC_FIELDS_SINCE = ("numa_options", "duplicate_stdout_filters", "duplicate_stderr_filters",
                            "virtual_local_rank")
"""``WorkerSpec`` fields of later torch releases (2.9 to 2.10): passed only where torch has them."""


class StartFailed(Exception):
    """The launcher cannot start its agent; carries the outcome and exit code to record.

    Attributes:
        outcome: The result record's outcome (e.g. ``"rendezvous failed"``).
        exit_code: The launcher's exit code.
        stuck_thread: A thread left inside torch's C++ store client (see
            :func:`create_rendezvous_handler`), or None.
    """

    def __init__(self, message: str, outcome: str, exit_code: int,
                 stuck_thread: threading.Thread | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.exit_code = exit_code
        self.stuck_thread = stuck_thread


# ---------------------------------------------------------------------- torchrun's arguments


def apply_torchrun_defaults(args: argparse.Namespace) -> None:
    """torchrun's own pre-processing of rendezvous arguments (standalone, single-node static)."""
    if args.standalone:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and not _master_port_given(args):
        _, max_nodes = torch_run.parse_min_max_nnodes(args.nnodes)
        if max_nodes == 1:
            args.rdzv_backend = "c10d"
            args.rdzv_endpoint = "localhost:0"
            args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = TORCHRUN_MASTER_PORT


def _master_port_given(args: argparse.Namespace) -> bool:
    # torchrun < 2.12 has 29500 as its parser's default where later ones have None (and set 29500
    # in run()): there the default counts as not given, so that a single-node run is the same
    # c10d rendezvous on localhost on every supported torch.
    return args.master_port is not None and args.master_port != torchrun_default("master_port")


def keeps_torch_logs(args: argparse.Namespace) -> bool:
    """Whether the user asked for torch's worker logs (``--log-dir``, ``--redirects``, ``--tee``)."""
    return (bool(args.log_dir) or args.redirects != torchrun_default("redirects")
            or args.tee != torchrun_default("tee"))


def read_launch_config(args: argparse.Namespace, run_dir: str) -> tuple[Any, Any, list[str]]:
    """torchrun's ``LaunchConfig``, entry point and its arguments, as torchrun builds them.

    torch needs a log directory; unless the user asked for torch's logs, a temporary one inside
    ``run_dir`` is used and not advertised. The run gets a random id if ``--rdzv-id`` gave none.

    Raises:
        LauncherUsageError: An invalid torchrun argument (torch's own checks and ours).
    """
    apply_torchrun_defaults(args)
    temporary_logs = not keeps_torch_logs(args)
    if temporary_logs:
        args.log_dir = os.path.join(run_dir, "logs")
    try:
        config, entrypoint, entry_args = torch_run.config_from_args(args)
        check_worker_numbers(config)
    except (ValueError, AssertionError, ConfigError) as err:
        raise LauncherUsageError(str(err) or "invalid torchrun arguments") from None
    except OSError as err:  # torch's log directory (check_torchrun_arguments checked it already)
        raise LauncherUsageError(f"cannot set up the workers' logs (--log-dir): {err}") from None
    finally:
        if temporary_logs:
            args.log_dir = None  # do not advertise the temporary log dir
    return with_run_id(config), entrypoint, entry_args


def launch_config_value(config: Any, name: str) -> Any:
    """``config``'s field ``name``, or what a torch whose ``LaunchConfig`` lacks it does instead
    (:data:`LAUNCH_CONFIG_WITHOUT_FIELD`)."""
    if name in LAUNCH_CONFIG_WITHOUT_FIELD and name not in LAUNCH_CONFIG_FIELDS:
        return LAUNCH_CONFIG_WITHOUT_FIELD[name]
    return getattr(config, name)


def replaced(config: Any, **changes: Any) -> Any:
    """A new ``LaunchConfig`` like ``config`` with ``changes`` (``dataclasses.replace``; a stand-in
    of a test or benchmark is copied); ``config`` itself is not changed."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.replace(config, **changes)
    new = copy.copy(config)
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def check_torchrun_arguments(args: argparse.Namespace) -> None:
    """torchrun's arguments that torch would only trip over once the run started, checked first.

    ``--log-dir`` must be a directory that can be created and written (torch makes it while the
    workers are set up: a file there was a traceback); ``--rdzv-conf`` must be well formed and
    its numbers valid (:func:`check_rdzv_conf`). Nothing is created or changed.

    Raises:
        ConfigError: Naming the option and echoing the value.
    """
    if args.log_dir:
        problem = directory_problem(args.log_dir)
        if problem:
            raise ConfigError(f"--log-dir {args.log_dir}: {problem}")
    try:
        rdzv_configs = _parse_rendezvous_config(args.rdzv_conf)  # torch's own reading, as torchrun's
    except ValueError as err:
        raise ConfigError(f"--rdzv-conf {short_repr(args.rdzv_conf)}: {err}") from None
    check_rdzv_conf(rdzv_configs)


# The numbers of --rdzv-conf that torch's rendezvous backends read as whole numbers (int(), any
# value it accepts), and what they are: join, last-call, close and heartbeat timeouts of the
# dynamic (c10d) rendezvous, the store's read timeout, the etcd backend's timeout; how often a
# node sends its keep-alive (0 or less spun torch's keep-alive thread at 100 % CPU, with no
# error) and how many it may miss.
RDZV_WHOLE_NUMBERS = {
    "join_timeout": "seconds", "last_call_timeout": "seconds", "close_timeout": "seconds",
    "heartbeat_timeout": "seconds", "read_timeout": "seconds", "timeout": "seconds",
    "keep_alive_interval": "seconds", "keep_alive_max_attempt": "keep-alives",
}
RDZV_BOOLEANS = ("is_host",)
_TORCH_BOOLEAN_WORDS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")


def check_rdzv_conf(rdzv_configs: dict[str, Any]) -> None:
    """The values of the ``--rdzv-conf`` keys torch's backends and ft_launcher read.

    Each number of :data:`RDZV_WHOLE_NUMBERS` must be a whole number from 1 to
    :data:`~ft_core.wire.config.MAX_SECONDS` (torch reads them with ``int()``; it refuses some
    values only once the rendezvous is created and spins on a negative keep-alive interval);
    ``is_host`` a boolean as torch spells them; ft_launcher's ``poll_interval`` and
    ``store_lost_timeout`` as their own validators say. Other keys are left to the backend.

    Raises:
        ConfigError: Naming the key and echoing the value.
    """
    for key, raw in rdzv_configs.items():
        if key in RDZV_WHOLE_NUMBERS:
            try:
                number = int(raw)
            except (TypeError, ValueError):
                number = 0
            if not 1 <= number <= MAX_SECONDS:
                raise ConfigError(f"--rdzv-conf {key}={short_repr(raw)}: must be a whole number of "
                                  f"{RDZV_WHOLE_NUMBERS[key]} from 1 to {int(MAX_SECONDS)}")
        elif key in RDZV_BOOLEANS:
            if str(raw).strip().lower() not in _TORCH_BOOLEAN_WORDS:
                raise ConfigError(f"--rdzv-conf {key}={short_repr(raw)}: must be true or false (or 1, 0, yes, no)")
        elif key == rendezvous_poll.POLL_INTERVAL_KEY:
            try:
                rendezvous_poll.parse_poll_interval(str(raw))
            except ValueError as err:
                raise ConfigError(f"{err} (--rdzv-conf)") from None
        elif key == STORE_LOST_KEY:
            parse_seconds_or_off(f"--rdzv-conf {STORE_LOST_KEY}", raw, maximum=86400)


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


def with_run_id(config: Any) -> Any:
    """``config``, or a new one with a random run id when ``--rdzv-id`` gave none (as torch's
    ``launch_agent`` does; before anything is recorded: every event record carries the run id)."""
    if config.run_id:
        return config
    run_id = str(uuid.uuid4().int)
    logger.warning("no --rdzv-id given; using the random run id %s", run_id)
    return replaced(config, run_id=run_id)


# ---------------------------------------------------------------------- rendezvous settings


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
STORE_ON_ENDPOINT_BACKENDS = ("c10d", barrier_rendezvous.BACKEND)
"""The backends whose store is a TCPStore on ``--rdzv-endpoint`` (torch's c10d backend makes it):
ft_launcher's rendezvous defaults, its poll interval and its store watchdog apply."""
RDZV_DEFAULT_BACKENDS = STORE_ON_ENDPOINT_BACKENDS


@dataclasses.dataclass(frozen=True)
class RendezvousPlan:
    """A run's rendezvous settings from ``--rdzv-conf``, split into torch's and ft_launcher's own.

    Attributes:
        config: The ``LaunchConfig`` torch gets: a new one whose ``rdzv_configs`` lack
            ft_launcher's own keys and hold its defaults (the one read from torchrun's arguments
            is not changed).
        store_lost_after: The store watchdog's bound (:mod:`launcher.rendezvous.store_watchdog`).
        poll_interval: How often waiting nodes read the store (:func:`poll_interval_setting`),
            or None.
        defaulted: The names of :data:`RDZV_DEFAULTS` that were added.
    """

    config: Any
    store_lost_after: float
    poll_interval: float | None
    defaulted: tuple[str, ...]


def plan_rendezvous(config: Any) -> RendezvousPlan:
    """Read ft_launcher's own ``--rdzv-conf`` keys and add its defaults (see :class:`RendezvousPlan`).

    Raises:
        StartFailed: An invalid value of ft_launcher's own keys (a usage error, exit 2).
    """
    rdzv_configs = dict(config.rdzv_configs)
    store_lost_after = store_lost_timeout_setting(rdzv_configs.pop(STORE_LOST_KEY, None))
    poll_interval = poll_interval_setting(config, rdzv_configs.pop(rendezvous_poll.POLL_INTERVAL_KEY, None))
    defaulted = tuple(missing_rendezvous_defaults(config.rdzv_backend, rdzv_configs))
    rdzv_configs.update({key: RDZV_DEFAULTS[key] for key in defaulted})
    return RendezvousPlan(replaced(config, rdzv_configs=rdzv_configs), store_lost_after, poll_interval, defaulted)


def missing_rendezvous_defaults(backend: str, rdzv_configs: dict[str, Any]) -> list[str]:
    """The names of :data:`RDZV_DEFAULTS` that ``rdzv_configs`` does not set (c10d and ft-barrier only)."""
    if backend not in RDZV_DEFAULT_BACKENDS:
        return []
    return [key for key in RDZV_DEFAULTS if key not in rdzv_configs]


def poll_interval_setting(config: Any, raw: Any) -> float | None:
    """``--rdzv-conf poll_interval=S`` (``raw``: ft_launcher's own key, kept from torch), else the
    default for ``--nnodes`` MAX: see :mod:`launcher.rendezvous.poll`.
    None unless the job is a multi-node c10d one (nothing polls otherwise), or an ft-barrier one
    with ``poll_interval`` given (its own default is shorter: :mod:`launcher.rendezvous.barrier`).

    Raises:
        StartFailed: An invalid value (a usage error, exit 2).
    """
    try:
        interval = (rendezvous_poll.default_poll_interval(config.max_nodes) if raw is None
                    else rendezvous_poll.parse_poll_interval(str(raw)))
    except ValueError as err:
        raise StartFailed(str(err), "invalid arguments", exit_codes.EXIT_USAGE) from None
    if config.rdzv_backend == barrier_rendezvous.BACKEND and raw is None:
        return None
    return interval if config.rdzv_backend in STORE_ON_ENDPOINT_BACKENDS and config.max_nodes > 1 else None


def store_lost_timeout_setting(raw: Any) -> float:
    """``--rdzv-conf store_lost_timeout=S`` (``raw``: ft_launcher's own key, kept from torch), else
    the default: see :mod:`launcher.rendezvous.store_watchdog`.

    Raises:
        StartFailed: An invalid value (a usage error, exit 2).
    """
    if raw is None:
        return DEFAULT_STORE_LOST_TIMEOUT
    try:
        return parse_seconds_or_off(f"--rdzv-conf {STORE_LOST_KEY}", raw, maximum=86400)
    except ConfigError as err:
        raise StartFailed(f"invalid rendezvous configuration: {err}", "invalid arguments",
                          exit_codes.EXIT_USAGE) from None


def format_rdzv_conf(config: Any) -> str:
    """The rendezvous settings as ``--rdzv-conf`` spells them."""
    return ",".join(f"{k}={v}" for k, v in config.rdzv_configs.items())


# ---------------------------------------------------------------------- the rendezvous


def rendezvous_parameters(config: Any) -> RendezvousParameters:
    """torch's ``RendezvousParameters`` as ``launch_agent`` builds them from a ``LaunchConfig``."""
    config = with_run_id(config)
    return RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )


def create_rendezvous_handler(config: Any) -> Any:
    """Create the rendezvous handler, turning its failures into clear, bounded errors.

    torch's c10d backend connects to the store while the handler is created; a port held by a
    program that accepts connections but is not a store would block that forever inside C++.
    The creation therefore runs on a helper thread that the main thread waits for with a bound
    (and which signals can interrupt).

    Raises:
        StartFailed: Invalid ``--rdzv-conf``/``--rdzv-endpoint`` values (exit 2), or the store
            cannot be reached (exit 1; with the helper thread when it is stuck in torch).
    """
    params = rendezvous_parameters(config)
    created: dict[str, Any] = {}

    def create() -> None:
        try:
            created["handler"] = rdzv_registry.get_rendezvous_handler(params)
        except BaseException as err:  # handed to the main thread below
            created["error"] = err

    bound = float(config.rdzv_configs.get("read_timeout", C10D_DEFAULT_READ_TIMEOUT)) + 5.0
    thread = threading.Thread(target=create, name="ft-rendezvous-setup", daemon=True)
    thread.start()
    thread.join(bound)
    endpoint = config.rdzv_endpoint or "(none)"
    if thread.is_alive():
        raise StartFailed(
            f"rendezvous failed: {endpoint} accepted a connection but did not answer as a c10d "
            f"store within {bound:.0f} s; is the port used by another program? "
            "(--rdzv-endpoint)", "rendezvous failed", exit_codes.EXIT_FAILURE, stuck_thread=thread)
    error = created.get("error")
    if isinstance(error, (ValueError, TypeError)):
        raise StartFailed(
            f"invalid rendezvous configuration (--rdzv-conf {format_rdzv_conf(config)!r}, "
            f"--rdzv-endpoint {endpoint}): {error}", "invalid arguments", exit_codes.EXIT_USAGE)
    if isinstance(error, RendezvousError):
        raise StartFailed(
            f"rendezvous failed: cannot reach the rendezvous at {endpoint} (--rdzv-endpoint): "
            f"{type(error).__name__}: {error}", "rendezvous failed", exit_codes.EXIT_FAILURE)
    if error is not None:
        raise error
    return created["handler"]


def close_rendezvous(rdzv_handler: Any) -> None:
    """Close the rendezvous for good (not after a signal or an exclusion: the others go on)."""
    try:
        rdzv_handler.shutdown()
    except Exception as err:  # broad on purpose: it protects the clean-up that follows
        # The handler comes from torch's backend registry (c10d, etcd, static or a plug-in),
        # each with its own errors; the run's outcome is decided already and the monitors,
        # template and run directory must still be cleaned up.
        logger.warning("could not close the rendezvous: %s: %s", type(err).__name__, err)


def start_store_watchdog(config: Any, lost_after: float, on_lost: Callable[[str], None]) -> StoreWatchdog | None:
    """Start the watchdog of a multi-node c10d rendezvous store (none for --standalone, one node)."""
    if lost_after <= 0 or config.rdzv_backend not in STORE_ON_ENDPOINT_BACKENDS or config.max_nodes <= 1:
        return None
    host, port = parse_rendezvous_endpoint(config.rdzv_endpoint, default_port=C10D_DEFAULT_PORT)
    if port == 0:
        return None
    watchdog = StoreWatchdog(host, port, lost_after, on_lost)
    watchdog.start()
    return watchdog


# ---------------------------------------------------------------------- the WorkerSpec


def worker_spec(config: Any, entrypoint: Any, entry_args: list[str], rdzv_handler: Any) -> WorkerSpec:
    """torch's ``WorkerSpec`` as torch's ``launch_agent`` builds it from a ``LaunchConfig``.

    ``tests/unit/test_torch_hooks.py`` checks that the fields passed here are the ones
    ``launch_agent`` passes. (``launch_agent`` also sets ``TORCHELASTIC_SIGNALS_TO_HANDLE``:
    :func:`launcher.node.environment.set_up_environment` does.)
    """
    master_addr, master_port = static_master(config)
    return WorkerSpec(**worker_spec_kwargs(config, entrypoint, entry_args, rdzv_handler, master_addr, master_port))


def worker_spec_kwargs(config: Any, entrypoint: Any, entry_args: list[str], rdzv_handler: Any,
                       master_addr: str | None, master_port: int | None) -> dict[str, Any]:
    """The ``WorkerSpec`` fields, from torchrun's ``LaunchConfig``, as this torch's ``launch_agent`` passes them."""
    kwargs = {
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
    }
    # Fields of later releases (WORKER_SPEC_FIELDS_SINCE): an older torch has them in neither
    # its LaunchConfig nor its WorkerSpec.
    kwargs.update({name: getattr(config, name) for name in WORKER_SPEC_FIELDS_SINCE if name in WORKER_SPEC_FIELDS})
    return kwargs


def static_master(config: Any) -> tuple[str | None, int | None]:
    """The static rendezvous' master address and port (None, None for other backends).

    Raises:
        ValueError: The static rendezvous' endpoint names no host or no port.
    """
    if config.rdzv_backend != "static":
        return None, None
    endpoint = config.rdzv_endpoint.strip()
    if not endpoint:
        raise ValueError("the static rendezvous needs --master-addr and --master-port")
    addr, port = parse_rendezvous_endpoint(endpoint, default_port=-1)
    if port == -1:
        raise ValueError(f"no port in rendezvous endpoint {endpoint!r}; add --master-port")
    return addr, port
