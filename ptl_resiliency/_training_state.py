"""What both callbacks share about a Lightning run: did training complete, the finished flag,
where the timeouts state file lives.

Completion rules (the auto-resume contract, see ``docs/lightning.md``): a ``fit`` run is
complete when it ended normally and ``max_steps`` was reached, or the last epoch allowed by
``max_epochs`` ran to its last batch, the ``max_time``/``Timer`` budget ran out, or an
``EarlyStopping`` callback stopped it; or when it ended with a clean ``SystemExit(0)``. A run
that ended with any other exception, or that stopped for another reason (``trainer.should_stop``
set by user code, even in the last epoch: Lightning counts a cut-short epoch as done), is not
complete and must be resumed. A ``fast_dev_run`` is a smoke test: never complete.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any, Optional

from ft_core.client.state_file import state_file_path
from ft_core.wire.atomic import atomic_write_text
from ptl_resiliency._lightning import EarlyStopping, Timer, pl

DEFAULT_STATE_SUBDIR = "ft_state"
"""The state file's directory under ``trainer.default_root_dir`` when no ``exp_dir`` is given."""


def default_state_dir(root_dir: str, env: Optional[Mapping[str, str]] = None) -> str:
    """The timeouts state file's directory when no ``exp_dir`` is given, keyed to the run.

    Calculated timeouts belong to one run: an unrelated later job started from the same
    directory must not load them. So the directory is, in this order:

    - ``$AUTORESUME_RUN_DIR/ft_state`` under ``autoresume.sh``/``ft_autoresume`` (every attempt
      of that run, and only those, share it);
    - ``<root_dir>/ft_state/slurm-<job>`` in a SLURM job (``<array job>_<task>`` for an array
      task): a requeued job keeps its id, a new submission gets a new one;
    - ``<root_dir>/ft_state`` elsewhere (a local run started the same way finds it again).
    """
    env = os.environ if env is None else env
    if env.get("AUTORESUME_RUN_DIR"):
        return os.path.join(env["AUTORESUME_RUN_DIR"], DEFAULT_STATE_SUBDIR)
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task}" if array_job and task else env.get("SLURM_JOB_ID")
    if job:
        return os.path.join(root_dir, DEFAULT_STATE_SUBDIR, f"slurm-{job}")
    return os.path.join(root_dir, DEFAULT_STATE_SUBDIR)


def state_file_for_trainer(trainer: pl.Trainer, exp_dir: Optional[str],
                           env: Optional[Mapping[str, str]] = None) -> str:
    """Where the timeouts state file lives: in ``exp_dir``, or :func:`default_state_dir` under
    ``trainer.default_root_dir``.

    ``default_root_dir`` (the working directory unless the ``Trainer`` is given one) is the same
    for every run started the same way, so the next run finds the timeouts; ``trainer.log_dir``
    is not (a TensorBoard or CSV logger's ``version_N`` changes with every run, and it is None
    without a logger).
    """
    if exp_dir is None:
        exp_dir = default_state_dir(trainer.default_root_dir, env)
    return state_file_path(exp_dir)


def completion_reason(trainer: pl.Trainer) -> Optional[str]:
    """Say why the ``fit`` run that just ended normally counts as complete, or None if it does not.

    Call it after the fit loop ended (``on_train_end``, ``on_fit_end`` or ``teardown``).

    Returns:
        A short human-readable reason, e.g. ``"max_steps=100 reached"``.
    """
    if trainer.fast_dev_run:
        return None  # a smoke test; its max_steps is Lightning's, not the user's
    fit_loop = trainer.fit_loop
    max_steps = fit_loop.max_steps
    if max_steps is not None and max_steps != -1 and trainer.global_step >= max_steps:
        return f"max_steps={max_steps} reached"
    max_epochs = fit_loop.max_epochs
    epochs_done = fit_loop.epoch_progress.current.processed
    if max_epochs is not None and max_epochs != -1 and epochs_done >= max_epochs and _last_epoch_ran_out(trainer):
        return f"max_epochs={max_epochs} reached"
    for callback in trainer.callbacks:
        if isinstance(callback, Timer):
            remaining = callback.time_remaining()
            if remaining is not None and remaining <= 0:
                return "max_time reached"
        elif isinstance(callback, EarlyStopping) and trainer.should_stop and _early_stopped(callback):
            return "stopped by EarlyStopping"
    return None


def incomplete_reason(trainer: pl.Trainer) -> str:
    """Why a ``fit`` run that ended normally is not complete (for the log line)."""
    if trainer.fast_dev_run:
        return "fast_dev_run is a smoke test; it never marks the job finished"
    fit_loop = trainer.fit_loop
    max_epochs = fit_loop.max_epochs
    batches = fit_loop.epoch_loop.batch_progress.current.ready
    if (max_epochs is not None and max_epochs != -1 and fit_loop.epoch_progress.current.processed >= max_epochs
            and not _last_epoch_ran_out(trainer)):
        return (f"the last epoch allowed by max_epochs={max_epochs} stopped after {batches} of "
                f"{trainer.num_training_batches} batches (trainer.should_stop)")
    return "stopped early (trainer.should_stop) before any limit was reached"


def _last_epoch_ran_out(trainer: pl.Trainer) -> bool:
    """True when the epoch the fit loop ended in ran to its last batch (not cut short).

    Lightning counts an epoch cut short by ``trainer.should_stop`` as processed; its batch
    progress says whether the epoch's data ran out. A run that resumed from a checkpoint taken
    at the end of training restores that progress, so it counts as having run out too.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress
    if progress.is_last_batch:
        return True
    total = trainer.num_training_batches
    return 0 < total != float("inf") and progress.current.ready >= total


def _early_stopped(callback: Any) -> bool:
    reason = getattr(callback, "stopping_reason", None)  # Lightning >= 2.5
    if reason is not None:
        return getattr(reason, "name", str(reason)) != "NOT_STOPPED"
    return callback.wait_count >= callback.patience or callback.stopped_epoch > 0


def create_finished_flag(path: str, reason: str, trainer: pl.Trainer) -> None:
    """Create the finished flag file atomically (with its directory), recording why.

    Raises:
        OSError: The file cannot be written; the message names the path.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    info = {
        "completed": True,
        "reason": reason,
        "global_step": int(trainer.global_step),
        "epoch": int(trainer.current_epoch),
        "time": time.time(),
    }
    atomic_write_text(path, json.dumps(info, sort_keys=True) + "\n")
