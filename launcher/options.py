"""The launcher's own options (:class:`LauncherOptions`) and where each setting came from.

These are not fault tolerance config fields (monitors and ranks never see them): how the launcher
stops workers, warm restarts, the event log. :class:`LauncherOptions` is built and checked once,
from the command line and the launcher's environment variables (named in :mod:`ft_core.wire.env`);
the rest of the launcher reads only that object. torchrun's own defaults are read from torchrun's
parser (:func:`torchrun_default`), never copied.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch.distributed import run as torch_run

from ft_core.wire import reference_options
from ft_core.wire.config import (
    ConfigError,
    FaultToleranceConfig,
    MissingSectionError,
    parse_cli_value,
    parse_seconds_or_off,
)
from ft_core.wire.env import (
    AUTORESUME_RUN_DIR_ENV_VAR,
    FT_LAUNCHER_EVENT_LOG_ENV_VAR,
    FT_LAUNCHER_WARM_RESTARTS_ENV_VAR,
    FT_LAUNCHER_WARM_START_DELAY_ENV_VAR,
)
from ft_core.wire.reference_options import REFERENCE_ONLY_OPTIONS
from launcher.node.path_checks import file_problem
from launcher.warm.coordinator import DEFAULT_PRELOAD, START_DELAY

DEFAULT_WORKERS_STOP_TIMEOUT = 2.0
"""Default of ``--workers-stop-timeout``: after a worker failed, the others get SIGTERM and this
long before SIGKILL (the reference's default is 30 s: see docs/porting.md)."""
EVENT_LOG_NAME = "ft_events.jsonl"
DEFAULT_EVENT_LOG_DIR = "ft_launcher_logs"
"""Where the event log goes when nothing else chose it: this directory in the launcher's working
directory (as Lightning's ``lightning_logs``), so that a plain ``ft_launcher`` run keeps it too."""
EVENT_LOG_OFF = "none"
"""``--ft-event-log none`` (or ``FT_LAUNCHER_EVENT_LOG=none``): keep the records in memory only."""
SOURCE_DEFAULT = "default"
SPELLINGS_ATTR = "option_spellings"
"""Namespace attribute where :mod:`launcher.cli`'s parser records, per destination, the option
string the user typed (``--ft-initial-rank-heartbeat-timeout``, ``--ft-param-...``): messages
and the effective-config lines name an option as it was typed."""


@functools.lru_cache(maxsize=1)
def _torchrun_parser() -> argparse.ArgumentParser:
    return torch_run.get_args_parser()


def torchrun_default(dest: str) -> Any:
    """The default torchrun's own parser gives option ``dest`` (e.g. ``"redirects"``)."""
    return _torchrun_parser().get_default(dest)


@dataclass(frozen=True)
class LauncherOptions:
    """The launcher's own options: how it stops workers, warm restarts, the event log.

    Attributes:
        term_timeout: ``--term-timeout``: seconds between SIGTERM and SIGKILL when workers are
            stopped (fractions kept); None = torchrun's ``--shutdown-timeout``.
        warm_restarts: False with ``--no-warm-restarts`` or ``FT_LAUNCHER_WARM_RESTARTS=0``.
        warm_preload: ``--warm-preload``: modules the warm template imports.
        warm_start_delay: ``FT_LAUNCHER_WARM_START_DELAY``: start the template at the latest
            this long after a cycle's workers started (0 = at once).
        event_log: ``--ft-event-log``, else ``FT_LAUNCHER_EVENT_LOG``, else
            ``<--log-dir>/ft_events.jsonl`` when ``--log-dir`` is given, else
            ``$AUTORESUME_RUN_DIR/ft_events.jsonl`` under ``scripts/autoresume.sh``, else
            ``ft_launcher_logs/ft_events.jsonl`` in the working directory (absolute); None (in
            memory only) when the first of these given is ``none``.
        event_log_source: Which of these gave ``event_log`` (for the effective-config lines).
        workers_stop_timeout: ``--workers-stop-timeout``: seconds from SIGTERM to SIGKILL for
            the surviving workers after a worker failed (before a restart).
        ignored_options: One warning line per reference-only option given with a harmless value
            (:mod:`ft_core.wire.reference_options`); :func:`launcher.cli.main` logs them.
    """

    term_timeout: float | None = None
    warm_restarts: bool = True
    warm_preload: tuple[str, ...] = DEFAULT_PRELOAD
    warm_start_delay: float = START_DELAY
    event_log: str | None = None
    workers_stop_timeout: float = DEFAULT_WORKERS_STOP_TIMEOUT
    ignored_options: tuple[str, ...] = ()
    event_log_source: str = ""

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> LauncherOptions:
        """Build the options from parsed arguments and the environment (default ``os.environ``).

        Raises:
            ConfigError: An invalid value, or a reference-only option that asks for a feature we
                lack; the message names the flag or variable and echoes the value.
        """
        environ = os.environ if environ is None else environ
        term_timeout = None
        if args.term_timeout is not None:
            term_timeout = parse_seconds_or_off("--term-timeout", args.term_timeout, zero_means="at once")
        workers_stop_timeout = DEFAULT_WORKERS_STOP_TIMEOUT
        if getattr(args, "workers_stop_timeout", None) is not None:
            workers_stop_timeout = parse_seconds_or_off("--workers-stop-timeout", args.workers_stop_timeout,
                                                        zero_means="at once")
        ignored = tuple(
            reference_options.check(option, value, option.flag)
            for option in REFERENCE_ONLY_OPTIONS
            if (value := getattr(args, f"ft_{option.name}", None)) is not None
        )
        delay = environ.get(FT_LAUNCHER_WARM_START_DELAY_ENV_VAR)
        event_log, event_log_source = _event_log_default(args, environ)
        return cls(
            term_timeout=term_timeout,
            warm_restarts=_switch(FT_LAUNCHER_WARM_RESTARTS_ENV_VAR, environ) and args.warm_restarts,
            warm_preload=tuple(m for m in args.warm_preload.split(",") if m),
            warm_start_delay=(START_DELAY if delay is None
                              else parse_seconds_or_off(FT_LAUNCHER_WARM_START_DELAY_ENV_VAR, delay,
                                                        zero_means="at once")),
            event_log=event_log,
            workers_stop_timeout=workers_stop_timeout,
            ignored_options=ignored,
            event_log_source=event_log_source,
        )

    def stop_timeout(self, shutdown_timeout: float) -> float:
        """Seconds from SIGTERM to SIGKILL: ``--term-timeout``, else torchrun's ``shutdown_timeout``."""
        return shutdown_timeout if self.term_timeout is None else self.term_timeout


def _event_log_default(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The event log path and what chose it (see :attr:`LauncherOptions.event_log`).

    With the path None (in memory only) the second item says why, for the effective-config line:
    ``none`` was given, or the default place cannot be written (a read-only working directory
    is no reason to refuse a run nobody asked to log).

    Raises:
        ConfigError: The event log the user chose (option, variable, ``--log-dir``, the
            auto-resume run directory) could not be written there (a directory, a path through a
            file, no permission); the message names the option or variable that chose it.
    """
    path, source = _event_log_choice(args, environ)
    if path.strip().lower() == EVENT_LOG_OFF:
        return None, f"{source} {EVENT_LOG_OFF}" if source.startswith("--") else f"{source}={EVENT_LOG_OFF}"
    # as launcher.events.log.EventLog will open it
    problem = file_problem(path.replace("{node}", socket.gethostname()))
    if problem and source == SOURCE_DEFAULT:
        return None, f"the default {path} cannot be written: {problem}; --ft-event-log PATH keeps it for ft_report"
    if problem:
        given = f"{source} {args.log_dir}" if source == "--log-dir" else f"{source} {path}"
        raise ConfigError(f"the event log cannot be written ({given}): {problem}")
    return path, source


def _event_log_choice(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
    if args.ft_event_log:
        return args.ft_event_log, "--ft-event-log"
    if environ.get(FT_LAUNCHER_EVENT_LOG_ENV_VAR):
        return environ[FT_LAUNCHER_EVENT_LOG_ENV_VAR], FT_LAUNCHER_EVENT_LOG_ENV_VAR
    if args.log_dir:
        return os.path.join(args.log_dir, EVENT_LOG_NAME), "--log-dir"
    if environ.get(AUTORESUME_RUN_DIR_ENV_VAR):
        return os.path.join(environ[AUTORESUME_RUN_DIR_ENV_VAR], EVENT_LOG_NAME), AUTORESUME_RUN_DIR_ENV_VAR
    # Absolute, so that the effective-config line shows where it went.
    return os.path.join(os.path.abspath(DEFAULT_EVENT_LOG_DIR), EVENT_LOG_NAME), SOURCE_DEFAULT


def typed_flag(args: argparse.Namespace, dest: str, fallback: str) -> str:
    """The option string the user typed for destination ``dest``, else ``fallback``.

    ``fallback`` serves namespaces not built by :mod:`launcher.cli`'s parser (the reference's
    attribute names, tests).
    """
    return getattr(args, SPELLINGS_ATTR, {}).get(dest, fallback)


def check_config_options(args: argparse.Namespace) -> None:
    """Validate every ``--ft-param-*`` value given, naming the option as the user typed it (and
    its ``--ft-param-<field>`` name when that differs).

    An empty value is refused: the field's parser reads ``""`` as ``null``, which turns the
    check off (``--ft-param-rank_heartbeat_timeout ""``, an unset shell variable), so the user
    must write ``null`` to mean that.

    Raises:
        ConfigError: An empty or invalid value; the message names the option and the value.
    """
    for field in FaultToleranceConfig.field_names():
        dest = f"ft_param_{field}"
        raw = getattr(args, dest, None)
        if not isinstance(raw, str):
            continue
        flag = typed_flag(args, dest, f"--ft-param-{field}")
        if not raw.strip():
            spec = FaultToleranceConfig.field_spec(field)
            null = " (null for no limit)" if spec.metavar == "SECONDS" and "null" in spec.accepts else ""
            raise ConfigError(f"{flag}={raw!r}: an empty value; give a value{null}, or leave the option out "
                              "for the default")
        try:
            parse_cli_value(field, raw)
        except ConfigError as err:
            canonical = f"--ft-param-{field}"
            also = "" if flag == canonical else f" ({canonical})"
            raise ConfigError(f"{flag}={raw!r}{also}: {err}") from None


def config_sources(args: argparse.Namespace) -> dict[str, str]:
    """Where each config field's effective value comes from.

    Returns:
        Field name -> ``"command line <option as typed>"`` (e.g. ``--ft-param-<field>``),
        ``"file <path>"`` or ``"default"``, by the precedence of
        :meth:`FaultToleranceConfig.from_args`.

    Raises:
        ConfigError: As :meth:`FaultToleranceConfig.from_args` (the YAML file cannot be read).
    """
    in_file: set[str] = set()
    if args.ft_cfg_path and os.path.exists(args.ft_cfg_path):
        try:
            in_file = set(FaultToleranceConfig.read_yaml_section(args.ft_cfg_path))
        except MissingSectionError:  # from_args accepted it (options given, or ignore-missing)
            in_file = set()
    sources = {}
    for field in FaultToleranceConfig.field_names():
        if getattr(args, f"ft_param_{field}", None) is not None or getattr(args, f"ft_{field}", None) is not None:
            sources[field] = f"command line {typed_flag(args, f'ft_param_{field}', f'--ft-param-{field}')}"
        elif field in in_file:
            sources[field] = f"file {args.ft_cfg_path}"
        else:
            sources[field] = SOURCE_DEFAULT
    return sources


def _switch(name: str, environ: Mapping[str, str]) -> bool:
    """An on/off variable: ``1`` (or unset/empty) is on, ``0`` off.

    Raises:
        ConfigError: Any other value, named and echoed.
    """
    value = environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{name} must be 0 or 1, got {value!r}")
    return value != "0"
