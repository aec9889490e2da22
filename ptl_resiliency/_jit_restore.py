"""Resume a ``fit`` from the just-in-time state the launcher chose, whatever ``ckpt_path`` the
user passed (None included).

``ft_launcher`` gives restarted workers ``FT_JIT_RESUME`` (a payload: a Lightning checkpoint
file) and ``FT_JIT_RESUME_STEP`` when every node can read a state of that step
(``docs/jit-state.md``). :class:`JitRestore` wraps, on the Trainer's checkpoint connector
*instance* and only while the callback's ``fit`` session is open, the method Lightning calls
once per run to load a checkpoint (``_restore_modules_and_callbacks``, called after the
callbacks' ``setup``). On that call, at the same point on every rank:

1. rank 0 picks the just-in-time state unless it is missing, broken, from a sharded strategy,
   or older than the checkpoint the user asked for (the user's file was written after it:
   e.g. a ``last.ckpt`` saved after a stale state), and broadcasts the step;
2. every rank checks its own copy (manifest, size, SHA-256, the step broadcast);
3. only if all ranks can (one more collective), each loads its copy instead of the user's path;
   otherwise all use the user's ``ckpt_path``, with one log line saying why. No rank ever
   restores another step than its peers.

The payload is read with ``torch.load`` here rather than through the strategy's checkpoint IO
(a user's IO may store files its own way); everything after the read (model, optimizers,
schedulers, loops, callbacks) is Lightning's own restore.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

from ft_core.client import requeue_state
from ft_core.client.collectives import Collectives
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.wire import saved_state
from ft_core.wire.env import FT_JIT_RESUME_ENV_VAR, FT_JIT_RESUME_STEP_ENV_VAR, FT_JIT_STATE_DIR_ENV_VAR
from ptl_resiliency._jit_state import KIND, checkpoint_dir_of, sharding_reason
from ptl_resiliency._lightning import pl

RESTORE_METHOD = "_restore_modules_and_callbacks"
"""The checkpoint connector's method that starts a run's restore (its first argument is the path)."""

_used_in_process = False  # FT_JIT_RESUME names the state of this process's first fit only


def resume_candidate() -> tuple[Optional[saved_state.SavedState], str]:
    """The state ``FT_JIT_RESUME`` names, if its manifest is complete and matches; else why not.

    Returns:
        ``(state, "")``, or ``(None, why)`` (``why`` empty when nothing is named). The payload's
        checksum is not read here (see :func:`ft_core.wire.saved_state.verify`).
    """
    path = os.environ.get(FT_JIT_RESUME_ENV_VAR, "")
    if not path:
        return None, ""
    manifest = os.path.splitext(path)[0] + ".json"
    state = saved_state.read_manifest(manifest)
    if state is None or os.path.realpath(state.payload_path) != os.path.realpath(path):
        return None, f"{path} has no valid manifest ({manifest})"
    if state.kind != KIND:
        return None, f"{path} holds a {state.kind} state, not a Lightning checkpoint"
    expected = os.environ.get(FT_JIT_RESUME_STEP_ENV_VAR, "")
    if expected and expected != str(state.step):
        return None, f"{path} holds step {state.step}, but {FT_JIT_RESUME_STEP_ENV_VAR}={expected}"
    return state, ""


def _mtime(path: str) -> float:
    if "://" in path:
        from lightning.fabric.utilities.cloud_io import get_filesystem

        return float(get_filesystem(path).modified(path).timestamp())
    return os.stat(path).st_mtime


def newer_than(user_path: Any, state: saved_state.SavedState) -> bool:
    """Whether the user's checkpoint was written after ``state`` (so it is the newer one).

    Checkpoints of one job are written as training goes on, so the later file holds the later
    step; this costs two ``stat`` calls instead of loading the user's checkpoint. A file that
    cannot be read counts as older (Lightning would fail to load it anyway).
    """
    if not user_path:
        return False
    try:
        return _mtime(os.fspath(user_path)) > os.stat(state.payload_path).st_mtime
    except (OSError, ValueError, ImportError):
        return False


class JitRestore:
    """Makes the Trainer's next restore load the launcher's just-in-time state (see module doc).

    Args:
        log: The callback's logger.
    """

    def __init__(self, log: RankLoggerAdapter) -> None:
        self._log = log
        self._connector: Any = None
        self._wrapper: Optional[Callable[..., Any]] = None
        self.restored: Optional[saved_state.SavedState] = None
        """The state this run resumed from, once restored."""
        self.from_shared = False
        """Whether :attr:`restored` is a previous job's copy in the checkpoint directory."""

    def install(self, trainer: pl.Trainer, collectives: Collectives) -> bool:
        """Wrap the connector's restore for this process's first ``fit`` when just-in-time state is
        on (``FT_JIT_STATE_DIR``) or a state is named (``FT_JIT_RESUME``).

        Every rank wraps alike, whether or not its node got a state: the choice runs collectives.

        Returns:
            Whether it was wrapped.
        """
        if _used_in_process or not (os.environ.get(FT_JIT_STATE_DIR_ENV_VAR) or os.environ.get(FT_JIT_RESUME_ENV_VAR)):
            return False
        connector = trainer._checkpoint_connector
        original = getattr(connector, RESTORE_METHOD)
        restore = self

        @functools.wraps(original)
        def wrapper(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
            restore.uninstall()  # once per run, whatever happens below
            state = restore._choose(trainer, collectives, checkpoint_path)
            if state is None:
                return original(checkpoint_path, *args, **kwargs)
            with _loading_payload(trainer.strategy, state.payload_path):
                result = original(state.payload_path, *args, **kwargs)
            restore.restored = state
            return result

        setattr(connector, RESTORE_METHOD, wrapper)
        self._connector, self._wrapper = connector, wrapper
        return True

    def uninstall(self) -> None:
        """Remove the wrapper (the class's method shows again). Safe to call more than once."""
        connector, wrapper = self._connector, self._wrapper
        self._connector = self._wrapper = None
        if connector is not None and vars(connector).get(RESTORE_METHOD) is wrapper:
            delattr(connector, RESTORE_METHOD)

    def _choose(self, trainer: pl.Trainer, collectives: Collectives,
                user_path: Any) -> Optional[saved_state.SavedState]:
        """The state every rank restores, or None for the user's ``ckpt_path`` (collectives: all ranks)."""
        global _used_in_process
        _used_in_process = True
        state, why = resume_candidate()
        instead = f"the checkpoint {user_path}" if user_path else "the start (no ckpt_path)"
        if state is None and not why and os.environ.get(FT_JIT_STATE_DIR_ENV_VAR):
            return self._choose_shared(trainer, collectives, user_path, instead)
        decision: Optional[str] = None
        if collectives.rank() == 0:
            refusal = sharding_reason(trainer.strategy)
            if state is None:
                if why:  # else no state was offered (a first start, nothing saved): nothing to say
                    self._log.warning("just-in-time state not used: %s; resuming from %s", why, instead)
            elif refusal:
                self._log.warning("just-in-time state of step %s not used: %s; resuming from %s",
                                  state.step, refusal, instead)
            elif newer_than(user_path, state):
                self._log.info("the checkpoint %s was written after the just-in-time state of step %s: "
                               "resuming from it", user_path, state.step)
            else:
                decision = str(state.step)
        chosen = collectives.broadcast_text(decision)
        if chosen is None:
            if state is not None and collectives.rank() != 0:
                self._log.debug("just-in-time state of step %s not used: rank 0 chose %s", state.step, instead)
            return None
        ok = state is not None and str(state.step) == chosen and saved_state.verify(state)
        if not ok:
            self._log.warning("just-in-time state of step %s unreadable here: %s", chosen,
                              why or ("no state" if state is None else f"{state.payload_path} fails its checksum"
                                      if str(state.step) == chosen else f"this rank's state is step {state.step}"))
        if not all(collectives.all_true([ok])):
            if collectives.rank() == 0:
                self._log.warning("just-in-time state of step %s is not readable on every rank; all ranks "
                                  "resume from %s", chosen, instead)
            return None
        assert state is not None
        if collectives.rank() == 0:
            self._log.warning("resuming from the just-in-time state of step %s (saved by rank %s in cycle %s, "
                              "%s path) instead of %s", state.step, state.rank, state.cycle, state.source, instead)
        return state

    def _choose_shared(self, trainer: pl.Trainer, collectives: Collectives, user_path: Any,
                       instead: str) -> Optional[saved_state.SavedState]:
        """No state named (a new job, e.g. a requeue): the newest state a previous job copied to
        ``<ModelCheckpoint dirpath>/ft_jit_state/`` that every rank can read, unless the user's
        checkpoint was written after it (collectives: all ranks)."""
        refusal = sharding_reason(trainer.strategy)
        directory = None if refusal else requeue_state.shared_state_dir(checkpoint_dir_of(trainer))
        state = requeue_state.agree_on_shared_state(directory, KIND, collectives,
                                                    lambda s: not self._user_is_newer(user_path, s))
        if state is None:
            return None
        self.from_shared = True
        if collectives.rank() == 0:
            self._log.warning("resuming from the just-in-time state of step %s that a previous job copied to %s "
                              "(saved by rank %s, %s path) instead of %s", state.step, state.payload_path,
                              state.rank, state.source, instead)
        return state

    def _user_is_newer(self, user_path: Any, state: saved_state.SavedState) -> bool:
        if not newer_than(user_path, state):
            return False
        self._log.info("the checkpoint %s was written after the just-in-time state of step %s in %s: resuming "
                       "from it", user_path, state.step, os.path.dirname(state.payload_path))
        return True


@contextmanager
def _loading_payload(strategy: Any, payload_path: str) -> Iterator[None]:
    """While inside, ``strategy.load_checkpoint(payload_path)`` reads the payload with ``torch.load``."""
    original = strategy.load_checkpoint

    @functools.wraps(original)
    def load(checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        if os.fspath(checkpoint_path) != payload_path:
            return original(checkpoint_path, *args, **kwargs)
        import torch

        # Our own file (0600, checksum verified): not a stranger's pickle.
        return torch.load(payload_path, map_location="cpu", weights_only=False)

    had_own = "load_checkpoint" in vars(strategy)
    previous = vars(strategy).get("load_checkpoint")
    strategy.load_checkpoint = load
    try:
        yield
    finally:
        if had_own:
            strategy.load_checkpoint = previous
        else:
            del strategy.load_checkpoint
