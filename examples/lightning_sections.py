"""Lightning DDP training whose hangs are detected with sections: ``FaultToleranceSectionsCallback``.

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    FAULT_TOL_FINISHED_FLAG_FILE=runs/lightning_sections/finished.flag \\
    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --fault-tol-cfg-path examples/configs/sections.yaml \\
        examples/lightning_sections.py --run-dir runs/lightning_sections

What happens: the callback connects each rank to its monitor and wraps the phases of training in
sections, each with its timeout from the config: ``setup`` (from the callback's setup to the first
batch: model and strategy setup, checkpoint loading), ``step`` (each training and validation
batch but the first of the run and of each validation run, which warm up out of section) and
``checkpointing`` (every checkpoint save). Everything between them is out of section. The
callback sends no heartbeats (the config turns the heartbeat timeouts off). Each checkpoint save
recalculates, from the durations seen on all ranks (times the config's ``safety_factor``, at
least the config's ``min_calculated_*`` minimums), the timeouts there is data for:
``checkpointing`` at once, ``step`` once 16 steps ran, and in a run that resumed from a
checkpoint also ``setup`` and the out-of-section timeout; rank 0 saves them to
``RUN_DIR/ft_state/_ft_state.json``. The next run starts with the saved timeouts. Rank 0 creates
the finished flag when ``--max-steps`` is reached.

Add ``--simulate-fault rank_hung`` to freeze the last rank ``--fault-delay`` seconds after setup,
in the first cycle: the other rank waits for it inside its step, the ``step`` timeout expires,
both ranks are stopped and restarted, and training resumes from
``RUN_DIR/checkpoints/last.ckpt``. Leave out the variable for a run without the flag.

On CPU the ranks use gloo; with GPUs, nccl (one rank per GPU).
"""

from __future__ import annotations

import logging
import os

import _common.ptl as common  # the training around the callback: Trainer, model, command line

from ft_core.wire.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR
from ptl_resiliency import FaultToleranceSectionsCallback

log = logging.getLogger("lightning_sections")


def main() -> None:
    args = common.parse_lightning_args(__doc__, max_steps=60, fault_delay=3.0)
    common.setup_logging()
    fault_tolerance = FaultToleranceSectionsCallback(
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
