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
import logging
import os
import sys
from typing import Any

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing.errors import record

from ft_core.config import ConfigError, FaultToleranceConfig, parse_cli_value

logger = logging.getLogger("launcher")

FIELD_HELP = {
    "workload_check_interval": "Seconds between a monitor's housekeeping checks (launcher alive, "
    "rank process alive). Hang detection itself is deadline-driven. Default 5.",
    "initial_rank_heartbeat_timeout": "Seconds from client init to the first heartbeat; 'null' = "
    "no limit. Default 3600.",
    "rank_heartbeat_timeout": "Seconds allowed between heartbeats; 'null' = no limit. Default 2700.",
    "rank_section_timeouts": "Section timeouts as 'name:seconds,...', e.g. "
    "'setup:600,step:180,checkpointing:420' (seconds may be 'null').",
    "rank_out_of_section_timeout": "Seconds allowed with no section open; 'null' = no limit "
    "(default).",
    "safety_factor": "Calculated timeouts = this factor x the longest observed interval. Default 5.",
    "rank_termination_signal": "Signal sent to a hung rank after SIGCONT (name or number). "
    "Default SIGKILL.",
    "log_level": "Log level of monitors and clients (DEBUG, INFO, ...). Default INFO.",
    "restart_policy": "any-failed (default): restart all workers when any fails. min-healthy: "
    "restart only when fewer nodes than the minimum of --nnodes are healthy.",
}


def _flag_spellings(field: str) -> list[str]:
    dashed = field.replace("_", "-")
    spellings = [f"--ft-param-{dashed}", f"--ft-param-{field}", f"--ft-{dashed}", f"--ft-{field}"]
    if field == "restart_policy":
        spellings += ["--restart-policy", "--restart_policy"]
    return list(dict.fromkeys(spellings))


def get_args_parser() -> argparse.ArgumentParser:
    """The complete ``ft_launcher`` parser: torchrun's plus the fault tolerance group."""
    parser = torch_run.get_args_parser()
    parser.prog = "ft_launcher"
    # No abbreviated options: argparse checks every argument, the training script's too, against
    # option prefixes, and with our extra options a script argument such as --ft or --warm would
    # be an "ambiguous option" error.
    parser.allow_abbrev = False
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "torchrun with fault tolerance: rank monitors detect hangs, failed or hung worker\n"
        "groups are restarted (up to --max-restarts: restarts of the worker group by this\n"
        "launcher, as in torchrun), and every failure is explained.\n\n"
        "exit codes:\n"
        "  0      workers succeeded\n"
        "  1      workers failed and no restarts were left (or rendezvous failed)\n"
        "  2      invalid arguments or configuration\n"
        "  64     ShutdownWorkload requested by a rank: do not continue\n"
        "  65     ExcludeThisNode requested for this node\n"
        "  128+N  stopped by signal N (143 = SIGTERM, 130 = SIGINT)"
    )
    group = parser.add_argument_group(
        "fault tolerance",
        "Configuration precedence: defaults < YAML file (--fault-tol-cfg-path) < --ft-param-*. "
        "Each --ft-param-<field> is also accepted as --ft-<field>, with '-' or '_'.",
    )
    group.add_argument(
        "--fault-tol-cfg-path", "--fault_tol_cfg_path", "--ft-cfg-path", "--ft_cfg_path",
        dest="ft_cfg_path", default=None, metavar="PATH",
        help="YAML file with a 'fault_tolerance:' section (top level or nested).",
    )
    for field in FaultToleranceConfig.field_names():
        group.add_argument(*_flag_spellings(field), dest=f"ft_param_{field}", default=None,
                           metavar="VALUE", help=FIELD_HELP.get(field, field))
    group.add_argument(
        "--term-timeout", "--term_timeout", dest="term_timeout", type=float, default=None,
        metavar="SECONDS",
        help="When stopping workers (SIGTERM/SIGINT to the launcher, or a restart), wait this "
        "long after SIGTERM before SIGKILL. Default: --shutdown-timeout, i.e. 30 s.",
    )
    group.add_argument(
        "--no-warm-restarts", "--no_warm_restarts", dest="warm_restarts", action="store_false",
        help="Start every worker as a new interpreter, as torchrun does. By default a per-node "
        "warm template that has imported torch forks the workers, so a restart skips the "
        "interpreter start and 'import torch' (Python entry points only).",
    )
    group.add_argument(
        "--warm-preload", "--warm_preload", dest="warm_preload", default="torch,torch.distributed",
        metavar="MODULES",
        help="Comma-separated modules the warm template imports (default: torch,torch.distributed; "
        "add e.g. lightning.pytorch for Lightning jobs).",
    )
    group.add_argument(
        "--ft-event-log", "--ft_event_log", dest="ft_event_log", default=None, metavar="PATH",
        help="Append one JSON record per cycle, failure, control request and result to PATH "
        "('{node}' is replaced by the host name). Default: <--log-dir>/ft_events.jsonl when "
        "--log-dir is given, else kept in memory and summarised at exit.",
    )
    return parser


def build_ft_config(args: argparse.Namespace) -> FaultToleranceConfig:
    """Effective config from defaults, the YAML file and ``--ft-param-*`` values.

    Raises:
        ConfigError: With a message naming the offending flag or file.
    """
    values: dict[str, Any] = {}
    if args.ft_cfg_path:
        values.update(FaultToleranceConfig.read_yaml_section(args.ft_cfg_path))
        try:
            FaultToleranceConfig.from_kwargs(**values)
        except ConfigError as err:
            raise ConfigError(f"{args.ft_cfg_path}: {err}") from None
    for field in FaultToleranceConfig.field_names():
        raw = getattr(args, f"ft_param_{field}", None)
        if raw is None:
            continue
        try:
            values[field] = parse_cli_value(field, raw)
            FaultToleranceConfig.from_kwargs(**{field: values[field]})
        except ConfigError as err:
            raise ConfigError(f"--ft-param-{field}={raw!r}: {err}") from None
    return FaultToleranceConfig.from_kwargs(**values)


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


@record
def main(args: list[str] | None = None) -> None:
    """Console entry point of ``ft_launcher``; exits with a code from :mod:`launcher.exit_codes`."""
    parser = get_args_parser()
    ns = parser.parse_args(args)
    try:
        ft_cfg = build_ft_config(ns)
    except ConfigError as err:
        parser.error(str(err))
    if ns.term_timeout is not None and ns.term_timeout < 0:
        parser.error(f"--term-timeout must be >= 0, got {ns.term_timeout}")
    _configure_logging(min(ft_cfg.log_level, logging.INFO))
    # imports torch.distributed.elastic: only after the arguments were checked
    from launcher.launch import launch, must_exit_without_teardown

    code = launch(ns, ft_cfg, parser)
    if must_exit_without_teardown():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
