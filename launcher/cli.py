"""``ft_launcher``: torchrun with fault tolerance.

Every torchrun option works as in torchrun (the parser *is* torchrun's, extended with a
"fault tolerance" group). On top, the launcher starts one rank monitor per local rank, passes
each worker its monitor's socket, restarts the worker group when a worker hangs or crashes (up
to ``--max-restarts``, torchrun's meaning: restarts of the worker group by this launcher), and
records why every failure happened.

Exit codes are listed in :mod:`launcher.exit_codes`.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import shutil
import sys
import types
from collections.abc import Mapping
from typing import Any, NoReturn

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing.errors import record

from ft_core.wire.config import ConfigError, FaultToleranceConfig, closest_field
from ft_core.wire.env import (
    AUTORESUME_RUN_DIR_ENV_VAR,
    FT_LAUNCHER_EVENT_LOG_ENV_VAR,
    FT_LAUNCHER_WARM_RESTARTS_ENV_VAR,
    FT_LAUNCHER_WARM_START_DELAY_ENV_VAR,
)
from ft_core.wire.reference_options import REFERENCE_ONLY_OPTIONS
from launcher import exit_codes
from launcher.exit_codes import LauncherUsageError
from launcher.options import (
    DEFAULT_WORKERS_STOP_TIMEOUT,
    SOURCE_DEFAULT,
    SPELLINGS_ATTR,
    LauncherOptions,
    check_config_options,
    config_sources,
    torchrun_default,
)
from launcher.warm.coordinator import DEFAULT_PRELOAD, START_DELAY

logger = logging.getLogger("launcher")


class _StoreSpelled(argparse.Action):
    """Store the value, and record the option string the user typed (:data:`SPELLINGS_ATTR`).

    argparse keeps only the destination; the effective-config lines and error messages name the
    option as typed (a user of the reference types ``--ft-initial-rank-heartbeat-timeout``, and
    would not recognise ``--ft-param-initial_rank_heartbeat_timeout``).
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        spellings = dict(getattr(namespace, SPELLINGS_ATTR, {}))  # a copy: never a shared default
        spellings[self.dest] = option_string
        setattr(namespace, SPELLINGS_ATTR, spellings)


def _flag_spellings(field: str) -> list[str]:
    dashed = field.replace("_", "-")
    spellings = [f"--ft-param-{dashed}", f"--ft-param-{field}", f"--ft-{dashed}", f"--ft-{field}"]
    if field == "restart_policy":
        spellings += ["--restart-policy", "--restart_policy"]
    return list(dict.fromkeys(spellings))


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """argparse's ``error``, message first: torchrun's usage text is 33 lines that hide it."""
    parser.exit(exit_codes.EXIT_USAGE,
                f"{parser.prog}: error: {message}\nRun '{parser.prog} --help' for the options.\n")


_FT_PREFIXES = ("--ft-param-", "--ft_param_", "--ft-", "--ft_")


def unrecognized_message(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" message, with the option each one most likely meant.

    A ``--ft-*`` option names the closest fault tolerance config field (the YAML file's "did you
    mean", :func:`~ft_core.wire.config.closest_field`), spelled as the user spelled the rest;
    another option the closest of the parser's own.
    """
    parts = []
    for extra in extras:
        option = extra.split("=", 1)[0]
        close = None
        prefix = next((p for p in _FT_PREFIXES if option.startswith(p)), None)
        if prefix is not None:
            typed = option[len(prefix):]
            field = closest_field(typed.replace("-", "_"))
            if field is not None:
                close = prefix + (field.replace("_", "-") if "-" in typed and "_" not in typed else field)
        elif option.startswith("-"):
            matches = difflib.get_close_matches(option, list(parser._option_string_actions), n=1, cutoff=0.75)
            close = matches[0] if matches else None
        parts.append(extra + (f" (did you mean {close}?)" if close else ""))
    return f"unrecognized arguments: {' '.join(parts)}"


def _parse_args(parser: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> argparse.Namespace:
    """argparse's ``parse_args``, whose "unrecognized arguments" error names the likely option."""
    ns, extras = parser.parse_known_args(args, namespace)
    if extras:
        parser.error(unrecognized_message(parser, extras))
    return ns


def get_args_parser() -> argparse.ArgumentParser:
    """The complete ``ft_launcher`` parser: torchrun's plus the fault tolerance group.

    Usage errors (``parser.error``) print the message and a pointer to ``--help``, not the usage
    text, and exit with code 2; an unrecognized option says which one was likely meant.
    """
    parser = torch_run.get_args_parser()
    parser.prog = "ft_launcher"
    parser.error = types.MethodType(_usage_error, parser)  # type: ignore[method-assign]
    parser.parse_args = types.MethodType(_parse_args, parser)  # type: ignore[method-assign]
    # No abbreviated options: argparse checks every argument, the training script's too, against
    # option prefixes, and with our extra options a script argument such as --ft or --warm would
    # be an "ambiguous option" error.
    parser.allow_abbrev = False
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "torchrun with fault tolerance: rank monitors detect hangs, failed or hung worker\n"
        "groups are restarted (up to --max-restarts: restarts of the worker group by this\n"
        "launcher, as in torchrun), and every failure is explained."
    )
    parser.epilog = exit_codes.help_epilog()
    group = parser.add_argument_group(
        "fault tolerance",
        "Configuration precedence: defaults < YAML file (--fault-tol-cfg-path) < --ft-param-*. "
        "Each --ft-param-<field> is also accepted as --ft-<field>, with '-' or '_'.",
    )
    group.add_argument(
        "--fault-tol-cfg-path", "--fault_tol_cfg_path", "--ft-cfg-path", "--ft-cfg_path", "--ft_cfg_path",
        dest="ft_cfg_path", default=None, metavar="PATH",
        help="YAML file with a 'fault_tolerance:' section (top level or nested).",
    )
    for field in FaultToleranceConfig.field_names():
        group.add_argument(*_flag_spellings(field), dest=f"ft_param_{field}", default=None, action=_StoreSpelled,
                           metavar=FaultToleranceConfig.field_spec(field).metavar,
                           help=FaultToleranceConfig.field_help(field).replace("%", "%%"))
    group.add_argument(
        "--ft-ignore-missing-cfg", "--ft_ignore_missing_cfg", "--ignore-missing-fault-tol-cfg",
        dest="ft_ignore_missing_cfg", action="store_true",
        help="A --fault-tol-cfg-path that does not exist (or has no 'fault_tolerance' section) means "
        "the defaults and the --ft-* options, with a warning, instead of an error.",
    )
    group.add_argument(
        "--workers-stop-timeout", "--workers_stop_timeout", dest="workers_stop_timeout",
        default=None, metavar="SECONDS",
        help="After a worker failed, the surviving workers get SIGTERM and this long before SIGKILL, "
        "before the restart (fractions kept; 0 = SIGKILL at once). Short, because a worker whose "
        f"peer died is often stuck in a collective. Default: {DEFAULT_WORKERS_STOP_TIMEOUT:g} s.",
    )
    group.add_argument(
        "--term-timeout", "--term_timeout", dest="term_timeout", default=None,
        metavar="SECONDS",
        help="When stopping workers (SIGTERM/SIGINT to the launcher, or a restart), wait this "
        "long after SIGTERM before SIGKILL (fractions of a second are kept; 0 = SIGKILL at once). "
        "Default: --shutdown-timeout, i.e. 30 s.",
    )
    group.add_argument(
        "--no-warm-restarts", "--no_warm_restarts", dest="warm_restarts", action="store_false",
        help="Start every worker as a new interpreter, as torchrun does. By default a per-node "
        "warm template that has imported torch forks the workers, so a restart skips the "
        "interpreter start and 'import torch' (Python entry points only).",
    )
    group.add_argument(
        "--warm-preload", "--warm_preload", dest="warm_preload", default=",".join(DEFAULT_PRELOAD),
        metavar="MODULES",
        help=f"Comma-separated modules the warm template imports (default: {','.join(DEFAULT_PRELOAD)}; "
        "add e.g. lightning.pytorch for Lightning jobs).",
    )
    group.add_argument(
        "--ft-event-log", "--ft_event_log", dest="ft_event_log", default=None, metavar="PATH",
        help="Append one JSON record per cycle, failure, control request and result to PATH "
        "('{node}' is replaced by the host name); 'none': kept in memory only. Default: "
        f"${FT_LAUNCHER_EVENT_LOG_ENV_VAR}, else <--log-dir>/ft_events.jsonl when --log-dir is given, else "
        f"${AUTORESUME_RUN_DIR_ENV_VAR}/ft_events.jsonl under autoresume.sh, else "
        "ft_launcher_logs/ft_events.jsonl in the working directory. ft_report reads it.",
    )
    _add_reference_only_options(parser)
    return parser


def _add_reference_only_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "options of nvidia-resiliency-ext for features ptl-resiliency does not have",
        "Accepted so that command lines written for it run: a value that leaves the feature off "
        "(or only tunes it) is ignored with one warning line; a value that asks for the feature "
        "is an error naming the option. See docs/launcher.md.",
    )
    for option in REFERENCE_ONLY_OPTIONS:
        spellings = _flag_spellings(option.name) + [f"--ft_param_{option.name}"]
        group.add_argument(*dict.fromkeys(spellings), dest=f"ft_{option.name}", default=None,
                           metavar=option.metavar, help=f"nvidia-resiliency-ext: {option.feature}.")


def _configure_logging(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [ft_launcher pid {os.getpid()}] %(levelname)s: %(message)s"
    ))
    for name in ("launcher", "ft_core"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level)
        log.propagate = False


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{'null' if v is None else f'{v:g}'}" for k, v in value.items()) or "(none)"
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)


def effective_config_lines(cfg: FaultToleranceConfig, sources: Mapping[str, str], options: LauncherOptions,
                           args: argparse.Namespace) -> list[str]:
    """What the launcher will do, as lines for its log: each non-default setting and its source.

    Config fields whose value differs from the default, the launcher's own options that are
    not at their defaults, and always where the event log goes (or that it is kept in memory).
    """
    defaults = FaultToleranceConfig().to_dict()
    values = cfg.to_dict()
    lines = [f"  {name} = {_shown(value)}  ({sources.get(name, SOURCE_DEFAULT)})"
             for name, value in values.items() if value != defaults[name]]
    if options.term_timeout is not None:
        lines.append(f"  term timeout = {options.term_timeout:g} s  (--term-timeout)")
    elif getattr(args, "shutdown_timeout", None) not in (None, torchrun_default("shutdown_timeout")):
        lines.append(f"  term timeout = {args.shutdown_timeout} s  (--shutdown-timeout)")
    if not options.warm_restarts:
        source = "--no-warm-restarts" if not args.warm_restarts else f"{FT_LAUNCHER_WARM_RESTARTS_ENV_VAR}=0"
        lines.append(f"  warm restarts = off  ({source})")
    elif options.warm_preload != DEFAULT_PRELOAD:
        lines.append(f"  warm preload = {','.join(options.warm_preload)}  (--warm-preload)")
    if options.warm_start_delay != START_DELAY:
        lines.append(f"  warm start delay = {options.warm_start_delay:g} s  ({FT_LAUNCHER_WARM_START_DELAY_ENV_VAR})")
    head = ("effective configuration, non-default values (ft_launcher --help lists the defaults):" if lines
            else "effective configuration: every fault tolerance setting has its default (ft_launcher --help)")
    event_log = (f"  event log = {options.event_log}  ({options.event_log_source})" if options.event_log else
                 f"  event log: kept in memory only ({options.event_log_source})")
    return [head, *lines, event_log]


def check_training_script(args: argparse.Namespace) -> None:
    """Refuse a training script that does not exist: every restart would fail the same way.

    A Python script must be a file; with ``--no-python`` the program must be an executable
    file, or on ``PATH``. A module (``-m``) is not checked (finding it means importing its
    package).

    Raises:
        ConfigError: Naming the script and the working directory it was looked for in.
    """
    script = args.training_script
    if args.module:
        return
    if args.no_python:
        found = os.path.isfile(script) if os.sep in script else shutil.which(script) is not None
        if found and os.sep in script and not os.access(script, os.X_OK):
            # torch would start it with execve on every restart: a traceback, not a usage error
            raise ConfigError(f"training script {script!r} is not executable, and --no-python runs it "
                              "directly; make it executable (chmod +x), or drop --no-python for a Python "
                              "script; nothing was started")
    else:
        found = os.path.isfile(script)
    if not found:
        raise ConfigError(f"training script {script!r} not found (working directory {os.getcwd()}); "
                          "nothing was started")


@record
def main(args: list[str] | None = None) -> None:
    """Console entry point of ``ft_launcher``; exits with a code from :mod:`launcher.exit_codes`."""
    parser = get_args_parser()
    ns = parser.parse_args(args)
    _configure_logging(logging.WARNING)  # for warnings while the config is read
    from launcher.launch_config import check_torchrun_arguments  # imports torch's rendezvous

    try:
        check_torchrun_arguments(ns)
        check_config_options(ns)
        ft_cfg = FaultToleranceConfig.from_args(ns)
        options = LauncherOptions.from_args(ns)
        sources = config_sources(ns)
        check_training_script(ns)
    except ConfigError as err:
        parser.error(str(err))
    _configure_logging(min(ft_cfg.log_level, logging.INFO))
    for line in options.ignored_options:
        logger.warning("%s", line)
    for line in effective_config_lines(ft_cfg, sources, options, ns):
        logger.info("%s", line)
    # imports torch.distributed.elastic: only after the arguments were checked
    from launcher.launch import launch

    try:
        outcome = launch(ns, ft_cfg, options)
    except LauncherUsageError as err:
        parser.error(str(err))
    if outcome.hard_exit:
        # A thread may still be inside torch's C++ store client: finalising the interpreter
        # under it would abort the process instead of exiting with the launcher's code.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(outcome.exit_code)
    sys.exit(outcome.exit_code)


if __name__ == "__main__":
    main()
