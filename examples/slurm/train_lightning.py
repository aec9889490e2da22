"""Lightning training that an auto-resume loop can stop and resume: the sbatch example's workload.

Run it under ``ft_launcher`` (which sets the torchelastic environment), normally through
``scripts/autoresume.sh``; ``lightning_autoresume.sbatch`` does so on several SLURM nodes. On one
machine, from the repository root::

    scripts/autoresume.sh --run-dir runs/demo \\
        --launcher-args "--standalone --nproc-per-node 2" \\
        examples/slurm/train_lightning.py --run-dir runs/demo --max-steps 200

What makes it resumable:

- Every run continues from ``RUN_DIR/checkpoints/last.ckpt`` when that exists.
- ``FaultToleranceCallback(graceful_stop=...)``: on SIGUSR1 or SIGUSR2 (SLURM's warning before
  the time limit or a preemption, forwarded by autoresume.sh and ft_launcher to every rank) or
  SIGTERM, all ranks agree on a step (one small all-reduce about once a second, not a collective
  per step), save ``last.ckpt`` there, outside the signal handler, and leave ``fit``; the process
  exits 0. Training is then not complete, so no finished flag is made, and the loop continues the
  job from that checkpoint; that ending does not count as a failure.
- ``FaultToleranceCallback(autoresume=True)`` sends heartbeats to the rank monitors (hang
  detection) and creates ``$FAULT_TOL_FINISHED_FLAG_FILE`` once ``max_steps`` is reached; that
  file ends the loop.
- The cluster environment is given explicitly as torchelastic's (``make_trainer`` in
  ``examples/_common/ptl.py``): inside an srun task Lightning would otherwise pick its SLURM
  environment, take one srun task for one rank, and install its own SIGUSR1 handler that
  requeues the job by itself.

On CPU the ranks use gloo; with GPUs, nccl (one process per GPU: ``--nproc-per-node`` = GPUs).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ptl_resiliency import FaultToleranceCallback

# The helpers shared by the examples are in examples/_common; Python puts only this script's
# directory (examples/slurm) on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common.ptl as common  # noqa: E402  (the Trainer and model of the Lightning examples)

log = logging.getLogger("train_lightning")
STOP_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")  # SLURM's warnings, and its end of the job


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="shared directory for checkpoints and the fault tolerance state")
    parser.add_argument("--max-steps", type=int, default=2000, help="training is complete at this step")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="save last.ckpt every N steps")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="seconds to sleep in each step, to make the demo last")
    return common.check_args(parser, parser.parse_args(), at_least_one=("max_steps", "checkpoint_every"),
                             non_negative=("step_delay",))


def main() -> None:
    args = parse_args()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    last = common.last_checkpoint(args.run_dir)
    trainer = common.make_trainer(
        args.run_dir, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
        limit_val_batches=0,  # no validation
        callbacks=[
            FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=str(args.run_dir),
                                   graceful_stop={"signals": STOP_SIGNALS, "checkpoint_path": str(last)}),
        ],
    )
    resume_from = str(last) if last.exists() else None
    log.info("rank %s, attempt %s: %s", rank, os.environ.get("AUTORESUME_ATTEMPT", "?"),
             f"resuming from {resume_from}" if resume_from else "starting from scratch")
    # After a graceful stop fit raises GracefulStopExit, a SystemExit(0): the process exits 0.
    trainer.fit(common.SlowBoringModel(args.step_delay), ckpt_path=resume_from)
    log.info("rank %s: fit returned at step %d of %d", rank, trainer.global_step, args.max_steps)


if __name__ == "__main__":
    main()
