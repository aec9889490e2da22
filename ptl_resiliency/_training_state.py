"""What both callbacks share: did training complete, the finished flag, the timeouts state file,
and decisions that all ranks must take together.

Completion rules (the auto-resume contract, see ``docs/lightning.md``): a ``fit`` run is
complete when it ended normally and ``max_steps`` or ``max_epochs`` was reached, the
``max_time``/``Timer`` budget ran out, or an ``EarlyStopping`` callback stopped it; or when it
ended with a clean ``SystemExit(0)``. A run that ended with any other exception, or that stopped
for another reason, is not complete and must be resumed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Optional

from ft_core.atomic import atomic_write_text
from ptl_resiliency._lightning import EarlyStopping, Timer, pl

STATE_FILE_NAME = "_ft_state.json"
DEFAULT_STATE_SUBDIR = "ft_state"
# A state file is a few hundred bytes; anything much larger is not ours.
MAX_STATE_FILE_BYTES = 1 << 20


def is_clean_exit(exception: BaseException) -> bool:
    """True for ``SystemExit(0)`` / ``SystemExit()`` / ``sys.exit()``: a deliberate, successful end."""
    return isinstance(exception, SystemExit) and exception.code in (0, None)


def completion_reason(trainer: pl.Trainer) -> Optional[str]:
    """Say why the ``fit`` run that just ended normally counts as complete, or None if it does not.

    Call it after the fit loop ended (``on_train_end``, ``on_fit_end`` or ``teardown``).

    Returns:
        A short human-readable reason, e.g. ``"max_steps=100 reached"``.
    """
    fit_loop = trainer.fit_loop
    max_steps = fit_loop.max_steps
    if max_steps is not None and max_steps != -1 and trainer.global_step >= max_steps:
        return f"max_steps={max_steps} reached"
    max_epochs = fit_loop.max_epochs
    epochs_done = fit_loop.epoch_progress.current.processed
    if max_epochs is not None and max_epochs != -1 and epochs_done >= max_epochs:
        return f"max_epochs={max_epochs} reached"
    for callback in trainer.callbacks:
        if isinstance(callback, Timer):
            remaining = callback.time_remaining()
            if remaining is not None and remaining <= 0:
                return "max_time reached"
        elif isinstance(callback, EarlyStopping) and trainer.should_stop and _early_stopped(callback):
            return "stopped by EarlyStopping"
    return None


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


def world_size() -> int:
    """Size of the initialised ``torch.distributed`` default group, or 1 without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def all_ranks_agree(flags: Sequence[bool]) -> list[bool]:
    """Return, for each flag, whether it is true on every rank (one all-reduce MIN).

    A collective when a process group of more than one rank exists: every rank must call it with
    the same number of flags. Without one, the flags are returned unchanged.
    """
    flags = [bool(flag) for flag in flags]
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flags
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return [bool(value) for value in tensor.cpu().tolist()]


class FtStateFile:
    """The file that carries calculated timeouts from one run to the next.

    Rank 0 reads and writes it; what it read is broadcast so that all ranks start from the same
    timeouts even when the file lives on a node-local disk.

    Attributes:
        path: ``<exp_dir>/_ft_state.json``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def for_trainer(cls, trainer: pl.Trainer, exp_dir: Optional[str]) -> FtStateFile:
        """Locate the file: ``exp_dir``, or ``<trainer.log_dir>/ft_state`` by default.

        Reading ``trainer.log_dir`` is a collective in distributed runs (Lightning broadcasts
        it), so every rank must call this.
        """
        if exp_dir is None:
            log_dir = trainer.log_dir or trainer.default_root_dir
            exp_dir = os.path.join(log_dir, DEFAULT_STATE_SUBDIR)
        return cls(os.path.join(os.fspath(exp_dir), STATE_FILE_NAME))

    def read_agreed(self, trainer: pl.Trainer, log: logging.Logger, rank: int) -> Optional[dict[str, Any]]:
        """Return the state saved by an earlier run, or None if there is none or it is unusable.

        A collective in distributed runs: rank 0 reads the file and broadcasts its text. A file
        that cannot be read or parsed is reported with a warning and ignored.
        """
        text: Optional[str] = None
        if trainer.global_rank == 0:
            text = self._read_text(log, rank)
        text = trainer.strategy.broadcast(text, src=0)
        if text is None:
            return None
        try:
            state = json.loads(text)
        except ValueError as err:
            log.warning(
                "[rank %s] ignoring fault tolerance state file %s: not valid JSON (%s); "
                "configured timeouts are used", rank, self.path, err,
            )
            return None
        if not isinstance(state, dict):
            log.warning(
                "[rank %s] ignoring fault tolerance state file %s: expected a JSON object, got %s; "
                "configured timeouts are used", rank, self.path, type(state).__name__,
            )
            return None
        return state

    def _read_text(self, log: logging.Logger, rank: int) -> Optional[str]:
        try:
            with open(self.path, "rb") as stream:
                data = stream.read(MAX_STATE_FILE_BYTES + 1)
        except FileNotFoundError:
            log.info("[rank %s] no fault tolerance state file at %s yet", rank, self.path)
            return None
        except OSError as err:
            log.warning("[rank %s] cannot read fault tolerance state file %s: %s; ignored",
                        rank, self.path, err)
            return None
        if len(data) > MAX_STATE_FILE_BYTES:
            log.warning("[rank %s] ignoring fault tolerance state file %s: larger than %s bytes",
                        rank, self.path, MAX_STATE_FILE_BYTES)
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            log.warning("[rank %s] ignoring fault tolerance state file %s: not UTF-8 text (%s)",
                        rank, self.path, err)
            return None

    def write(self, state: dict[str, Any]) -> None:
        """Write ``state`` atomically, creating the directory if needed (call on rank 0 only).

        Raises:
            OSError: The directory or file cannot be written.
        """
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        atomic_write_text(self.path, json.dumps(state, indent=2, sort_keys=True) + "\n")
