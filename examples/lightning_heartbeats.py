"""Lightning DDP training whose hangs are detected with heartbeats: ``FaultToleranceCallback``.

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    FAULT_TOL_FINISHED_FLAG_FILE=runs/lightning_heartbeats/finished.flag \\
    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --ft-param-initial_rank_heartbeat_timeout=120 --ft-param-rank_heartbeat_timeout=5 \\
        examples/lightning_heartbeats.py --run-dir runs/lightning_heartbeats --simulate-fault rank_hung

What happens: the callback connects each rank to its monitor and sends a heartbeat after every
training and validation batch. ``--fault-delay`` seconds after setup the last rank freezes
(``SIGSTOP``); the other rank waits for it in DDP's gradient all-reduce, so both stop sending
heartbeats, and ``rank_heartbeat_timeout`` (5 s) later their monitors stop them. ``ft_launcher``
restarts both; they resume from ``RUN_DIR/checkpoints/last.ckpt`` and train to ``--max-steps``.
That run both loaded and saved a checkpoint, so at its end the callback calculates heartbeat
timeouts from what it saw, and rank 0 saves them to ``RUN_DIR/ft_state/_ft_state.json`` for the
next run. Rank 0 then creates the finished flag. Leave out ``--simulate-fault`` for a run without
a fault, and the variable for a run without the flag.

``scripts/autoresume.sh`` runs such a script until the flag exists (``make demo`` does, with this
script). On CPU the ranks use gloo; with GPUs, nccl (one rank per GPU).
"""

from __future__ import annotations

import logging
import os

import _common.ptl as common  # the training around the callback: Trainer, model, command line

from ft_core.wire.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR
from ptl_resiliency import FaultToleranceCallback

log = logging.getLogger("lightning_heartbeats")


def main() -> None:
    args = common.parse_lightning_args(__doc__, max_steps=120, fault_delay=4.0)
    common.setup_logging()
    fault_tolerance = FaultToleranceCallback(
        # The finished flag needs to know where to go; without the variable, no flag.
        autoresume=bool(os.environ.get(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR)),
        calculate_timeouts=True,
        exp_dir=args.run_dir / "ft_state",
        simulated_fault_params=common.first_run_fault_params(args),  # None without --simulate-fault
    )
    # A DDP Trainer with the callback, saving RUN_DIR/checkpoints/last.ckpt and resuming from it.
    common.fit_from_last_checkpoint(args, fault_tolerance, log)


if __name__ == "__main__":
    main()
