"""Local checkpoints for Lightning: :class:`LocalCheckpointCallback` and :class:`HierarchicalCheckpointIO`.

The callback saves a local checkpoint every ``every_n_train_steps`` steps (or every
``train_time_interval``) on every rank; the checkpoint IO routes it to a local checkpoint manager
(:class:`~ft_core.checkpointing.local.ckpt_managers.local_manager.LocalCheckpointManager`: node-local
files, each rank's replicated to a peer on another node) and every other save, e.g. a
``ModelCheckpoint``'s, to the wrapped ``CheckpointIO``. Loading takes the newest complete state
among the local copies, the peers' replicas and the global checkpoint. See docs/local-checkpoints.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from ft_core.checkpointing.local.base_state_dict import TensorAwareStateDict
from ft_core.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
from ft_core.checkpointing.local.ckpt_managers.base_manager import BaseCheckpointManager
from ptl_resiliency._local_sharded_load import route_local_loads

logger = logging.getLogger(__name__)

LOCAL_CKPT_OPTS_KEY = "local_checkpoint_options"
"""The ``storage_options`` key that marks a save as local (the reference's)."""


class LocalCheckpointCallback(ModelCheckpoint):
    """Starts a local checkpoint every ``every_n_train_steps`` training steps or ``train_time_interval``.

    Use it with :class:`HierarchicalCheckpointIO` among the trainer's plugins: the callback only
    asks for the save (on every rank: each rank saves its own state), the checkpoint IO does it.
    Epoch-end and validation-end saves are left to a regular ``ModelCheckpoint``.

    Args:
        every_n_train_steps: Steps between local checkpoints (as ``ModelCheckpoint``'s).
        train_time_interval: Time between local checkpoints (as ``ModelCheckpoint``'s).
        async_save: Serialize, write and replicate in the background; the step then waits only
            for the copy of the state into memory (and for the previous save, if still running).
    """

    def __init__(self, every_n_train_steps: int | None = None, train_time_interval: timedelta | None = None,
                 async_save: bool = False) -> None:
        if every_n_train_steps is None and train_time_interval is None:
            raise ValueError("LocalCheckpointCallback needs every_n_train_steps or train_time_interval")
        if every_n_train_steps is not None and (not isinstance(every_n_train_steps, int) or every_n_train_steps < 1):
            raise ValueError(f"every_n_train_steps must be a positive integer, got {every_n_train_steps!r}")
        super().__init__(every_n_train_steps=every_n_train_steps, train_time_interval=train_time_interval)
        self.async_save = async_save

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Route the loads of a strategy that loads without its checkpoint IO (ModelParallelStrategy)
        through the local checkpoints (see ``ptl_resiliency._local_sharded_load``).

        Raises:
            ValueError: The strategy is an ``FSDPStrategy`` (its local checkpoints would never load).
        """
        super().setup(trainer, pl_module, stage)
        io = _hierarchical_io(trainer)
        if io is not None:
            route_local_loads(trainer.strategy, io)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """No local checkpoint at an epoch's end (a global one belongs there)."""

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """No local checkpoint after validation."""

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """No local checkpoint on an exception (its peer exchange needs every rank)."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Wait for a background save still running (the process may exit next)."""
        io = _hierarchical_io(trainer)
        if io is not None:
            io.local_ckpt_manager.wait_for_pending()

    def _save_topk_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        """Local checkpoints are not ranked."""

    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        """Save a local checkpoint of this rank.

        Lightning's strategies write only on global rank 0 for a replicated model; a local
        checkpoint is saved by every rank, so the checkpoint goes straight to the checkpoint IO.
        """
        io = _hierarchical_io(trainer)
        if io is None:
            raise RuntimeError("LocalCheckpointCallback needs a HierarchicalCheckpointIO among the Trainer's plugins")
        options = {"ckpt_type": "local", "iteration": trainer.global_step, "is_async": self.async_save}
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        io.save_checkpoint(checkpoint, None, storage_options={LOCAL_CKPT_OPTS_KEY: options})
        self._last_global_step_saved = trainer.global_step


def _hierarchical_io(trainer: pl.Trainer) -> HierarchicalCheckpointIO | None:
    io = trainer.strategy.checkpoint_io
    while io is not None:
        if isinstance(io, HierarchicalCheckpointIO):
            return io
        io = getattr(io, "checkpoint_io", None) if isinstance(io, _WrappingCheckpointIO) else None
    return None


class HierarchicalCheckpointIO(_WrappingCheckpointIO):
    """Routes local saves to a local checkpoint manager and others to the wrapped ``CheckpointIO``.

    Args:
        wrapped_checkpoint_io: The global checkpoint IO (e.g. ``TorchCheckpointIO()``).
        local_ckpt_manager: The local checkpoint manager, e.g. ``LocalCheckpointManager(root,
            repl_strategy=LazyCliqueReplicationStrategy())``.
        get_global_ckpt_iteration_fn: Given the path of a global checkpoint, its iteration
            (global step); return -1 for a path that does not exist.
    """

    def __init__(self, wrapped_checkpoint_io: CheckpointIO, local_ckpt_manager: BaseCheckpointManager,
                 get_global_ckpt_iteration_fn: Callable[[Any], int]) -> None:
        super().__init__(wrapped_checkpoint_io)
        self.local_ckpt_manager = local_ckpt_manager
        self.get_global_ckpt_iteration_fn = get_global_ckpt_iteration_fn

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """A local save when ``storage_options`` carries local options, else the wrapped IO's save."""
        if not isinstance(storage_options, dict) or LOCAL_CKPT_OPTS_KEY not in storage_options:
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options)
            return
        if path is not None:
            raise ValueError(f"a local checkpoint is not saved to a path; got {path}")
        options = storage_options[LOCAL_CKPT_OPTS_KEY]
        self.local_ckpt_manager.save(self.to_tensor_aware_state_dict(checkpoint), options["iteration"],
                                     is_async=bool(options.get("is_async", False)))

    def load_checkpoint(self, path: Any, map_location: Any | None = None, **kwargs: Any) -> dict[str, Any]:
        """The newer of the newest complete local checkpoint (own, or peers' replicas) and the global
        one at ``path`` (a local one wins a tie: it is on this node). Every rank calls it at once."""
        if not self.local_is_newest(path):
            return self.checkpoint_io.load_checkpoint(path, map_location=map_location, **kwargs)
        return self.load_local(**kwargs)

    def local_is_newest(self, path: Any) -> bool:
        """Whether the newest complete local checkpoint is at least as new as the global one at
        ``path`` (a tie: the local one, it is on this node). Every rank calls it at once."""
        local_iteration = self.local_ckpt_manager.find_latest()
        if local_iteration < 0:
            logger.info("no complete local checkpoint: loading the global checkpoint %s", path)
            return False
        global_iteration = self.get_global_ckpt_iteration_fn(path)
        if global_iteration > local_iteration:
            logger.info("global checkpoint %s (iteration %s) is newer than the local one (%s): loading it", path,
                        global_iteration, local_iteration)
            return False
        logger.info("resuming from the local checkpoint of iteration %s (global: %s)", local_iteration,
                    global_iteration)
        return True

    def load_local(self, **kwargs: Any) -> Any:
        """This rank's state of the newest complete local checkpoint (after :meth:`local_is_newest`).

        Args:
            kwargs: ``weights_only`` as Lightning passes it (None: torch's safe loader).
        """
        weights_only = kwargs.get("weights_only")
        state, _ = self.local_ckpt_manager.load(weights_only=True if weights_only is None else bool(weights_only))
        return self.from_tensor_aware_state_dict(state, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        """Remove a global checkpoint (the manager prunes local ones itself)."""
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        """Wait for a background save, then tear down the wrapped IO."""
        self.local_ckpt_manager.wait_for_pending()
        if self.checkpoint_io is not None:
            self.checkpoint_io.teardown()

    @classmethod
    def get_partial_wrapper_constructor(cls, local_ckpt_manager: BaseCheckpointManager,
                                        get_global_ckpt_iteration_fn: Callable[[Any], int]) -> Callable[..., Any]:
        """The constructor with every argument but the wrapped checkpoint IO bound."""
        return partial(cls, local_ckpt_manager=local_ckpt_manager,
                       get_global_ckpt_iteration_fn=get_global_ckpt_iteration_fn)

    def to_tensor_aware_state_dict(self, checkpoint: dict[str, Any]) -> TensorAwareStateDict:
        """Wrap Lightning's checkpoint dict for the manager (override for another state layout)."""
        return BasicTensorAwareStateDict(checkpoint)

    def from_tensor_aware_state_dict(self, tensor_aware_checkpoint: TensorAwareStateDict, **kwargs: Any) -> Any:
        """The checkpoint dict of a loaded local checkpoint."""
        return tensor_aware_checkpoint.to_state_dict()
