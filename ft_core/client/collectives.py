"""The few collectives fault tolerance needs, behind one small interface.

Decisions that all ranks must take together (is there enough data to calculate timeouts?), the
calculated maxima (every rank ends with the same timeouts) and the state file text (rank 0
reads it, everyone uses it) go through a :class:`Collectives`. The default,
:class:`TorchDistributedCollectives`, uses ``torch.distributed`` when a process group is
initialised and is a no-op otherwise; front ends may provide their own (the Lightning callbacks
use the strategy's).

torch is imported only when the program already imported ``torch.distributed``: a program
without it cannot have a process group.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, Optional, Protocol


class Collectives(Protocol):
    """Collective operations over all ranks of the job. Every rank must call each one."""

    def world_size(self) -> int:
        """Number of ranks taking part (1 without a process group)."""

    def rank(self) -> int:
        """This rank's index (0 without a process group)."""

    def all_true(self, flags: Sequence[bool]) -> list[bool]:
        """For each flag, whether it is true on every rank."""

    def all_max(self, values: Sequence[float]) -> list[float]:
        """For each value, its maximum over all ranks."""

    def broadcast_text(self, text: Optional[str]) -> Optional[str]:
        """Rank 0's ``text`` (or None) on every rank."""


def _initialised_dist() -> Any:
    """``torch.distributed`` when a process group is initialised, else None."""
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


class TorchDistributedCollectives:
    """:class:`Collectives` over the default ``torch.distributed`` process group.

    Without an initialised group (or with a group of one) every operation returns its input.
    Tensors live on the CPU, or on the current CUDA device with the NCCL backend.
    """

    def world_size(self) -> int:
        dist = _initialised_dist()
        return 1 if dist is None else dist.get_world_size()

    def rank(self) -> int:
        dist = _initialised_dist()
        return 0 if dist is None else dist.get_rank()

    def all_true(self, flags: Sequence[bool]) -> list[bool]:
        values = [bool(flag) for flag in flags]
        dist = self._group()
        if dist is None:
            return values
        import torch

        tensor = torch.tensor([int(v) for v in values], dtype=torch.int32, device=_device(dist))
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return [bool(v) for v in tensor.cpu().tolist()]

    def all_max(self, values: Sequence[float]) -> list[float]:
        numbers = [float(v) for v in values]
        dist = self._group()
        if dist is None:
            return numbers
        import torch

        tensor = torch.tensor(numbers, dtype=torch.float64, device=_device(dist))
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [float(v) for v in tensor.cpu().tolist()]

    def broadcast_text(self, text: Optional[str]) -> Optional[str]:
        dist = self._group()
        if dist is None:
            return text
        import torch

        device = _device(dist)
        data = b"" if text is None else text.encode("utf-8")
        length = torch.tensor([len(data) if text is not None else -1], dtype=torch.int64, device=device)
        dist.broadcast(length, src=0)
        size = int(length.item())
        if size < 0:
            return None
        buffer = torch.zeros(size, dtype=torch.uint8, device=device)
        if dist.get_rank() == 0 and size:
            buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        if size:
            dist.broadcast(buffer, src=0)
        return bytes(buffer.cpu().tolist()).decode("utf-8")

    @staticmethod
    def _group() -> Any:
        dist = _initialised_dist()
        if dist is None or dist.get_world_size() == 1:
            return None
        return dist


def _device(dist: Any) -> Any:
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_collectives() -> Collectives:
    """The ``torch.distributed`` collectives (no-ops without a process group)."""
    return TorchDistributedCollectives()


def rank_and_world_size(collectives: Collectives) -> tuple[int, int, bool]:
    """This process's ``(rank, world_size, grouped)``.

    From ``collectives`` when the job has a process group of several ranks (``grouped``);
    otherwise from the launcher's ``RANK`` and ``WORLD_SIZE`` (0 and 1 when unset): the processes
    of a job without a process group cannot agree on anything, and each decides alone.
    """
    world_size = collectives.world_size()
    if world_size > 1:
        return collectives.rank(), world_size, True
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), False


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else default
