"""A requeued job resumes from the just-in-time state its predecessor copied to the checkpoint dir.

Survivors copy each saved state to ``<checkpoint_dir>/ft_jit_state/`` (see
:mod:`ft_core.client.jit_state`). A new ``ft_launcher`` run (the next job of an autoresume chain)
starts with an empty run directory, so its launcher offers no state (no ``FT_JIT_RESUME``); and it
does not know the checkpoint directory, which only the ranks are given. So the ranks choose, once,
at their restore, through their own process group (:func:`agree_on_shared_state`):

1. rank 0 lists the states of its shared directory of the right kind, accepted by the caller's
   test (newer than the user's checkpoint), owned by this user, whose size and SHA-256 check out
   (a corrupt one is skipped with one warning), newest first, and broadcasts ``step:sha256`` of each;
2. every other rank verifies its own copies of the offered states alone and says, for each,
   whether it holds a verified one of that step with that same SHA-256 (one ``all_true``);
3. all ranks take the newest one every rank holds; none: the user's checkpoint.

So every rank loads the same bytes or none does; no partial or mixed state. Standard library
only (the payload is loaded by the caller).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Optional

from ft_core.client.collectives import Collectives
from ft_core.wire import saved_state

logger = logging.getLogger(__name__)

MAX_CANDIDATES = 4
"""At most this many states are offered (a directory keeps 2: :func:`saved_state.prune`)."""


def shared_state_dir(checkpoint_dir: Optional[str]) -> Optional[str]:
    """``<checkpoint_dir>/ft_jit_state`` or None when no checkpoint directory is given."""
    return os.path.join(os.fspath(checkpoint_dir), saved_state.JIT_SUBDIR) if checkpoint_dir else None


def verified_states(directory: str, kind: str,
                    wanted: Callable[[saved_state.SavedState], bool] = lambda _state: True,
                    ) -> list[saved_state.SavedState]:
    """The states of ``directory`` of ``kind`` that ``wanted`` accepts and whose payload checks out,
    newest first; one warning per corrupt payload (it is skipped). Only wanted payloads are read."""
    found = []
    for state in saved_state.scan(directory)[:MAX_CANDIDATES]:
        if state.kind != kind or not wanted(state):
            continue
        if not _own_file(state.payload_path):
            logger.warning("just-in-time state of step %s in %s is not owned by this user; not used", state.step,
                           directory)
            continue
        if not saved_state.verify(state):
            logger.warning("just-in-time state of step %s in %s is corrupt (its checksum differs); not used",
                           state.step, directory)
            continue
        found.append(state)
    return found


def _own_file(path: str) -> bool:
    # Loading a payload unpickles it (a Lightning checkpoint): only files this user wrote (0600).
    try:
        return os.stat(path).st_uid == os.getuid()
    except OSError:
        return False


def agree_on_shared_state(directory: Optional[str], kind: str, collectives: Collectives,
                          accept: Callable[[saved_state.SavedState], bool] = lambda _state: True,
                          ) -> Optional[saved_state.SavedState]:
    """The state of the shared directory every rank restores, or None (all use their checkpoint).

    Every rank must call it at the same point (it runs two collectives whatever it finds).

    Args:
        directory: This rank's ``<checkpoint_dir>/ft_jit_state`` (None: this rank has none).
        kind: ``plain`` or ``lightning``: the payloads this loader understands.
        collectives: The job's collectives (one process group over all ranks).
        accept: Asked on rank 0 for each state before its payload is read (e.g. "newer than the
            user's checkpoint"); a state it refuses is neither read nor offered.

    Returns:
        This rank's copy of the newest state every rank holds with the same SHA-256, or None.
    """
    offer: Optional[str] = None
    ours: list[saved_state.SavedState] = []
    if collectives.rank() == 0:
        ours = verified_states(directory, kind, accept) if directory else []
        offer = " ".join(f"{s.step}:{s.sha256}" for s in ours)
    offered = collectives.broadcast_text(offer) or ""
    keys = []
    for item in offered.split():
        step, _, sha = item.partition(":")
        keys.append((int(step), sha))
    if not keys:
        return None
    if collectives.rank() != 0 and directory:  # rank 0 verified its own already
        ours = verified_states(directory, kind, lambda s: (s.step, s.sha256) in keys)
    mine = {(s.step, s.sha256): s for s in ours}
    everywhere = collectives.all_true([key in mine for key in keys])
    for key, ok in zip(keys, everywhere, strict=True):
        if ok:
            return mine[key]
    if collectives.rank() == 0:
        logger.warning("the just-in-time state of step %s in %s is not readable on every rank (no verified copy "
                       "with the same checksum); not used", keys[0][0], directory)
    return None
