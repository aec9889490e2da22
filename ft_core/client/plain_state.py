"""Just-in-time state of a hand-written training loop: a model, an optimizer, and extras.

:func:`track_state` registers the loop's model and optimizer with :mod:`ft_core.client.jit_state`;
:func:`load_jit_state` restores them in a restarted worker when the launcher agreed on a
just-in-time state (``FT_JIT_RESUME``). What "completed step" and "in update" mean here: the
optimizer's own step hooks count the updates (``register_step_pre_hook`` sets a flag,
``register_step_post_hook`` clears it and adds one), so nothing is added to the loop's steps. A
closure passed to ``optimizer.step(closure)`` runs inside that window: for such loops the blocked
path (a peer hangs) declines, the exception path (a peer crashes) still saves.

torch is imported inside the functions only (the ``ft_core`` rule).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Optional

from ft_core.client import jit_state, requeue_state
from ft_core.client.collectives import TorchDistributedCollectives, rank_and_world_size
from ft_core.wire import saved_state
from ft_core.wire.env import FT_JIT_RESUME_ENV_VAR

logger = logging.getLogger(__name__)

PAYLOAD_FORMAT = "ft_jit_plain/1"
Extra = Callable[[], Mapping[str, Any]]


class PlainStateProvider:
    """A :class:`~ft_core.client.jit_state.StateProvider` for a model and its optimizer.

    Args:
        model: The module trained (a DDP wrapper is fine: its state dict is saved and loaded as is).
        optimizer: Its optimizer (``torch.optim.Optimizer``).
        extra: Returns a dict of plain values saved with the state (the lr scheduler's
            ``state_dict()``, the data position...); called while the training thread is blocked.
    """

    kind = "plain"

    def __init__(self, model: Any, optimizer: Any, extra: Optional[Extra] = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.extra = extra
        self.step = 0
        self.updating = False
        self._hooks = [optimizer.register_step_pre_hook(self._before_update),
                       optimizer.register_step_post_hook(self._after_update)]

    # The two hooks run on every optimizer step: a flag and an int, nothing more.
    def _before_update(self, *_args: Any) -> None:
        self.updating = True

    def _after_update(self, *_args: Any) -> None:
        self.step += 1
        self.updating = False

    def remove(self) -> None:
        """Remove the optimizer hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def completed_step(self) -> int:
        return self.step

    def in_update(self) -> bool:
        return self.updating

    def replicated(self) -> tuple[bool, str]:
        name = type(self.model).__name__
        if name == "FullyShardedDataParallel" or any(type(p).__name__ == "DTensor" for p in self.model.parameters()):
            return False, f"the model ({name}) is sharded: no rank holds the full state"
        return True, ""

    def capture(self) -> Any:
        # Parameters and optimizer state change only inside the update, which JitState rules out
        # before and after it writes the payload: CPU ones are saved in place, not cloned (a
        # 200 MB clone costs more than a tenth of the save). Buffers (BatchNorm statistics)
        # change in the forward pass: cloned.
        buffers = {name for name, _ in self.model.named_buffers()}
        model = {name: _cpu_copy(value, clone=name in buffers) for name, value in self.model.state_dict().items()}
        return {"format": PAYLOAD_FORMAT, "step": self.step, "model": model,
                "optimizer": _cpu_copy(self.optimizer.state_dict(), clone=False),
                "extra": _cpu_copy(dict(self.extra())) if self.extra is not None else None}

    def approx_bytes(self) -> int:
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        state = sum(v.numel() * v.element_size() for s in self.optimizer.state.values() for v in s.values()
                    if hasattr(v, "numel"))
        return params + (state or 2 * params)  # before the first step Adam-like state is not there yet


def _cpu_copy(value: Any, clone: bool = True) -> Any:
    """``value`` with every tensor detached and on the CPU (dicts, lists and tuples walked): a
    copy of device tensors, of CPU tensors only with ``clone``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=clone)
    if isinstance(value, Mapping):
        return {k: _cpu_copy(v, clone) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v, clone) for v in value)
    return value


_provider: Optional[PlainStateProvider] = None
_restored_step: Optional[int] = None  # load_jit_state before track_state: the provider starts from it
_restored_source: Optional[str] = None


def track_state(model: Any, optimizer: Any, *, extra: Optional[Extra] = None,
                checkpoint_dir: Optional[str] = None) -> bool:
    """Let this rank save ``model`` and ``optimizer`` when a peer fails (docs/jit-state.md).

    Call once, after building them and before training. Costs nothing per step.

    Args:
        model: The trained module.
        optimizer: Its optimizer.
        extra: Returns a dict of plain values to save along (and get back from :func:`load_jit_state`).
        checkpoint_dir: Your shared checkpoint directory: saves are copied to
            ``<checkpoint_dir>/ft_jit_state/`` too.

    Returns:
        True when just-in-time state is on for this rank (under ft_launcher, not turned off).
    """
    global _provider
    if _provider is not None:
        _provider.remove()
    _provider = PlainStateProvider(model, optimizer, extra)
    if _restored_step is not None:
        _provider.step = _restored_step
    return jit_state.attach(_provider, checkpoint_dir)


def load_jit_state(model: Any, optimizer: Any, *, newer_than: Optional[int] = None,
                   load_extra: Optional[Callable[[dict[str, Any]], None]] = None,
                   checkpoint_dir: Optional[str] = None) -> Optional[int]:
    """Restore the just-in-time state the launcher agreed on, or a requeued job's shared copy.

    With ``FT_JIT_RESUME`` (a restart: the launcher agreed on a state) that state is loaded.
    Without it (a new job, e.g. a requeue), the ranks agree through the process group on the
    newest state of ``<checkpoint_dir>/ft_jit_state/`` that every rank can read with the same
    checksum (:mod:`ft_core.client.requeue_state`): call it on every rank, after
    ``init_process_group``.

    Args:
        model: The module to load into (the same wrapping as when it was saved).
        optimizer: Its optimizer.
        newer_than: The step of the periodic checkpoint you loaded: a state not newer is not used.
            When none is used, the completed-step count goes on from this step (the optimizer's
            hooks count the updates after the restore; a later save must name the loop's step,
            not the updates since this worker started).
        load_extra: Receives the ``extra`` dict saved with the state.
        checkpoint_dir: Where a previous job copied its states; default: the one given to
            :func:`track_state`.

    Returns:
        The completed step restored (continue with the next one), or None: nothing to restore (not
        restarted after a failure, no agreed state, a corrupt one: one warning), use your checkpoint.
    """
    global _restored_source
    _restored_source = None
    step = _restore(model, optimizer, newer_than, load_extra, checkpoint_dir)
    _restart_count_at(optimizer, step if step is not None else newer_than)
    return step


def _restart_count_at(optimizer: Any, step: Optional[int]) -> None:
    """The completed-step count restarts at ``step`` (the state the loop resumes from), now and for
    a :func:`track_state` that comes later; nothing changes for None."""
    global _restored_step
    if step is None:
        return
    _restored_step = step
    if _provider is not None and _provider.optimizer is optimizer:
        _provider.step = step


def _restore(model: Any, optimizer: Any, newer_than: Optional[int],
             load_extra: Optional[Callable[[dict[str, Any]], None]],
             checkpoint_dir: Optional[str]) -> Optional[int]:
    """:func:`load_jit_state`'s restore: the step restored or None; the count is the caller's."""
    path = os.environ.get(FT_JIT_RESUME_ENV_VAR)
    if not path:
        state = _shared_candidate(newer_than, checkpoint_dir)
        if state is None:
            return None
        return _load(state, model, optimizer, load_extra, "jit_shared")
    state = saved_state.read_manifest(os.path.join(os.path.dirname(path), saved_state.manifest_name(
        _step_of(path))))
    if state is None or state.payload_path != path or state.kind != "plain" or not saved_state.verify(state):
        logger.warning("just-in-time state %s is missing or corrupt (its checksum differs); falling back to the "
                       "periodic checkpoint", path)
        return None
    if newer_than is not None and state.step <= newer_than:
        logger.info("just-in-time state of step %s is not newer than the checkpoint of step %s; not used",
                    state.step, newer_than)
        return None
    return _load(state, model, optimizer, load_extra, "jit")


def restored_source() -> Optional[str]:
    """Where the last :func:`load_jit_state` restored from: ``jit`` (the launcher's agreed state),
    ``jit_shared`` (a previous job's copy in the checkpoint directory), or None (nothing)."""
    return _restored_source


def _shared_candidate(newer_than: Optional[int], checkpoint_dir: Optional[str]) -> Optional[saved_state.SavedState]:
    """The previous job's state every rank agreed on, or None (see :mod:`requeue_state`)."""
    this_rank = jit_state.get_jit_state()
    if not this_rank.enabled:
        return None  # not under ft_launcher, or --ft-jit-state false: nothing is restored
    directory = requeue_state.shared_state_dir(checkpoint_dir) if checkpoint_dir else this_rank.shared_dir
    collectives = TorchDistributedCollectives()
    _rank, world_size, grouped = rank_and_world_size(collectives)
    if world_size > 1 and not grouped:
        if directory:
            logger.warning("the just-in-time state in %s is not used: load_jit_state needs the process group "
                           "(call it after init_process_group) to agree on it with the other ranks", directory)
        return None
    return requeue_state.agree_on_shared_state(
        directory, "plain", collectives, lambda s: newer_than is None or s.step > newer_than)


def _load(state: saved_state.SavedState, model: Any, optimizer: Any,
          load_extra: Optional[Callable[[dict[str, Any]], None]], source: str) -> Optional[int]:
    path = state.payload_path
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # e.g. an ``extra`` value torch's safe loader does not accept
        logger.warning("just-in-time state %s could not be loaded (%s: %s); falling back to the periodic checkpoint",
                       path, type(err).__name__, str(err).partition("\n")[0][:200])
        return None
    if not isinstance(payload, dict) or payload.get("format") != PAYLOAD_FORMAT:
        logger.warning("just-in-time state %s is not a plain-loop state; falling back to the periodic checkpoint", path)
        return None
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    if load_extra is not None and payload.get("extra") is not None:
        load_extra(payload["extra"])
    global _restored_source
    _restored_source = source
    if source == "jit_shared":
        logger.info("resumed from the just-in-time state of step %s that the previous job copied to %s (saved by "
                    "rank %s, %s path)", state.step, path, state.rank, state.source)
    else:
        logger.info("resumed from the just-in-time state of step %s (saved by rank %s, %s path)", state.step,
                    state.rank, state.source)
    return state.step


def _step_of(path: str) -> int:
    name = os.path.basename(path)
    digits = name[len("state-"):-len(".pt")] if name.startswith("state-") and name.endswith(".pt") else ""
    return int(digits) if digits.isdigit() else -1
