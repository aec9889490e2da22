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

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins.environments import TorchElasticEnvironment

from ft_core.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR
from ptl_resiliency import FaultToleranceCallback, SimulatedFaultParams

log = logging.getLogger("lightning_heartbeats")


class SlowBoringModel(BoringModel):
    """Lightning's BoringModel; ``step_time`` seconds per step stand in for a real model."""

    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.step_time = step_time

    def on_train_start(self) -> None:
        log.info("training from step %d to step %d", self.trainer.global_step, self.trainer.max_steps)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(self.step_time)
        return super().training_step(batch, batch_idx)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="directory for checkpoints (RUN_DIR/checkpoints) and the timeouts file")
    parser.add_argument("--max-steps", type=int, default=120, help="training is complete at this step")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save last.ckpt every N steps")
    parser.add_argument("--step-time", type=float, default=0.05,
                        help="seconds each step sleeps, standing in for a real model's compute")
    parser.add_argument("--simulate-fault", choices=["rank_hung", "rank_killed"],
                        help="in the first attempt and cycle, freeze or kill one rank")
    parser.add_argument("--fault-rank", type=int, help="rank to fail (default: the last one)")
    parser.add_argument("--fault-delay", type=float, default=4.0, help="seconds from setup to the fault")
    args = parser.parse_args()
    for name in ("max_steps", "checkpoint_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("step_time", "fault_delay"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    return args


def fault_params(args: argparse.Namespace, world_size: int) -> SimulatedFaultParams | None:
    """The fault to simulate: only in the first cycle of the first attempt, or every restart fails."""
    first = os.environ.get("FT_LAUNCHER_CYCLE", "0") == "0" and os.environ.get("AUTORESUME_ATTEMPT", "1") == "1"
    if not args.simulate_fault or not first:
        return None
    target = world_size - 1 if args.fault_rank is None else args.fault_rank
    return SimulatedFaultParams(args.simulate_fault, args.fault_delay, rank_to_fail=target)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [rank {os.environ.get('RANK', '?')}] %(name)s: %(message)s")
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    checkpoints = args.run_dir / "checkpoints"
    last = checkpoints / "last.ckpt"

    fault_tolerance = FaultToleranceCallback(
        # The finished flag needs to know where to go; without the variable, no flag.
        autoresume=bool(os.environ.get(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR)),
        calculate_timeouts=True,
        exp_dir=args.run_dir / "ft_state",
        simulated_fault_params=fault_params(args, world_size),
    )
    trainer = Trainer(
        accelerator="auto",
        devices=devices,
        num_nodes=max(1, world_size // devices),
        strategy="ddp",
        plugins=[TorchElasticEnvironment()],  # ft_launcher is a torchrun
        max_steps=args.max_steps,
        max_epochs=-1,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        default_root_dir=str(args.run_dir),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(dirpath=str(checkpoints), save_last=True, save_top_k=0,
                            every_n_train_steps=args.checkpoint_every),
            fault_tolerance,
        ],
    )
    resume_from = str(last) if last.exists() else None
    log.info("%s", f"resuming from {resume_from}" if resume_from else "starting from scratch")
    trainer.fit(SlowBoringModel(args.step_time), ckpt_path=resume_from)
    log.info("fit returned at step %d of %d", trainer.global_step, args.max_steps)


if __name__ == "__main__":
    main()
