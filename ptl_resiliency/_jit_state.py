"""Just-in-time state for the Lightning callbacks: what a surviving rank saves when a peer fails.

:class:`LightningProvider` is the :class:`~ft_core.client.jit_state.StateProvider` of a ``fit``
run: its state is the checkpoint dict Lightning itself would write (``dump_checkpoint``: model,
optimizers, LR schedulers, loops, callbacks, precision plugin, hyper-parameters), copied to CPU.
A payload is therefore a Lightning checkpoint file that ``Trainer.fit(ckpt_path=...)`` can load
(:mod:`ptl_resiliency._jit_restore` does that on a restart).

When a state is consistent (``docs/jit-state.md``):

* *completed step* is ``trainer.global_step`` (Lightning increments it after the optimizer
  update, before ``on_train_batch_end``);
* *in update* is set when the optimizer's closure (forward, backward, the gradient all-reduce,
  ``on_before_optimizer_step``, clipping) has returned, that is when the parameter update
  starts, and cleared at the callback's ``on_train_batch_end``, after Lightning counted the step
  and stepped the per-step LR schedulers. So a copy is never taken between the update and its
  bookkeeping. It is set through a step pre-hook on each optimizer (torch's public hooks: no
  Lightning hook dispatch per step) that wraps the closure Lightning passes to ``step``;
* while gradients are accumulated (a training batch ended without an optimizer step) the state
  counts as in update too: the accumulated gradients are not part of a checkpoint, so a copy
  would skip the batches of the unfinished window.

The main thread blocked in DDP's gradient all-reduce (a hung peer) is inside the closure, so the
state thread copies a consistent state of the last completed step; a crashed peer makes that
all-reduce raise, and the callbacks' ``on_exception`` saves the same state.

Sharded strategies (FSDP, DeepSpeed, ModelParallel, XLA) and sharded optimizers
(``ZeroRedundancyOptimizer``) hold no full replica: :func:`sharding_reason` names why and the
provider refuses (one log line from :class:`~ft_core.client.jit_state.JitState`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import torch

from ptl_resiliency._lightning import pl

KIND = "lightning"
ADAM_LIKE_STATE_FACTOR = 2
"""Optimizer state bytes per parameter byte assumed before the first step (Adam's two moments)."""


def sharding_reason(strategy: Any, optimizers: Iterable[Any] = ()) -> Optional[str]:
    """Why ``strategy`` (and ``optimizers``) do not hold a full replica on every rank, or None.

    Args:
        strategy: The Trainer's strategy.
        optimizers: The Trainer's optimizers (known after the strategy's setup).
    """
    from lightning.pytorch import strategies

    name = type(strategy).__name__
    sharded = (("FSDPStrategy", "shards parameters, gradients and optimizer state across ranks"),
               ("DeepSpeedStrategy", "shards optimizer state (and with ZeRO-3 parameters) across ranks"),
               ("ModelParallelStrategy", "splits the model across ranks (tensor parallel, FSDP2)"),
               ("XLAStrategy", "is an XLA strategy (not supported)"),
               ("SingleDeviceXLAStrategy", "is an XLA strategy (not supported)"))
    for class_name, why in sharded:
        cls = getattr(strategies, class_name, None)  # ModelParallelStrategy is new in Lightning 2.4
        if cls is not None and isinstance(strategy, cls):
            return f"the {name} strategy {why}"
    if not isinstance(strategy, (strategies.DDPStrategy, strategies.SingleDeviceStrategy)):
        return f"the {name} strategy is not a data-parallel one (DDP or a single device)"
    for optimizer in optimizers:
        if callable(getattr(optimizer, "consolidate_state_dict", None)):
            return f"the optimizer {type(optimizer).__name__} shards its state across ranks"
    module = getattr(strategy, "lightning_module", None)
    if module is not None:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # a torch built without distributed support: nothing is sharded
            return None
        if any(isinstance(p, DTensor) for p in module.parameters()):
            return "the model's parameters are DTensors (sharded across ranks)"
    return None


def cpu_copy(value: Any) -> Any:
    """``value`` with every tensor replaced by a detached CPU copy (dicts, lists, tuples walked).

    Other objects are kept as they are: torch.save writes them, and the main thread that could
    change them is blocked (or failing) while a copy is taken.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        return tensor.clone() if tensor.device.type == "cpu" else tensor.to("cpu")
    if isinstance(value, Mapping):
        copied = {key: cpu_copy(item) for key, item in value.items()}
        if type(value) is not dict:
            try:
                return type(value)(copied)  # e.g. OrderedDict, AttributeDict
            except TypeError:
                pass
        return copied
    if isinstance(value, list):
        return [cpu_copy(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(cpu_copy(item) for item in value)
    return value


def _tensor_bytes(values: Iterable[Any]) -> int:
    total = 0
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total


class LightningProvider:
    """The training state of one ``fit`` run, for :class:`~ft_core.client.jit_state.JitState`.

    Made at ``on_train_start`` (the strategy and optimizers are set up, a checkpoint restored);
    :meth:`close` removes the optimizer hooks.

    Args:
        trainer: The fitting Trainer.
    """

    kind = KIND

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer
        self._updating = False  # the parameter update began and the step is not counted yet
        self._stepped = False  # an optimizer step began in this batch
        self._accumulating = False  # a batch ended without an optimizer step (gradients accumulate)
        self._handles = [opt.register_step_pre_hook(self._step_starts) for opt in trainer.optimizers]
        self._refusal = sharding_reason(trainer.strategy, trainer.optimizers)
        # Resumable data loaders: where they stood at the last batch end (see capture()).
        self._stateful_loaders = bool(self._loader_states())
        self._loader_snapshot: Optional[tuple[tuple[int, int], list[Any]]] = None

    def close(self) -> None:
        """Remove the hooks from the optimizers."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    # ------------------------------------------------------------------ the callbacks' events

    def _step_starts(self, optimizer: Any, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        """Optimizer step pre-hook: the update starts once the closure returned (or now, without one)."""
        self._stepped = True
        # args[0] is the optimizer itself; the closure is passed by keyword (Lightning) or after it.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self._updating = True
            return None

        def closure_then_update() -> Any:
            result = closure()
            self._updating = True
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_update}
        return (args[0], closure_then_update, *args[2:]), kwargs

    def batch_ended(self) -> None:
        """``on_train_batch_end``: the step (if any) is counted; gradients accumulate if there was none."""
        self._accumulating = not self._stepped
        self._stepped = False
        self._updating = False
        if self._stateful_loaders:
            self._loader_snapshot = (self._position(), copy.deepcopy(self._loader_states()))

    def _loader_states(self) -> list[Any]:
        """The state dicts of the resumable training data loaders (Lightning's own selection)."""
        combined = self._trainer.fit_loop._combined_loader
        return combined._state_dicts() if combined is not None else []

    def _position(self) -> tuple[int, int]:
        """(epoch, batches processed in it)."""
        return int(self._trainer.current_epoch), int(self._trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    # ------------------------------------------------------------------ StateProvider

    def completed_step(self) -> int:
        """Optimizer steps completed (``trainer.global_step``)."""
        return int(self._trainer.global_step)

    def in_update(self) -> bool:
        """True from the start of the parameter update to the end of its batch, and while
        gradients of an unfinished accumulation window are pending."""
        return self._updating or self._accumulating

    def replicated(self) -> tuple[bool, str]:
        """``(False, why)`` for a sharded strategy or optimizer."""
        return (self._refusal is None, self._refusal or "")

    def capture(self) -> dict[str, Any]:
        """The checkpoint dict Lightning would save now, with every tensor copied to CPU.

        ``dump_checkpoint`` runs no collective for a replicated strategy (``sharding_reason``
        refuses the ones that would: ZeRO's consolidation, FSDP's state gathering), so it may run
        in the state thread while the main thread is blocked in a collective.
        """
        checkpoint = self._trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if self._stateful_loaders:
            self._rewind_loaders(checkpoint)
        return cpu_copy(checkpoint)

    def _rewind_loaders(self, checkpoint: dict[str, Any]) -> None:
        """Give resumable data loaders the position of the last batch end when a batch is in flight.

        A batch in flight (fetched, its update not done: the main thread blocked in its backward
        or failed in it) is redone on resume, since the loops count it as not processed; but a
        resumable loader's own state already counts it as yielded, so without this the resumed
        run would skip it. Lightning's own checkpoints are taken at batch ends, where the two
        agree. The first batch of an epoch rewinds to a fresh pass over the data.

        Raises:
            RuntimeError: No position of the last batch end is known (e.g. the loaders were
                reloaded since): the copy is declined rather than skip data.
        """
        progress = self._trainer.fit_loop.epoch_loop.batch_progress.current
        if progress.ready <= progress.processed:
            return  # no batch in flight: the loaders' state is that of the last batch end
        position = self._position()
        loop_state = checkpoint["loops"]["fit_loop"]["state_dict"]
        if position[1] == 0:
            loop_state.pop("combined_loader", None)  # the epoch's first batch: a fresh pass
            return
        snapshot = self._loader_snapshot
        if snapshot is None or snapshot[0] != position:
            raise RuntimeError(f"no data loader position is known for the batch in flight (epoch {position[0]}, "
                               f"batch {position[1]}); not saving a state that would skip it")
        loop_state["combined_loader"] = copy.deepcopy(snapshot[1])

    def approx_bytes(self) -> int:
        """Bytes of the model's state and the optimizers' state (estimated before the first step)."""
        module = self._trainer.lightning_module
        model = _tensor_bytes(module.state_dict().values()) if module is not None else 0
        optim = sum(_tensor_bytes(opt.state.values()) for opt in self._trainer.optimizers)
        if optim == 0 and module is not None:
            optim = ADAM_LIKE_STATE_FACTOR * _tensor_bytes(p for p in module.parameters() if p.requires_grad)
        return model + optim


def checkpoint_dir_of(trainer: pl.Trainer) -> Optional[str]:
    """The local directory of the Trainer's ``ModelCheckpoint``, where a copy of a saved state
    also goes (for a requeued job), or None (no ModelCheckpoint, or a remote path)."""
    callback = trainer.checkpoint_callback
    dirpath: Optional[Any] = getattr(callback, "dirpath", None) if callback is not None else None
    if not dirpath or "://" in str(dirpath):
        return None
    return os.fspath(dirpath)

