"""Plain PyTorch DDP training with fault tolerance through ``ft_core.integration``.

Run from the repository root, in the virtual environment (``source .venv/bin/activate``)::

    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --fault-tol-cfg-path examples/configs/sections.yaml \\
        --ft-param-min_calculated_section_timeout=1 \\
        examples/train_loop_integration.py --run-dir runs/loop_integration --simulate-fault rank_hung

``--ft-param-min_calculated_section_timeout=1`` lowers the smallest calculated section
timeout the client applies (default: 60 s, safe for real training), so that this demo's
tiny steps give a timeout of about a second and the frozen rank is caught at once; leave it out
in real training.

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

import logging

import _common.ddp as common  # the training around the fault tolerance calls: process group, model, files
import torch.distributed as dist

import ft_core.integration as ft_integration

log = logging.getLogger("train_loop_integration")


def evaluate(training: common.ToyTraining, eval_steps: int) -> float:
    """Mean evaluation loss over all ranks; each batch is wrapped like a training step."""
    losses = []
    with training.evaluating():                                         # eval mode, no gradients
        for index in range(eval_steps):
            batch = training.eval_batch(index)                          # data loading: out of section
            ft_integration.on_eval_step_start()
            losses.append(training.eval_step(batch))
            ft_integration.on_eval_step_end()
    return training.mean_over_ranks(losses)


def main() -> None:
    args = common.parse_training_args(
        __doc__, max_steps=50, evaluation=True,
        run_dir_help="directory for the checkpoints (RUN_DIR/checkpoints) and the timeouts file",
        simulate_help="in the first cycle, freeze or kill one rank after the first timeouts calculation")
    common.setup_logging()
    device = common.init_distributed()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    checkpoint_dir = args.run_dir / "checkpoints"

    # After the process group: setup is a collective (rank 0 reads the timeouts file).
    ft_integration.setup(checkpoint_dir, calculate_timeouts=True)

    training = common.ToyTraining(args, device, checkpoint_dir / "checkpoint.pt")  # restores it if any
    if training.start_step:
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
    log.info("%s", f"resumed from step {training.start_step}" if training.start_step else "starting from step 0")

    # Only in the first cycle, or every restart fails again.
    fault_params = common.simulated_fault_params(args, world_size, armed=common.is_first_cycle())

    step = training.start_step
    for step in training.steps():
        batch = training.next_batch(step)                               # data loading: out of section
        ft_integration.on_training_step_start()
        loss = training.train_step(batch)
        ft_integration.on_training_step_end()

        if step % args.eval_every == 0:
            eval_loss = evaluate(training, args.eval_steps)
            if rank == 0:
                log.info("step %d: evaluation loss %.4f", step, eval_loss)
        if training.is_checkpoint_step(step):
            ft_integration.on_checkpointing_start()
            training.save_checkpoint(step)
            ft_integration.on_checkpointing_end(is_async_finalization=False)  # may update timeouts
            if rank == 0:
                log.info("step %d: loss %.4f, checkpoint saved", step, loss.item())
            client = ft_integration.get_rank_monitor_client()
            if (fault_params is not None and client is not None
                    and "step" in client.section_timeouts.calculated_sections):
                # Armed once the step timeout is calculated (the same on all ranks, so all call it).
                ft_integration.maybe_setup_simulated_fault(fault_params)
                fault_params = None

    common.create_finished_flag(step, log)
    ft_integration.shutdown()  # final timeouts update (a collective), cancels the fault, disconnects
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
