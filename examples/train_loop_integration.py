"""Plain PyTorch DDP training with fault tolerance through ``ft_core.integration``.

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --fault-tol-cfg-path examples/configs/sections.yaml \\
        examples/train_loop_integration.py --run-dir runs/loop_integration --simulate-fault rank_hung

The same training as ``train_ddp_sections.py``, with a short evaluation every ``--eval-every``
steps, but the section bookkeeping is left to ``ft_core.integration``, one call at each point of
the loop:

* ``setup(checkpoint_dir, calculate_timeouts=True)`` opens the ``setup`` section and loads the
  timeouts an earlier run saved in ``checkpoint_dir``;
* ``on_checkpoint_loaded(is_local_chkpt=False)`` after resuming from a checkpoint;
* ``on_training_step_start/end()`` and ``on_eval_step_start/end()`` around each step: the first
  one closes ``setup``; steps are wrapped in ``step`` after the first (warm-up) step;
* ``on_checkpointing_start/end()`` around each save; after a save the timeouts are recalculated
  (``step`` once 16 training steps ran, ``setup`` and out-of-section only in a run that loaded a
  checkpoint) and rank 0 saves them to ``CHECKPOINT_DIR/_ft_state.json``;
* ``shutdown()`` at the end: a last timeouts update, then disconnect.

What happens in the command above: after the first timeouts calculation (the save at step 20)
the simulated fault is armed, and a second later the last rank freezes (``SIGSTOP``). The other
rank waits for it inside its step, past the calculated ``step`` timeout, and the monitors stop
both. ``ft_launcher`` restarts them; they resume from the last checkpoint with the saved timeouts
and finish. Leave out ``--simulate-fault`` for a run without a fault.

When ``FAULT_TOL_FINISHED_FLAG_FILE`` is set (``scripts/autoresume.sh`` sets it), rank 0 creates
that file once training is complete. On CPU the ranks use gloo; with GPUs, nccl.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ft_core.integration as ft_integration
from ft_core.atomic import atomic_write_bytes, atomic_write_text
from ft_core.simulated_fault import SimulatedFaultParams

log = logging.getLogger("train_loop_integration")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="directory for the checkpoints (RUN_DIR/checkpoints) and the timeouts file")
    parser.add_argument("--max-steps", type=int, default=50, help="training is complete after this many steps")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save a checkpoint every N steps")
    parser.add_argument("--eval-every", type=int, default=25, help="evaluate every N steps")
    parser.add_argument("--eval-steps", type=int, default=3, help="batches per evaluation")
    parser.add_argument("--step-time", type=float, default=0.1,
                        help="seconds each step sleeps, standing in for a real model's compute")
    parser.add_argument("--data-time", type=float, default=0.02,
                        help="seconds loading a batch takes, standing in for a real data loader")
    parser.add_argument("--save-time", type=float, default=0.1,
                        help="seconds a checkpoint save takes on every rank, standing in for real I/O")
    parser.add_argument("--simulate-fault", choices=["rank_hung", "rank_killed"],
                        help="in the first cycle, freeze or kill one rank after the first timeouts calculation")
    parser.add_argument("--fault-rank", type=int, help="rank to fail (default: the last one)")
    parser.add_argument("--fault-delay", type=float, default=1.0,
                        help="seconds from arming the fault to the fault")
    args = parser.parse_args()
    for name in ("max_steps", "checkpoint_every", "eval_every", "eval_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("step_time", "data_time", "save_time", "fault_delay"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    return args


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


def make_batch(seed: int, device: torch.device, data_time: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A reproducible synthetic batch: the target is a fixed function of the input."""
    time.sleep(data_time)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 16, generator=generator)
    y = x.sum(dim=1, keepdim=True).tanh()
    return x.to(device), y.to(device)


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                    save_time: float) -> None:
    """Rank 0 writes the checkpoint atomically; every rank waits until it is complete."""
    time.sleep(save_time)
    if dist.get_rank() == 0:
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, buffer)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue())
    dist.barrier()


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Restore the last checkpoint if there is one; return the step to continue from."""
    if not path.exists():
        return 0
    checkpoint = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return int(checkpoint["step"])


def evaluate(model: nn.Module, step: int, args: argparse.Namespace, device: torch.device) -> float:
    """Mean evaluation loss over all ranks; each batch is wrapped like a training step."""
    model.eval()
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for index in range(args.eval_steps):
            x, y = make_batch(10_000_000 + index * 1000 + dist.get_rank(), device, args.data_time)
            ft_integration.on_eval_step_start()
            total += nn.functional.mse_loss(model(x), y)
            time.sleep(args.step_time / 2)
            ft_integration.on_eval_step_end()
    model.train()
    dist.all_reduce(total)
    return total.item() / (args.eval_steps * dist.get_world_size())


def create_finished_flag(step: int) -> None:
    """Tell an auto-resume loop that training is complete (rank 0, atomically)."""
    path = os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE")
    if not path or dist.get_rank() != 0:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, json.dumps({"completed": True, "global_step": step}) + "\n")
    log.info("training complete; created %s", path)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [rank {os.environ.get('RANK', '?')}] %(name)s: %(message)s")
    device = init_distributed()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first_cycle = os.environ.get("FT_LAUNCHER_CYCLE", "0") == "0"
    checkpoint_dir = args.run_dir / "checkpoints"
    checkpoint_path = checkpoint_dir / "checkpoint.pt"

    # After the process group: setup is a collective (rank 0 reads the timeouts file).
    ft_integration.setup(checkpoint_dir, calculate_timeouts=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start_step = load_checkpoint(checkpoint_path, model, optimizer, device)
    if start_step:
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
    log.info("%s", f"resumed from step {start_step}" if start_step else "starting from step 0")
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    fault_params: Optional[SimulatedFaultParams] = None
    if args.simulate_fault and first_cycle:  # only in the first cycle, or every restart fails again
        target = world_size - 1 if args.fault_rank is None else args.fault_rank
        fault_params = SimulatedFaultParams(args.simulate_fault, args.fault_delay, rank_to_fail=target)

    step = start_step
    for step in range(start_step + 1, args.max_steps + 1):
        x, y = make_batch(step * 1000 + rank, device, args.data_time)   # data loading: out of section
        ft_integration.on_training_step_start()
        loss = nn.functional.mse_loss(ddp_model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        ft_integration.on_training_step_end()

        if step % args.eval_every == 0:
            eval_loss = evaluate(model, step, args, device)
            if rank == 0:
                log.info("step %d: evaluation loss %.4f", step, eval_loss)
        if step % args.checkpoint_every == 0 or step == args.max_steps:
            ft_integration.on_checkpointing_start()
            save_checkpoint(checkpoint_path, model, optimizer, step, args.save_time)
            ft_integration.on_checkpointing_end(is_async_finalization=False)  # may update timeouts
            if rank == 0:
                log.info("step %d: loss %.4f, checkpoint saved", step, loss.item())
            client = ft_integration.get_rank_monitor_client()
            if fault_params is not None and client is not None and "step" in client.section_timeouts.calculated_sections:
                # Armed once the step timeout is calculated (the same on all ranks, so all call it).
                ft_integration.maybe_setup_simulated_fault(fault_params)
                fault_params = None

    create_finished_flag(step)
    ft_integration.shutdown()  # final timeouts update (a collective), cancels the fault, disconnects
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
