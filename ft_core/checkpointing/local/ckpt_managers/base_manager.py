"""What every local checkpoint manager does: save in the background, replicate, find the newest
complete iteration, and load a rank's state from wherever a verified copy of it is.

Collectives: :meth:`BaseCheckpointManager.save` (when it creates the replication groups),
:meth:`~BaseCheckpointManager.find_latest` and :meth:`~BaseCheckpointManager.load` must be called
by every rank at once, as in the reference. The peer exchange of a save runs in the manager's
background thread on the replication cliques' own gloo groups.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ft_core.checkpointing.local.base_state_dict import TensorAwareStateDict
from ft_core.checkpointing.local.files import LocalFile
from ft_core.checkpointing.local.replication.strategies import ReplicationStrategy, sha256

logger = logging.getLogger(__name__)

CkptID = tuple[int, int, str]
"""(iteration, rank, session id), as in the reference."""


class CheckpointingException(Exception):
    """A local checkpoint could not be saved, found or loaded."""


@dataclass
class SaveStats:
    """Timings of the last save (seconds), for logs and the bench."""

    iteration: int = -1
    copy_seconds: float = 0.0
    write_seconds: float = 0.0
    bytes: int = 0
    replicas: int = 0
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)


class BaseCheckpointManager(ABC):
    """Saves and loads per-rank local checkpoints; subclasses say where they are kept.

    Args:
        session_id: Tells apart the checkpoints of different jobs sharing a root directory.
        repl_strategy: How each rank's checkpoint reaches a rank on another node (None: no replica).
    """

    def __init__(self, session_id: str = "", repl_strategy: ReplicationStrategy | None = None) -> None:
        self.session_id = session_id
        self.repl_strategy = repl_strategy
        self.latest_iteration = -1
        self.last_save = SaveStats()
        self._pending: threading.Thread | None = None
        self._plan: dict[int, tuple[int, LocalFile]] = {}
        self._nodes: dict[int, str] = {}
        self.last_load: dict[str, Any] = {}
        """What the last :meth:`load` read: iteration, source (``own``/``replica``), sender rank, bytes, seconds."""

    # Storage (subclasses) --------------------------------------------------------------------

    @abstractmethod
    def _scan(self) -> list[LocalFile]:
        """The complete checkpoint files this node holds (any holder), unverified."""

    @abstractmethod
    def _write(self, iteration: int, owner: int, payload: bytes, digest: str) -> LocalFile:
        """Store one checkpoint (this rank's or a peer's replica)."""

    @abstractmethod
    def _read(self, entry: LocalFile) -> bytes | None:
        """The payload of ``entry`` if its checksum holds, else None."""

    @abstractmethod
    def _cleanup(self, iteration: int) -> None:
        """Remove what this rank holds of iterations older than the previous complete one."""

    @abstractmethod
    def _node_key(self) -> str:
        """Names the storage this rank shares with the other ranks of its node."""

    # Process group ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This rank (0 without a process group)."""
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    @staticmethod
    def _world_size() -> int:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _ckpt_id(self, iteration: int) -> CkptID:
        if iteration < 0:
            raise CheckpointingException(f"invalid iteration {iteration}: it must be 0 or more")
        return (iteration, self.rank, self.session_id)

    # Save ------------------------------------------------------------------------------------

    def save(self, state_dict: TensorAwareStateDict, iteration: int, is_async: bool = False) -> SaveStats:
        """Save this rank's ``state_dict`` as ``iteration``; every rank calls it at once.

        The training thread only waits for the previous save to finish and for the copy of the
        tensors into CPU memory; serializing, writing and replicating run in a background thread
        (``is_async``) or before the call returns.

        Returns:
            The save's record (``done`` is set when it finished; ``error`` says why it failed).

        Raises:
            CheckpointingException: ``iteration`` is negative.
        """
        self._ckpt_id(iteration)
        self.wait_for_pending()
        started = time.monotonic()
        state_dict.copy_tensors_to_cpu(non_blocking=True)
        _synchronize_devices()
        if self.repl_strategy is not None and self._world_size() > 1:
            self.repl_strategy.prepare()
        stats = SaveStats(iteration=iteration, copy_seconds=time.monotonic() - started)
        self.last_save = stats
        self.latest_iteration = -1
        state = state_dict.to_state_dict()
        if is_async:
            self._pending = threading.Thread(target=self._background_save, args=(state, stats),
                                             name=f"local-ckpt-{iteration}", daemon=True)
            self._pending.start()
        else:
            self._background_save(state, stats)
        return stats

    def wait_for_pending(self, timeout: float | None = None) -> bool:
        """Wait for the save in progress, if any; False if it is still running after ``timeout``."""
        pending = self._pending
        if pending is not None:
            pending.join(timeout)
            if pending.is_alive():
                return False
            self._pending = None
        return True

    def _background_save(self, state: Any, stats: SaveStats) -> None:
        import torch

        started = time.monotonic()
        try:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            payload = buffer.getvalue()
            digest = sha256(payload)
            world = self._world_size()
            self._write(stats.iteration, self.rank, payload, digest)
            received = []
            if self.repl_strategy is not None and world > 1:
                received = self.repl_strategy.replicate(payload, digest)
            for owner, data, their_digest in received:
                try:
                    self._write(stats.iteration, owner, data, their_digest)
                except ValueError as exc:
                    logger.warning("local checkpoint: replica of rank %s not kept: %s", owner, exc)
            self._cleanup(stats.iteration)
            stats.bytes, stats.replicas = len(payload), len(received)
            stats.write_seconds = time.monotonic() - started
            logger.info("local checkpoint of iteration %s saved: %s bytes, copy %.3f s, write and %s replica(s) "
                        "%.3f s in the background", stats.iteration, stats.bytes, stats.copy_seconds,
                        stats.replicas, stats.write_seconds)
        except Exception as exc:  # a failed local save must not end training: the previous one stays
            stats.error = f"{type(exc).__name__}: {exc}"
            logger.warning("local checkpoint of iteration %s failed (the previous one is kept): %s",
                           stats.iteration, stats.error)
        finally:
            stats.done.set()

    # Find and load ---------------------------------------------------------------------------

    def find_latest(self) -> int:
        """The newest iteration of which every rank's state has a verified copy somewhere in the
        job (its own node or a peer's replica), or -1; every rank calls it at once.

        A copy whose checksum fails is skipped with a warning (another copy, or an older
        iteration, is used).
        """
        if self.latest_iteration != -1:
            return self.latest_iteration
        self.wait_for_pending()
        rank, world = self.rank, self._world_size()
        node = self._node_key()
        entries = [e for e in self._scan() if e.world_size == world]
        listing = _all_gather((node, rank))
        # One rank per node checks each of that node's files (round-robin over the node's ranks).
        by_node: dict[str, list[int]] = {}
        for their_node, their_rank in listing:
            by_node.setdefault(their_node, []).append(their_rank)
        my_share = sorted(by_node[node])
        to_check = [e for i, e in enumerate(entries) if my_share[i % len(my_share)] == rank]
        good = []
        for entry in to_check:
            if self._read(entry) is None:
                logger.warning("local checkpoint: %s of rank %s (iteration %s) is corrupt or unreadable: skipped",
                               "replica" if entry.is_replica else "file", entry.owner, entry.iteration)
            else:
                good.append(entry)
        verified = _all_gather((node, good))
        holders: dict[tuple[int, int], list[tuple[int, LocalFile]]] = {}
        for their_node, files in verified:
            sender = min(by_node[their_node])
            for entry in files:
                holders.setdefault((entry.iteration, entry.owner), []).append((sender, entry))
        complete = [it for it in {key[0] for key in holders} if all((it, r) in holders for r in range(world))]
        self.latest_iteration = max(complete, default=-1)
        self._nodes = {their_rank: their_node for their_node, their_rank in listing}
        self._plan = {}
        if self.latest_iteration >= 0:
            for owner in range(world):  # the same plan on every rank: a copy on the owner's node first
                copies = sorted(holders[(self.latest_iteration, owner)], key=lambda c: c[0])
                local = [c for c in copies if self._nodes[c[0]] == self._nodes[owner]]
                self._plan[owner] = (local or copies)[0]
        logger.info("local checkpoint: newest complete iteration %s", self.latest_iteration)
        return self.latest_iteration

    def load(self, *, weights_only: bool = True) -> tuple[TensorAwareStateDict, CkptID]:
        """Load this rank's state of :meth:`find_latest`'s iteration; every rank calls it at once.

        A rank whose node holds no verified copy receives one from a node that does, over gloo.

        Args:
            weights_only: ``torch.load``'s: True (torch's default) reads tensors and plain
                containers only; False also unpickles other objects (as Lightning's own load does
                when ``fit(weights_only=False)``).

        Raises:
            CheckpointingException: ``find_latest`` found nothing, or a transfer failed its checksum.
        """
        from ft_core.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict

        if self.latest_iteration < 0:
            raise CheckpointingException("no local checkpoint to load: call find_latest() first (it found none)")
        rank, world = self.rank, self._world_size()
        transfers = []  # (sender, receiver, entry), the same list on every rank
        for owner in range(world):
            sender, entry = self._plan[owner]
            if self._nodes[owner] != self._nodes[sender]:
                transfers.append((sender, owner, entry))
        started = time.monotonic()
        payload = _exchange(transfers, rank, self._read)
        if payload is None:
            payload = self._read(self._plan[rank][1])
            if payload is None:
                raise CheckpointingException(f"local checkpoint of rank {rank} iteration {self.latest_iteration} "
                                             "became unreadable after it was verified")
        elif sha256(payload) != self._plan[rank][1].sha256:
            raise CheckpointingException(f"rank {rank}'s local checkpoint received from rank {self._plan[rank][0]} "
                                         "failed its checksum")
        import torch

        # Our own file or a replica from a rank of this job, checksummed; weights_only as the
        # caller asks (Lightning passes its fit(weights_only=...)), torch's safe loader by default.
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=weights_only)
        received = any(t[1] == rank for t in transfers)
        source = f"rank {self._plan[rank][0]}'s replica" if received else "this node"
        self.last_load = {"iteration": self.latest_iteration, "received": received, "sender": self._plan[rank][0],
                          "bytes": len(payload), "seconds": round(time.monotonic() - started, 4)}
        logger.info("local checkpoint: rank %s loads iteration %s from %s (%s bytes, %.3f s)", rank,
                    self.latest_iteration, source, len(payload), time.monotonic() - started)
        return BasicTensorAwareStateDict(state), self._ckpt_id(self.latest_iteration)


def _synchronize_devices() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the non-blocking copies into pinned memory must have landed


def _all_gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    found: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(found, obj, group=_cpu_group())
    return found


_CPU_GROUP: list[Any] = []


def _cpu_group() -> Any:
    """A gloo group of the whole job (the default group when it is gloo), for CPU transfers."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    if not _CPU_GROUP:
        _CPU_GROUP.append(dist.new_group(backend="gloo"))
    return _CPU_GROUP[0]


def _exchange(transfers: list[tuple[int, int, LocalFile]], rank: int, read: Any) -> bytes | None:
    """Run the transfers this rank takes part in (isend/irecv on the CPU group); return what it received."""
    if not transfers:
        return None
    import torch
    import torch.distributed as dist

    group = _cpu_group()
    works, inbox = [], None
    for sender, receiver, entry in transfers:
        if sender == rank:
            data = read(entry)
            if data is None:  # verified a moment ago: send zeros, the receiver's checksum fails
                data = bytes(entry.bytes)
            tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
            works.append(dist.isend(tensor, dst=receiver, group=group))
        elif receiver == rank:
            inbox = torch.empty(entry.bytes, dtype=torch.uint8)
            works.append(dist.irecv(inbox, src=sender, group=group))
    for work in works:
        work.wait()
    return None if inbox is None else inbox.numpy().tobytes()
