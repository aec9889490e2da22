"""Replication of each rank's local checkpoint to the other ranks of its clique (ranks on other nodes).

Ranks are grouped into cliques of ``replication_factor`` ranks, ``replication_jump`` ranks apart
(the reference's grouping): with ``J`` ranks per node and ``F = 2``, rank ``n`` and rank ``n + J``
keep each other's checkpoint, so one lost node loses no rank's state. The exchange is one
``all_gather`` of the serialized states (uint8 tensors) over a gloo group of the clique, run by the
manager's background thread: the data is in CPU memory already, and NCCL is never involved.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

EXCHANGE_TIMEOUT = datetime.timedelta(minutes=5)
"""Bound of one exchange with the peers (a peer whose save failed must not hold a rank forever)."""


class ReplicationStrategy:
    """How a rank's local checkpoint reaches other nodes (base class)."""

    def prepare(self) -> None:
        """Create what the exchange needs (process groups): called by every rank on the training
        thread before a save's background part, since creating a group is a collective."""

    def replicate(self, payload: bytes, digest: str) -> list[tuple[int, bytes, str]]:
        """Send ``payload`` (this rank's serialized state) to the peers; return what the peers
        sent: ``(owner rank, payload, sha256)`` for each."""
        raise NotImplementedError


def clique_ranks(world_size: int, replication_jump: int, replication_factor: int) -> list[list[int]]:
    """The cliques: ranks ``n, n + J, ..., n + (F - 1) J`` with ``n = a J F + b``, ``0 <= b < J``.

    Raises:
        ValueError: ``J`` or ``F`` is below 1, or the world size is not a multiple of ``J * F``.
    """
    if replication_jump < 1 or replication_factor < 1:
        raise ValueError(f"replication_jump ({replication_jump}) and replication_factor ({replication_factor}) "
                         "must be at least 1")
    span = replication_jump * replication_factor
    if world_size % span:
        raise ValueError(f"the world size {world_size} is not a multiple of replication_jump x replication_factor "
                         f"= {replication_jump} x {replication_factor}: ranks could not be paired across nodes")
    groups = []
    for start in range(0, world_size, span):
        for offset in range(replication_jump):
            groups.append([start + offset + k * replication_jump for k in range(replication_factor)])
    return groups


class CliqueReplicationStrategy(ReplicationStrategy):
    """Every rank of a clique keeps a replica of every other's local checkpoint.

    Args:
        local_group: The clique's process group (a gloo group: the exchange runs on CPU tensors).
        target_device: Kept for the reference's signature; replicas always arrive in CPU memory.
    """

    def __init__(self, local_group: Any, target_device: str = "cpu") -> None:
        self.local_group = local_group
        self.target_device = target_device

    def replicate(self, payload: bytes, digest: str) -> list[tuple[int, bytes, str]]:
        """All-gather the serialized states of the clique (sizes first, then the padded bytes)."""
        import torch
        import torch.distributed as dist

        group = self.local_group
        ranks = dist.get_process_group_ranks(group)
        size = torch.tensor([len(payload)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in ranks]
        dist.all_gather(sizes, size, group=group)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        gathered = [torch.empty(longest, dtype=torch.uint8) for _ in ranks]
        dist.all_gather(gathered, mine, group=group)
        digests: list[Any] = [None] * len(ranks)
        dist.all_gather_object(digests, digest, group=group)
        me = dist.get_rank()
        received = []
        for rank, data, length, their_digest in zip(ranks, gathered, sizes, digests, strict=True):
            if rank != me:
                received.append((rank, data[: int(length.item())].numpy().tobytes(), their_digest))
        return received

    @classmethod
    def from_replication_params(cls, replication_jump: int | None = None,
                                replication_factor: int = 2) -> CliqueReplicationStrategy:
        """Create every clique's gloo group (a collective: every rank calls it) and return this rank's.

        Args:
            replication_jump: Ranks between a rank and its replica (``J``): the ranks per node
                for a replica on another node. Default: ``LOCAL_WORLD_SIZE``, else the number of
                CUDA devices, else 1.
            replication_factor: Ranks in a clique (``F``): each state is kept ``F`` times.

        Raises:
            ValueError: The world size is not a multiple of ``J * F``.
        """
        import torch.distributed as dist

        jump = default_jump() if replication_jump is None else replication_jump
        groups = clique_ranks(dist.get_world_size(), jump, replication_factor)
        mine = None
        for ranks in groups:  # new_group is collective: every rank creates every group, in order
            group = dist.new_group(ranks, backend="gloo", timeout=EXCHANGE_TIMEOUT)
            if dist.get_rank() in ranks:
                mine = group
        logger.info("local checkpoints: replication cliques %s (jump %s, factor %s)", groups, jump,
                    replication_factor)
        return cls(mine)


def default_jump() -> int:
    """Ranks per node: ``LOCAL_WORLD_SIZE`` (set by torchrun and ft_launcher), else CUDA devices, else 1."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 0:
        return int(local)
    import torch

    return max(1, torch.cuda.device_count())


class LazyCliqueReplicationStrategy(ReplicationStrategy):
    """A :class:`CliqueReplicationStrategy` whose groups are created at the first save (the
    process group does not exist when the trainer's plugins are built).

    Args:
        replication_jump: See :meth:`CliqueReplicationStrategy.from_replication_params`
            (default: the ranks per node).
        replication_factor: See :meth:`CliqueReplicationStrategy.from_replication_params`.
    """

    def __init__(self, replication_jump: int | None = None, replication_factor: int = 2) -> None:
        if replication_jump is not None and replication_jump < 1:
            raise ValueError(f"replication_jump must be at least 1, got {replication_jump}")
        if replication_factor < 1:
            raise ValueError(f"replication_factor must be at least 1, got {replication_factor}")
        self.replication_jump = replication_jump
        self.replication_factor = replication_factor
        self._strategy: CliqueReplicationStrategy | None = None

    @property
    def replication_strategy(self) -> CliqueReplicationStrategy:
        """The eager strategy (created on first use: a collective)."""
        if self._strategy is None:
            self._strategy = CliqueReplicationStrategy.from_replication_params(self.replication_jump,
                                                                               self.replication_factor)
        return self._strategy

    def prepare(self) -> None:
        """Create the cliques' groups (a collective) if not yet done."""
        _ = self.replication_strategy

    def replicate(self, payload: bytes, digest: str) -> list[tuple[int, bytes, str]]:
        """See :meth:`CliqueReplicationStrategy.replicate`."""
        return self.replication_strategy.replicate(payload, digest)


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
