"""Plain PyTorch DDP training whose hangs are detected with heartbeats (``RankMonitorClient``).

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --fault-tol-cfg-path examples/configs/heartbeats.yaml \\
        --ft-param-min_calculated_heartbeat_timeout=1 \\
        examples/train_ddp_heartbeats.py --run-dir runs/ddp_heartbeats --simulate-fault rank_hung

``--ft-param-min_calculated_heartbeat_timeout=1`` lowers the smallest calculated heartbeat
timeout the client applies (default: 120 s, safe for real training), so that this demo's
tiny steps give a timeout of about a second and the frozen rank is caught at once; leave it out
in real training.

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

import logging
from typing import Optional

import _common.ddp as common  # the training around the fault tolerance calls: process group, model, files
import torch.distributed as dist

from ft_core import RankMonitorClient, RankMonitorClientError
from ft_core.simulated_fault import SimulatedFault, setup_simulated_fault

log = logging.getLogger("train_ddp_heartbeats")


def main() -> None:
    args = common.parse_training_args(
        __doc__, max_steps=40, calc_timeouts_after=True,
        simulate_help="in the first cycle, freeze or kill one rank once hang detection is on")
    common.setup_logging()
    device = common.init_distributed()  # before the client: calculating timeouts (4.) is a collective
    rank, world_size = dist.get_rank(), dist.get_world_size()
    timeouts_path = args.run_dir / "ft_state.json"

    client = RankMonitorClient()
    client.init_workload_monitoring()                                   # 1.
    saved_state = common.read_timeouts_file(timeouts_path, log)         # None: no file (yet)
    if saved_state is not None:
        try:
            client.load_state_dict(saved_state)                         # 2.
            log.info("loaded heartbeat timeouts from %s: %s", timeouts_path, client.hb_timeouts.to_dict())
        except RankMonitorClientError as err:                           # a bad file costs a warning
            log.warning("ignoring timeouts file %s: %s", timeouts_path, err)

    training = common.ToyTraining(args, device, args.run_dir / "checkpoint.pt")  # restores it if any
    start_step = training.start_step
    log.info("%s", f"resuming from step {start_step}" if start_step else "starting from step 0")

    # Only in the first cycle: a restart must not fail again.
    fault_params = common.simulated_fault_params(args, world_size, armed=common.is_first_cycle())
    fault: Optional[SimulatedFault] = None

    def arm_fault_once_watched() -> Optional[SimulatedFault]:
        # Once hang detection is on. Every rank decides alike (timeouts are the same on all
        # ranks), so all take part in the plan's broadcast.
        if fault is not None or fault_params is None or not client.hb_timeouts.are_valid:
            return fault
        return setup_simulated_fault(fault_params)

    fault = arm_fault_once_watched()
    step = start_step
    for step in training.steps():
        loss = training.train_step(training.next_batch(step))
        client.send_heartbeat()                                         # 3.
        if training.is_checkpoint_step(step):
            training.save_checkpoint(step)
            client.send_heartbeat()                                     # 3. (the save took a while)
            if step - start_step >= args.calc_timeouts_after:
                if client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):   # 4.
                    if rank == 0:                                       # 5.
                        common.write_timeouts_file(timeouts_path, client.state_dict())
                        log.info("step %d: saved heartbeat timeouts %s to %s", step,
                                 client.hb_timeouts.to_dict(), timeouts_path)
                fault = arm_fault_once_watched()
            if rank == 0:
                log.info("step %d: loss %.4f, checkpoint saved", step, loss.item())

    if fault is not None:
        fault.cancel()
    common.create_finished_flag(step, log)
    client.shutdown_workload_monitoring()                               # 6.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
