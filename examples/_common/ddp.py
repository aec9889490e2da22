"""The plain PyTorch DDP training behind ``train_ddp_heartbeats.py``, ``train_ddp_sections.py`` and
``train_loop_integration.py``: everything they do that is not fault tolerance.

- :func:`parse_training_args`: their command line;
- :func:`init_distributed`: join the process group that ``ft_launcher`` set up;
- :class:`ToyTraining`: a tiny model trained with DDP on synthetic batches, checkpointed to one
  file, with sleeps standing in for real data loading, compute and I/O;
- :func:`read_timeouts_file` / :func:`write_timeouts_file`: the file that keeps the rank monitor
  client's ``state_dict()`` (the calculated timeouts) from one run to the next;
- :func:`create_finished_flag`: tell an auto-resume loop that training is complete;
- and, from :mod:`_common`, :func:`setup_logging`, :func:`is_first_cycle` and
  :func:`simulated_fault_params`, so that an example needs only this module.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ft_core.wire.atomic import atomic_write_bytes, atomic_write_text

from . import add_fault_options, check_args, is_first_cycle, setup_logging, simulated_fault_params

__all__ = [
    "ToyTraining",
    "create_finished_flag",
    "init_distributed",
    "is_first_cycle",
    "parse_training_args",
    "read_timeouts_file",
    "setup_logging",
    "simulated_fault_params",
    "write_timeouts_file",
]

Batch = tuple[torch.Tensor, torch.Tensor]


def parse_training_args(doc: str, *, max_steps: int, simulate_help: str,
                        run_dir_help: str = "directory for the checkpoint and the timeouts file",
                        calc_timeouts_after: bool = False, evaluation: bool = False) -> argparse.Namespace:
    """Parse the command line of a plain PyTorch example.

    An option out of range ends the program with a usage error that names it. Every example has
    ``--run-dir``, ``--max-steps``, ``--checkpoint-every``, the sleeps (``--step-time``,
    ``--data-time``, ``--save-time``) and the simulated fault (``--simulate-fault``,
    ``--fault-rank``, ``--fault-delay``).

    Args:
        doc: The example's module docstring; its first paragraph becomes the description.
        max_steps: The default of ``--max-steps``.
        simulate_help: The help of ``--simulate-fault``: when the fault comes.
        run_dir_help: The help of ``--run-dir``: what goes there.
        calc_timeouts_after: Add ``--calc-timeouts-after`` (default 10): the example calculates
            timeouts at checkpoints once the run did that many steps.
        evaluation: Add ``--eval-every`` (default 25) and ``--eval-steps`` (default 3).
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help=run_dir_help)
    parser.add_argument("--max-steps", type=int, default=max_steps, help="training is complete after this many steps")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save a checkpoint every N steps")
    at_least_one = ["max_steps", "checkpoint_every"]
    if calc_timeouts_after:
        parser.add_argument("--calc-timeouts-after", type=int, default=10,
                            help="calculate timeouts at checkpoints once this run did N steps")
        at_least_one.append("calc_timeouts_after")
    if evaluation:
        parser.add_argument("--eval-every", type=int, default=25, help="evaluate every N steps")
        parser.add_argument("--eval-steps", type=int, default=3, help="batches per evaluation")
        at_least_one += ["eval_every", "eval_steps"]
    parser.add_argument("--step-time", type=float, default=0.1,
                        help="seconds each step sleeps, standing in for a real model's compute")
    parser.add_argument("--data-time", type=float, default=0.02,
                        help="seconds loading a batch takes, standing in for a real data loader")
    parser.add_argument("--save-time", type=float, default=0.1,
                        help="seconds a checkpoint save takes on every rank, standing in for real I/O")
    add_fault_options(parser, simulate_help=simulate_help, delay=1.0,
                      delay_help="seconds from arming the fault to the fault")
    return check_args(parser, parser.parse_args(), at_least_one=at_least_one,
                      non_negative=("step_time", "data_time", "save_time", "fault_delay"))


def init_distributed() -> torch.device:
    """Join the process group ft_launcher set up: nccl with one GPU per rank, else gloo."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


class ToyTraining:
    """A tiny regression model trained with DDP on reproducible synthetic batches.

    Create it once the process group is up. It builds the model and optimizer (the same initial
    weights on every rank), restores ``checkpoint_path`` when that file exists, and wraps the model
    in DDP. The sleeps of ``--data-time``, ``--step-time`` and ``--save-time`` stand in for the
    time a real data loader, model and checkpoint take.

    Args:
        args: Options from :func:`parse_training_args` (``--max-steps``, the sleeps, ...).
        device: Where the model lives (:func:`init_distributed`).
        checkpoint_path: The checkpoint to resume from and to save to; its directory is created.

    Attributes:
        start_step: The step the restored checkpoint was saved at; 0 without a checkpoint.
        model: The model itself (for evaluation and checkpoints); ``ddp_model`` wraps it.
    """

    def __init__(self, args: argparse.Namespace, device: torch.device, checkpoint_path: Path) -> None:
        self.args = args
        self.device = device
        self.rank = dist.get_rank()
        self.checkpoint_path = checkpoint_path
        checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.start_step = self._load_checkpoint()
        self.ddp_model = DistributedDataParallel(
            self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def steps(self) -> range:
        """The steps left to train: from the one after ``start_step`` to ``--max-steps``."""
        return range(self.start_step + 1, self.args.max_steps + 1)

    def next_batch(self, step: int) -> Batch:
        """Load this rank's batch for ``step`` (takes ``--data-time``)."""
        return self._make_batch(step * 1000 + self.rank)

    def train_step(self, batch: Batch) -> torch.Tensor:
        """Forward, backward (DDP's gradient all-reduce) and optimizer step; returns the loss."""
        x, y = batch
        loss = nn.functional.mse_loss(self.ddp_model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        time.sleep(self.args.step_time)
        return loss

    def is_checkpoint_step(self, step: int) -> bool:
        """Whether a checkpoint is due after ``step``: every ``--checkpoint-every`` steps and at the end."""
        return step % self.args.checkpoint_every == 0 or step == self.args.max_steps

    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes the checkpoint atomically; every rank waits until it is complete."""
        time.sleep(self.args.save_time)
        if self.rank == 0:
            buffer = io.BytesIO()
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "step": step}, buffer)
            atomic_write_bytes(self.checkpoint_path, buffer.getvalue())
        dist.barrier()

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Evaluation mode without gradients inside the block; training mode again after it."""
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train()

    def eval_batch(self, index: int) -> Batch:
        """Load this rank's ``index``-th evaluation batch (takes ``--data-time``)."""
        return self._make_batch(10_000_000 + index * 1000 + self.rank)

    def eval_step(self, batch: Batch) -> torch.Tensor:
        """The loss of the model on ``batch`` (takes half of ``--step-time``); use in :meth:`evaluating`."""
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        time.sleep(self.args.step_time / 2)
        return loss

    def mean_over_ranks(self, losses: Sequence[torch.Tensor]) -> float:
        """The mean of every rank's ``losses`` (a collective: every rank calls it, with as many)."""
        total = torch.zeros(1, device=self.device)
        for loss in losses:
            total += loss
        dist.all_reduce(total)
        return total.item() / (len(losses) * dist.get_world_size())

    def _make_batch(self, seed: int) -> Batch:
        """A reproducible synthetic batch: the target is a fixed function of the input."""
        time.sleep(self.args.data_time)
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 16, generator=generator)
        y = x.sum(dim=1, keepdim=True).tanh()
        return x.to(self.device), y.to(self.device)

    def _load_checkpoint(self) -> int:
        """Restore the last checkpoint if there is one; return the step to continue from."""
        if not self.checkpoint_path.exists():
            return 0
        checkpoint = torch.load(self.checkpoint_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        return int(checkpoint["step"])


def read_timeouts_file(path: Path, log: logging.Logger) -> Optional[Any]:
    """The JSON that an earlier run saved to ``path`` (for ``load_state_dict()``), or ``None``.

    ``None`` when there is no such file yet (logged at INFO) or it cannot be read as JSON (logged
    as a WARNING): a bad file only means the config's timeouts apply.
    """
    if not path.exists():
        log.info("no timeouts file %s yet: the config's timeouts apply", path)
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        log.warning("ignoring timeouts file %s: %s", path, err)
        return None


def write_timeouts_file(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (a client's ``state_dict()``) to ``path`` as JSON, atomically."""
    atomic_write_text(path, json.dumps(state, indent=2) + "\n")


def create_finished_flag(step: int, log: logging.Logger) -> None:
    """Tell an auto-resume loop that training is complete (rank 0, atomically).

    Only when ``FAULT_TOL_FINISHED_FLAG_FILE`` is set (``scripts/autoresume.sh`` sets it): the
    file gets ``{"completed": true, "global_step": step}``.
    """
    path = os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE")
    if not path or dist.get_rank() != 0:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, json.dumps({"completed": True, "global_step": step}) + "\n")
    log.info("training complete; created %s", path)
