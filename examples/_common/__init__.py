"""Plumbing shared by the examples, so that each example file shows only its fault tolerance.

Nothing here talks to fault tolerance: the rank monitor client, the integration and the Lightning
callbacks are all called from the example files themselves, in their documented order.

- this module: logging, command-line checks and the simulated-fault parameters, for every example;
- :mod:`_common.ddp`: the plain PyTorch DDP training (process group, toy model, synthetic data,
  checkpoint, timeouts file, finished flag) of ``train_ddp_*.py`` and ``train_loop_integration.py``;
- :mod:`_common.ptl`: the Lightning ``Trainer`` and model of ``lightning_*.py`` and
  ``slurm/train_lightning.py``.

The examples are run as scripts (``python examples/NAME.py`` under ``ft_launcher``), so Python
puts ``examples/`` on ``sys.path`` and ``import _common`` finds this package.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterable
from typing import Optional

from ft_core.simulated_fault import SimulatedFaultParams

__all__ = [
    "add_fault_options",
    "check_args",
    "is_first_autoresume_attempt",
    "is_first_cycle",
    "setup_logging",
    "simulated_fault_params",
]


def setup_logging() -> None:
    """Log INFO and above to stderr, each line tagged with the rank (``RANK`` from ft_launcher)."""
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [rank {os.environ.get('RANK', '?')}] %(name)s: %(message)s")


def add_fault_options(parser: argparse.ArgumentParser, *, simulate_help: str, delay: float,
                      delay_help: str) -> None:
    """Add ``--simulate-fault``, ``--fault-rank`` and ``--fault-delay`` to ``parser``.

    Args:
        parser: The example's parser.
        simulate_help: The help of ``--simulate-fault``: when the fault comes.
        delay: The default of ``--fault-delay``, in seconds.
        delay_help: The help of ``--fault-delay``.
    """
    parser.add_argument("--simulate-fault", choices=["rank_hung", "rank_killed"], help=simulate_help)
    parser.add_argument("--fault-rank", type=int, help="rank to fail (default: the last one)")
    parser.add_argument("--fault-delay", type=float, default=delay, help=delay_help)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace, *,
               at_least_one: Iterable[str] = (), non_negative: Iterable[str] = ()) -> argparse.Namespace:
    """Return ``args`` once the named options are in range; else exit with the parser's usage error.

    Args:
        parser: The parser that made ``args`` (its ``error`` prints the usage and exits with 2).
        args: The parsed options.
        at_least_one: Attribute names (``max_steps``) of options that must be 1 or more.
        non_negative: Attribute names of options that must not be negative.
    """
    for name in at_least_one:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in non_negative:
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    return args


def is_first_cycle() -> bool:
    """Whether this is ft_launcher's first cycle (``FT_LAUNCHER_CYCLE``), not a restart."""
    return os.environ.get("FT_LAUNCHER_CYCLE", "0") == "0"


def is_first_autoresume_attempt() -> bool:
    """Whether this is ``scripts/autoresume.sh``'s first attempt (``AUTORESUME_ATTEMPT``), or no loop runs."""
    return os.environ.get("AUTORESUME_ATTEMPT", "1") == "1"


def simulated_fault_params(args: argparse.Namespace, world_size: int, *,
                           armed: bool) -> Optional[SimulatedFaultParams]:
    """The fault that ``--simulate-fault`` asks for, or ``None`` for no fault.

    Args:
        args: Options added by :func:`add_fault_options`.
        world_size: Number of ranks; by default the last one fails (``--fault-rank``).
        armed: ``False`` means no fault whatever the options say: pass it for restarted runs,
            or every restart would fail again.
    """
    if not args.simulate_fault or not armed:
        return None
    target = world_size - 1 if args.fault_rank is None else args.fault_rank
    return SimulatedFaultParams(args.simulate_fault, args.fault_delay, rank_to_fail=target)
