"""The Lightning training behind ``lightning_heartbeats.py``, ``lightning_sections.py`` and
``slurm/train_lightning.py``: everything they do that is not fault tolerance.

- :class:`SlowBoringModel`: Lightning's ``BoringModel``, slowed down to stand in for a real model;
- :func:`make_trainer`: a DDP ``Trainer`` for ranks started by ``ft_launcher``, saving
  ``RUN_DIR/checkpoints/last.ckpt`` (:func:`last_checkpoint`) every N steps;
- :func:`parse_lightning_args`, :func:`first_run_fault_params` and :func:`fit_from_last_checkpoint`:
  the command line, the simulated fault and the training run of the two ``lightning_*.py`` examples;
- and, from :mod:`_common`, :func:`setup_logging` and :func:`check_args`, so that an example
  needs only this module.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins.environments import TorchElasticEnvironment

from ft_core.simulated_fault import SimulatedFaultParams

from . import (
    add_fault_options,
    check_args,
    is_first_autoresume_attempt,
    is_first_cycle,
    setup_logging,
    simulated_fault_params,
)

__all__ = [
    "SlowBoringModel",
    "check_args",
    "first_run_fault_params",
    "fit_from_last_checkpoint",
    "last_checkpoint",
    "make_trainer",
    "parse_lightning_args",
    "setup_logging",
]


class SlowBoringModel(BoringModel):
    """Lightning's BoringModel; ``step_time`` seconds per step stand in for a real model.

    With ``progress_log``, it logs the step range at the start of training (after a checkpoint was
    restored, so the first step is known).
    """

    def __init__(self, step_time: float, progress_log: Optional[logging.Logger] = None) -> None:
        super().__init__()
        self.step_time = step_time
        self.progress_log = progress_log

    def on_train_start(self) -> None:
        if self.progress_log is not None:
            self.progress_log.info("training from step %d to step %d",
                                   self.trainer.global_step, self.trainer.max_steps)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.step_time > 0:
            time.sleep(self.step_time)
        return super().training_step(batch, batch_idx)


def last_checkpoint(run_dir: Path) -> Path:
    """``RUN_DIR/checkpoints/last.ckpt``: where :func:`make_trainer`'s checkpoints go."""
    return run_dir / "checkpoints" / "last.ckpt"


def make_trainer(run_dir: Path, *, max_steps: int, checkpoint_every: int, limit_val_batches: int,
                 callbacks: Sequence[Callback]) -> Trainer:
    """A DDP ``Trainer`` for this process's rank, as started by ``ft_launcher`` (a torchrun).

    One process per device (``LOCAL_WORLD_SIZE``) on ``WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes, gloo
    on CPU and nccl on GPUs; the cluster environment is torchelastic's, also inside a SLURM job.
    Trains to ``max_steps`` (no epoch limit), validates on ``limit_val_batches`` batches (no sanity
    check), saves :func:`last_checkpoint` every ``checkpoint_every`` steps, and logs no metrics.

    Args:
        run_dir: Root of the run: ``checkpoints/`` goes there.
        max_steps: Training is complete at this step.
        checkpoint_every: Save ``last.ckpt`` every N training steps.
        limit_val_batches: Validation batches per validation run; 0 turns validation off.
        callbacks: The example's callbacks, after the checkpoint callback.
    """
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Trainer(
        accelerator="auto",
        devices=devices,
        num_nodes=max(1, world_size // devices),
        strategy="ddp",
        plugins=[TorchElasticEnvironment()],  # ft_launcher is a torchrun
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=limit_val_batches,
        num_sanity_val_steps=0,
        default_root_dir=str(run_dir),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(dirpath=str(last_checkpoint(run_dir).parent), save_last=True, save_top_k=0,
                            every_n_train_steps=checkpoint_every),
            *callbacks,
        ],
    )


def parse_lightning_args(doc: str, *, max_steps: int, fault_delay: float) -> argparse.Namespace:
    """The command line of the ``lightning_*.py`` examples: the same options, other defaults.

    Args:
        doc: The example's module docstring; its first paragraph becomes the description.
        max_steps: The default of ``--max-steps``.
        fault_delay: The default of ``--fault-delay``, in seconds.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="directory for checkpoints (RUN_DIR/checkpoints) and the timeouts file")
    parser.add_argument("--max-steps", type=int, default=max_steps, help="training is complete at this step")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save last.ckpt every N steps")
    parser.add_argument("--step-time", type=float, default=0.05,
                        help="seconds each step sleeps, standing in for a real model's compute")
    add_fault_options(parser, simulate_help="in the first attempt and cycle, freeze or kill one rank",
                      delay=fault_delay, delay_help="seconds from setup to the fault")
    return check_args(parser, parser.parse_args(), at_least_one=("max_steps", "checkpoint_every"),
                      non_negative=("step_time", "fault_delay"))


def first_run_fault_params(args: argparse.Namespace) -> Optional[SimulatedFaultParams]:
    """The fault ``--simulate-fault`` asks for, in the first cycle of the first auto-resume attempt.

    ``None`` without ``--simulate-fault`` and in every later run, or every restart would fail again.
    """
    return simulated_fault_params(args, int(os.environ.get("WORLD_SIZE", "1")),
                                  armed=is_first_cycle() and is_first_autoresume_attempt())


def fit_from_last_checkpoint(args: argparse.Namespace, fault_tolerance: Callback, log: logging.Logger) -> None:
    """Train :class:`SlowBoringModel` to ``--max-steps`` with ``fault_tolerance`` among the callbacks.

    Resumes from :func:`last_checkpoint` when it exists and validates on 2 batches. Logs to
    ``log`` where training starts from, the range of steps it trains, and where ``fit`` returned.

    Args:
        args: Options from :func:`parse_lightning_args`.
        fault_tolerance: The fault tolerance callback the example is about.
        log: The example's logger.
    """
    trainer = make_trainer(args.run_dir, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
                           limit_val_batches=2, callbacks=[fault_tolerance])
    last = last_checkpoint(args.run_dir)
    resume_from = str(last) if last.exists() else None
    log.info("%s", f"resuming from {resume_from}" if resume_from else "starting from scratch")
    trainer.fit(SlowBoringModel(args.step_time, progress_log=log), ckpt_path=resume_from)
    log.info("fit returned at step %d of %d", trainer.global_step, args.max_steps)
    if torch.distributed.is_initialized():
        # Lightning leaves a gloo process group alive; torch's gloo threads can then abort the
        # interpreter's exit (SIGABRT, "terminate called without an active exception"), which
        # the launcher would rightly count as a crash. PyTorch asks for this call at the end.
        torch.distributed.destroy_process_group()
