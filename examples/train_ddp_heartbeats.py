"""Plain PyTorch DDP training whose hangs are detected with heartbeats (``RankMonitorClient``).

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --fault-tol-cfg-path examples/configs/heartbeats.yaml \\
        examples/train_ddp_heartbeats.py --run-dir runs/ddp_heartbeats --simulate-fault rank_hung

What happens: both ranks train. The config's heartbeat timeouts are null (no limit), so at the
first checkpoint after ``--calc-timeouts-after`` steps the ranks calculate timeouts from the
heartbeat intervals they saw, and rank 0 saves them to ``RUN_DIR/ft_state.json``. Hang
detection is now on, and the simulated fault is armed: a second later the last rank freezes
(``SIGSTOP``), its monitor sees its heartbeats stop and kills it, and ``ft_launcher`` restarts
both ranks. They load the saved timeouts and the last checkpoint, and training finishes. Leave
out ``--simulate-fault`` for a run without a fault; run the command again and it starts with the
saved timeouts (and, here, finds training already finished).

The client calls, in the documented order (the "Heartbeats API integration" guide):

1. ``init_workload_monitoring()``, after the process group is up;
2. ``load_state_dict()`` with the timeouts an earlier run saved, if there are any;
3. ``send_heartbeat()`` after every step and after every checkpoint save;
4. ``calculate_and_set_hb_timeouts()`` at checkpoints once enough intervals were seen (every rank
   calls it at the same point, and all get the same timeouts);
5. rank 0 saves ``state_dict()`` to the state file, atomically;
6. ``shutdown_workload_monitoring()`` at the end.

When ``FAULT_TOL_FINISHED_FLAG_FILE`` is set (``scripts/autoresume.sh`` sets it), rank 0 creates
that file once training is complete. On CPU the ranks use gloo; with GPUs, nccl (one rank per
GPU: ``--nproc-per-node`` = number of GPUs).
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

from ft_core import RankMonitorClient, RankMonitorClientError
from ft_core.atomic import atomic_write_bytes, atomic_write_text
from ft_core.simulated_fault import SimulatedFault, SimulatedFaultParams, setup_simulated_fault

log = logging.getLogger("train_ddp_heartbeats")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="directory for the checkpoint and the timeouts file")
    parser.add_argument("--max-steps", type=int, default=40, help="training is complete after this many steps")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save a checkpoint every N steps")
    parser.add_argument("--calc-timeouts-after", type=int, default=10,
                        help="calculate timeouts at checkpoints once this run did N steps")
    parser.add_argument("--step-time", type=float, default=0.1,
                        help="seconds each step sleeps, standing in for a real model's compute")
    parser.add_argument("--data-time", type=float, default=0.02,
                        help="seconds loading a batch takes, standing in for a real data loader")
    parser.add_argument("--save-time", type=float, default=0.1,
                        help="seconds a checkpoint save takes on every rank, standing in for real I/O")
    parser.add_argument("--simulate-fault", choices=["rank_hung", "rank_killed"],
                        help="in the first cycle, freeze or kill one rank once hang detection is on")
    parser.add_argument("--fault-rank", type=int, help="rank to fail (default: the last one)")
    parser.add_argument("--fault-delay", type=float, default=1.0,
                        help="seconds from arming the fault to the fault")
    args = parser.parse_args()
    for name in ("max_steps", "checkpoint_every", "calc_timeouts_after"):
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


def make_batch(step: int, rank: int, device: torch.device, data_time: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A reproducible synthetic batch: the target is a fixed function of the input."""
    time.sleep(data_time)
    generator = torch.Generator().manual_seed(step * 1000 + rank)
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


def load_timeouts(client: RankMonitorClient, path: Path) -> None:
    """Step 2: restore timeouts calculated by an earlier run; a bad file only costs a warning."""
    if not path.exists():
        log.info("no timeouts file %s yet: the config's timeouts apply", path)
        return
    try:
        client.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RankMonitorClientError) as err:
        log.warning("ignoring timeouts file %s: %s", path, err)
        return
    log.info("loaded heartbeat timeouts from %s: %s", path, client.hb_timeouts.to_dict())


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
    args.run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = args.run_dir / "checkpoint.pt"
    timeouts_path = args.run_dir / "ft_state.json"

    client = RankMonitorClient()
    client.init_workload_monitoring()                                   # 1.
    load_timeouts(client, timeouts_path)                                # 2.

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start_step = load_checkpoint(checkpoint_path, model, optimizer, device)
    log.info("%s", f"resuming from step {start_step}" if start_step else "starting from step 0")
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    fault: Optional[SimulatedFault] = None

    def arm_fault_once_watched() -> Optional[SimulatedFault]:
        # Every rank decides alike (timeouts are the same on all ranks), so all take part in
        # the plan's broadcast. Only in the first cycle: a restart must not fail again.
        if fault is not None or not args.simulate_fault or not first_cycle or not client.hb_timeouts.are_valid:
            return fault
        target = world_size - 1 if args.fault_rank is None else args.fault_rank
        return setup_simulated_fault(SimulatedFaultParams(args.simulate_fault, args.fault_delay, rank_to_fail=target))

    fault = arm_fault_once_watched()
    step = start_step
    for step in range(start_step + 1, args.max_steps + 1):
        x, y = make_batch(step, rank, device, args.data_time)
        loss = nn.functional.mse_loss(ddp_model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        client.send_heartbeat()                                         # 3.
        if step % args.checkpoint_every == 0 or step == args.max_steps:
            save_checkpoint(checkpoint_path, model, optimizer, step, args.save_time)
            client.send_heartbeat()                                     # 3. (the save took a while)
            if step - start_step >= args.calc_timeouts_after:
                if client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):   # 4.
                    if rank == 0:                                       # 5.
                        atomic_write_text(timeouts_path, json.dumps(client.state_dict(), indent=2) + "\n")
                        log.info("step %d: saved heartbeat timeouts %s to %s", step,
                                 client.hb_timeouts.to_dict(), timeouts_path)
                fault = arm_fault_once_watched()
            if rank == 0:
                log.info("step %d: loss %.4f, checkpoint saved", step, loss.item())

    if fault is not None:
        fault.cancel()
    create_finished_flag(step)
    client.shutdown_workload_monitoring()                               # 6.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
