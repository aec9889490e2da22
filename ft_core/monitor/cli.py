"""Command line of one rank monitor: ``python -m ft_core.monitor.cli --socket PATH ...``.

Normally started by ``ft_launcher`` through :class:`ft_core.monitor.process.MonitorProcess`,
which passes the monitor's part of the config as JSON (``--config-json``) and a pipe to report
readiness on (``--ready-fd``). Standard library only, like the monitor itself.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from ft_core.monitor.server import RankMonitorServer, configure_logging
from ft_core.wire.config import ConfigError, FaultToleranceConfig, Role

PROG = "python -m ft_core.monitor.cli"


def build_arg_parser() -> argparse.ArgumentParser:
    """The monitor's argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run one rank monitor (normally started by ft_launcher).",
    )
    parser.add_argument("--socket", required=True,
                        help="Unix socket path (in a directory no other user could swap it in).")
    parser.add_argument("--config-json", default=None,
                        help="The monitor's config fields as a JSON object (default: the defaults).")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="Exit (stopping the watched worker) when this process is gone.")
    parser.add_argument("--ready-fd", type=int, default=None,
                        help="Write 'ready' to this file descriptor once listening.")
    parser.add_argument("--restarter-logger", action="store_true",
                        help="Also log worker cycles reported by the launcher.")
    parser.add_argument("--name", default=None, help="Label for log lines.")
    parser.add_argument("--cleanup-dir", default=None,
                        help="Remove this directory if the parent process dies.")
    parser.add_argument("--stacks-dir", default=None,
                        help="Write the Python stacks of hung ranks to files here (default: only "
                             "their innermost frames, in the hang report and the log).")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    args = build_arg_parser().parse_args(argv)
    try:
        data = (json.loads(args.config_json) if args.config_json is not None
                else FaultToleranceConfig().sent_to(Role.MONITOR))
        cfg = FaultToleranceConfig.as_received(data, Role.MONITOR)
    except (ConfigError, ValueError) as err:
        print(f"{PROG}: invalid configuration: {err}", file=sys.stderr)
        return 2
    label = args.name or os.path.basename(args.socket)
    configure_logging(cfg.log_level, label)
    server = RankMonitorServer(
        cfg, args.socket, is_restarter_logger=args.restarter_logger,
        parent_pid=args.parent_pid, cleanup_dir=args.cleanup_dir, stacks_dir=args.stacks_dir,
    )
    try:
        return server.serve_forever(ready_fd=args.ready_fd)
    except (OSError, ValueError) as err:
        if isinstance(err, OSError) and err.errno == errno.EADDRINUSE:
            print(f"{PROG}: socket {args.socket} is in use", file=sys.stderr)
        else:
            print(f"{PROG}: cannot start: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
