"""Local checkpoints in a node-local directory (an SSD, a RAM disk)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ft_core.checkpointing.local import files
from ft_core.checkpointing.local.ckpt_managers.base_manager import BaseCheckpointManager
from ft_core.checkpointing.local.files import LocalFile
from ft_core.checkpointing.local.replication.strategies import ReplicationStrategy

KEEP = 2
"""Iterations each rank keeps: the newest and the one before it, so a save interrupted on some
ranks (a job-wide SIGTERM, a lost node) still leaves a complete older one everywhere."""


class LocalCheckpointManager(BaseCheckpointManager):
    """Keeps each rank's checkpoints, and its peers' replicas, under
    ``<root_local_ckpt_dir>/<session_id>/<rank>/`` (files: :mod:`ft_core.checkpointing.local.files`).

    Args:
        root_local_ckpt_dir: A directory on node-local storage (each node has its own).
        session_id: A sub-directory telling apart jobs sharing the root (e.g. the job's name).
        repl_strategy: How each rank's checkpoint reaches another node, e.g.
            ``LazyCliqueReplicationStrategy()``; None keeps no replica (a lost node loses its
            ranks' local checkpoints).
    """

    def __init__(self, root_local_ckpt_dir: str | Path, session_id: str = "",
                 repl_strategy: ReplicationStrategy | None = None) -> None:
        super().__init__(session_id, repl_strategy)
        if not str(root_local_ckpt_dir):
            raise ValueError("root_local_ckpt_dir must name a directory")
        self.root_local_ckpt_dir = root_local_ckpt_dir

    @property
    def session_dir(self) -> str:
        """``<root>/<session_id>``: every holder directory of this node is under it."""
        return os.path.join(os.fspath(self.root_local_ckpt_dir), self.session_id)

    @property
    def local_ckpt_dir(self) -> Path:
        """This rank's directory."""
        return Path(self.session_dir) / str(self.rank)

    def _scan(self) -> list[LocalFile]:
        return files.scan(self.session_dir)

    def _write(self, iteration: int, owner: int, payload: bytes, digest: str) -> LocalFile:
        return files.write(os.fspath(self.local_ckpt_dir), iteration, owner, self.rank, self._world_size(),
                           payload, digest)

    def _read(self, entry: LocalFile) -> bytes | None:
        return files.read_verified(entry)

    def _cleanup(self, iteration: int) -> None:
        files.prune(os.fspath(self.local_ckpt_dir), keep=KEEP)

    def _node_key(self) -> str:
        return f"{socket.gethostname()}:{os.path.realpath(self.session_dir)}"
