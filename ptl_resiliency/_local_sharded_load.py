"""Local checkpoints for Lightning strategies that load checkpoints without their ``CheckpointIO``.

``ModelParallelStrategy`` (FSDP2, tensor parallel) and ``FSDPStrategy`` read a checkpoint path
themselves (torch's distributed checkpoint) and never call the checkpoint IO's
``load_checkpoint``, so :class:`~ptl_resiliency.local_checkpoint_callback.HierarchicalCheckpointIO`
would save local checkpoints that no restart reads. :func:`route_local_loads` makes the strategy
ask the checkpoint IO first: the newest complete local checkpoint (each rank's shard, from its own
node or its peer's replica) wins over the global one as in the IO's own load.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any

from ptl_resiliency._lightning import pl

_OWN_LOAD: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""Each routed strategy's own ``load_checkpoint``: ``setup`` runs once per ``fit``/``validate``,
and routing again (e.g. the strategy reused with another checkpoint IO) must not wrap the wrapper."""


def route_local_loads(strategy: Any, io: Any) -> None:
    """Make ``strategy`` load through ``io``'s local checkpoints when they are the newest.

    Strategies that load through their checkpoint IO (DDP, a single device) are left as they are.

    Args:
        strategy: The Trainer's strategy.
        io: Its ``HierarchicalCheckpointIO`` (typed Any: that module imports this one).

    Raises:
        ValueError: ``strategy`` is an ``FSDPStrategy``: its sharded state (FSDP1's flat
            parameters) is not restored from a local checkpoint; ``ModelParallelStrategy`` is.
    """
    from lightning.pytorch import strategies

    if isinstance(strategy, strategies.FSDPStrategy):
        raise ValueError("local checkpoints do not support FSDPStrategy: it loads checkpoints without its "
                         "CheckpointIO, so no restart would read them; use ModelParallelStrategy (FSDP2: "
                         "fully_shard in configure_model) or DDP")
    model_parallel = getattr(strategies, "ModelParallelStrategy", None)  # Lightning 2.4 and later
    if model_parallel is None or not isinstance(strategy, model_parallel):
        return
    # An attribute of this instance, not a subclass: the user built the strategy, and its own
    # load_checkpoint still reads the global checkpoint when that one is newer.
    own_load = _OWN_LOAD.setdefault(strategy, strategy.load_checkpoint)
    strategy.load_checkpoint = partial(_load_model_parallel, strategy, io, own_load)


def _load_model_parallel(strategy: Any, io: Any, load_global: Any, checkpoint_path: Any,
                         weights_only: bool | None = None) -> dict[str, Any]:
    """``ModelParallelStrategy.load_checkpoint``, reading the local checkpoint when it is the newest.

    Like the strategy's own load, the model and optimizer states are set here (its
    ``load_model_state_dict`` and ``load_optimizer_state_dict`` do nothing) and the rest of the
    checkpoint (loops, callbacks, schedulers) is returned for Lightning to restore.
    """
    if not io.local_is_newest(checkpoint_path):
        return load_global(checkpoint_path, weights_only=weights_only)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    checkpoint = io.load_local(weights_only=weights_only)
    module: pl.LightningModule = strategy.lightning_module
    set_model_state_dict(strategy.model, checkpoint.pop("state_dict"),
                         options=StateDictOptions(strict=module.strict_loading))
    saved = checkpoint.get("optimizer_states", [])
    if strategy.optimizers and len(saved) != len(strategy.optimizers):
        raise ValueError(f"the local checkpoint holds {len(saved)} optimizer state(s), the model has "
                         f"{len(strategy.optimizers)} optimizer(s)")
    for optimizer, state in zip(strategy.optimizers, saved, strict=False):  # none outside fit
        set_optimizer_state_dict(strategy.model, optimizer, state)
    return checkpoint
