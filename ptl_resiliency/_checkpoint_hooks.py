"""Tell a callback when a Trainer starts and finishes checkpoint work.

Lightning has no callback hook after a checkpoint was written, and its ``on_save_checkpoint``
hook runs before the write. So, while a callback is active, this module wraps, on the instances
only:

* ``trainer.save_checkpoint``, which every rank calls (``ModelCheckpoint`` and users alike):
  it spans gathering the state, the write (rank 0) and the barrier that follows, on all ranks.
  Its end is the one place where all ranks may run a collective after a save.
* with ``wrap_io=True``, the methods of ``trainer.strategy.checkpoint_io`` that do checkpoint
  work on whichever rank calls them: ``save_checkpoint``, ``remove_checkpoint``, and an
  asynchronous IO's finalisation (``maybe_finalize_save_checkpoint`` where it exists, and
  ``teardown`` of Lightning's ``AsyncCheckpointIO``, which waits for pending writes).

Instance attributes, not a wrapper object, so that ``isinstance`` checks other code makes on the
checkpoint IO (e.g. for async finalisation) keep working. :meth:`CheckpointHooks.uninstall`
removes what it installed; if someone wrapped the same method on top of ours in the meantime,
ours stays in place but passes calls straight through.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ptl_resiliency._lightning import AsyncCheckpointIO, pl

KIND_SAVE = "save"
"""``trainer.save_checkpoint``: all ranks, outermost."""
KIND_IO = "io"
"""A checkpoint IO method: possibly one rank only."""
KIND_FINALIZE = "finalize"
"""An asynchronous checkpoint IO's finalisation: possibly one rank only."""

_IO_METHODS = ("save_checkpoint", "remove_checkpoint")
_FINALIZE_METHOD = "maybe_finalize_save_checkpoint"  # NeMo's asynchronous checkpoint IO


def uses_async_checkpointing(checkpoint_io: Any) -> bool:
    """True when ``checkpoint_io`` saves asynchronously (its saves are finalised later)."""
    return isinstance(checkpoint_io, AsyncCheckpointIO) or callable(getattr(checkpoint_io, _FINALIZE_METHOD, None))
_MISSING = object()


class CheckpointHooks:
    """Calls ``on_start(kind)`` before and ``on_end(kind, ok)`` after checkpoint work.

    ``ok`` is False when the wrapped call raised; the exception then propagates unchanged, so
    ``on_end`` must not raise.

    Args:
        on_start: Called before the work, with :data:`KIND_SAVE`, :data:`KIND_IO` or
            :data:`KIND_FINALIZE`.
        on_end: Called after the work (also when it failed).
        wrap_io: Also wrap the strategy's checkpoint IO methods.
    """

    def __init__(
        self,
        on_start: Callable[[str], None],
        on_end: Callable[[str, bool], None],
        wrap_io: bool,
    ) -> None:
        self._on_start = on_start
        self._on_end = on_end
        self._wrap_io = wrap_io
        self._patched: list[tuple[Any, str, Callable[..., Any], Any]] = []
        self.active = False

    def install(self, trainer: pl.Trainer) -> None:
        """Wrap the trainer's (and its checkpoint IO's) checkpoint methods."""
        self.active = True
        self._patch(trainer, "save_checkpoint", KIND_SAVE)
        if not self._wrap_io:
            return
        checkpoint_io = trainer.strategy.checkpoint_io
        for name in _IO_METHODS:
            self._patch(checkpoint_io, name, KIND_IO)
        self._patch(checkpoint_io, _FINALIZE_METHOD, KIND_FINALIZE)
        if isinstance(checkpoint_io, AsyncCheckpointIO):
            self._patch(checkpoint_io, "teardown", KIND_FINALIZE)

    def uninstall(self) -> None:
        """Undo :meth:`install`. Safe to call more than once."""
        self.active = False
        for obj, name, wrapper, previous in reversed(self._patched):
            if vars(obj).get(name) is wrapper:
                if previous is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, previous)
        self._patched = []

    def _patch(self, obj: Any, name: str, kind: str) -> None:
        original = getattr(obj, name, None)
        if not callable(original) or not hasattr(obj, "__dict__"):
            return
        hooks = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not hooks.active:
                return original(*args, **kwargs)
            hooks._on_start(kind)
            ok = False
            try:
                result = original(*args, **kwargs)
                ok = True
                return result
            finally:
                hooks._on_end(kind, ok)

        previous = vars(obj).get(name, _MISSING)
        setattr(obj, name, wrapper)
        self._patched.append((obj, name, wrapper, previous))
