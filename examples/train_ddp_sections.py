"""Plain PyTorch DDP training whose hangs are detected with sections (``RankMonitorClient``).

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --fault-tol-cfg-path examples/configs/sections.yaml \\
        --ft-param-min_calculated_section_timeout=1 \\
        examples/train_ddp_sections.py --run-dir runs/ddp_sections --simulate-fault rank_hung

``--ft-param-min_calculated_section_timeout=1`` lowers the smallest calculated section
timeout the client applies (default: 60 s, safe for real training), so that this demo's
tiny steps give a timeout of about a second and the frozen rank is caught at once; leave it out
in real training.

What happens: both ranks train with the section timeouts of the config (``setup``, ``step``,
``checkpointing``, and the out-of-section time). At the first checkpoint after
``--calc-timeouts-after`` steps they calculate ``step`` and ``checkpointing`` timeouts from the
durations they saw, and rank 0 saves them to ``RUN_DIR/ft_state.json``. The simulated fault is
armed then: a second later the last rank freezes (``SIGSTOP``); the other rank waits for it inside
its step, past the calculated ``step`` timeout, and the monitors stop both. ``ft_launcher``
restarts them; they load the saved timeouts and the last checkpoint, finish training, and this
time (a run that loaded a checkpoint) also calculate the ``setup`` and out-of-section timeouts.
Leave out ``--simulate-fault`` for a run without a fault.

The client calls, in the documented order (the "Sections API integration" guide):

1. ``init_workload_monitoring()``, after the process group is up;
2. ``load_state_dict()`` with the timeouts an earlier run saved, if there are any;
3. ``start_section(name)`` / ``end_section(name)`` around start-up, each step and each save;
4. ``calculate_and_set_section_timeouts()`` at checkpoints once enough durations were seen
   (every rank calls it at the same point, and all get the same timeouts);
5. rank 0 saves ``state_dict()`` to the state file, atomically;
6. ``shutdown_workload_monitoring()`` at the end.

``ft_core.integration`` (see ``train_loop_integration.py``) packs these calls, with warm-up steps
and the rules for when each timeout can be calculated. When ``FAULT_TOL_FINISHED_FLAG_FILE`` is set
(``scripts/autoresume.sh`` sets it), rank 0 creates that file once training is complete. On CPU
the ranks use gloo; with GPUs, nccl (one rank per GPU).
"""

from __future__ import annotations

import logging
from typing import Optional

import _common.ddp as common  # the training around the fault tolerance calls: process group, model, files
import torch.distributed as dist

from ft_core import RankMonitorClient, RankMonitorClientError
from ft_core.simulated_fault import SimulatedFault, setup_simulated_fault

log = logging.getLogger("train_ddp_sections")


def main() -> None:
    args = common.parse_training_args(
        __doc__, max_steps=40, calc_timeouts_after=True,
        simulate_help="in the first cycle, freeze or kill one rank after the first timeouts calculation")
    common.setup_logging()
    device = common.init_distributed()  # before the client: calculating timeouts (4.) is a collective
    rank, world_size = dist.get_rank(), dist.get_world_size()
    timeouts_path = args.run_dir / "ft_state.json"
    # Only in the first cycle: a restart must not fail again.
    fault_params = common.simulated_fault_params(args, world_size, armed=common.is_first_cycle())

    client = RankMonitorClient()
    client.init_workload_monitoring()                                   # 1.
    saved_state = common.read_timeouts_file(timeouts_path, log)         # None: no file (yet)
    if saved_state is not None:
        try:
            client.load_state_dict(saved_state)                         # 2.
            log.info("loaded section timeouts from %s: %s", timeouts_path, client.section_timeouts.to_dict())
        except RankMonitorClientError as err:                           # a bad file costs a warning
            log.warning("ignoring timeouts file %s: %s", timeouts_path, err)

    client.start_section("setup")                                       # 3.
    training = common.ToyTraining(args, device, args.run_dir / "checkpoint.pt")  # restores it if any
    start_step = training.start_step
    resumed = start_step > 0
    log.info("%s", f"resuming from step {start_step}" if resumed else "starting from step 0")
    client.end_section("setup")

    fault: Optional[SimulatedFault] = None
    step = start_step
    for step in training.steps():
        batch = training.next_batch(step)                               # data loading: out of section
        client.start_section("step")
        loss = training.train_step(batch)
        client.end_section("step")
        if training.is_checkpoint_step(step):
            client.start_section("checkpointing")
            training.save_checkpoint(step)
            client.end_section("checkpointing")
            if step - start_step >= args.calc_timeouts_after:
                # setup and the out-of-section time are representative only in a run that loaded a
                # checkpoint (and so restarted): in a first run they miss the checkpoint loading.
                selected = ["step", "checkpointing"] + (["setup"] if resumed else [])
                if client.calculate_and_set_section_timeouts(                        # 4.
                        selected_sections=selected, calc_out_of_section=resumed, skip_if_not_ready=True):
                    if rank == 0:                                       # 5.
                        common.write_timeouts_file(timeouts_path, client.state_dict())
                        log.info("step %d: saved section timeouts %s to %s", step,
                                 client.section_timeouts.to_dict(), timeouts_path)
                    if fault is None and fault_params is not None:
                        # All ranks get here together, so all take part in the plan's broadcast.
                        fault = setup_simulated_fault(fault_params)
            if rank == 0:
                log.info("step %d: loss %.4f, checkpoint saved", step, loss.item())

    if fault is not None:
        fault.cancel()
    common.create_finished_flag(step, log)
    client.shutdown_workload_monitoring()                               # 6.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
