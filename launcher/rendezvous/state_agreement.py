"""Which just-in-time state the restarted workers resume from: the same step on every node.

After each rendezvous every node offers the newest complete state of its node-local state
directory (this launcher's run: saved by an earlier cycle; checksum verified), with the path of its copy in
the user's checkpoint directory when there is one (:mod:`ft_core.wire.saved_state`). The agreed
step is the newest step that EVERY node can read: its own copy, or a shared copy another node
offered that this node sees. Readability of shared copies differs from node to node, so it is
published too (a second exchange), and every node computes the same answer from the same data.
A node that cannot read the newest state (its survivors saved nothing, no shared copy) makes
the whole job use an older agreed state or none: one log line says why, and the ranks use their
periodic checkpoints. One node alone needs no exchange.

The workers get ``FT_JIT_RESUME`` (the payload) and ``FT_JIT_RESUME_STEP`` from
:func:`worker_env`, and ``FT_JIT_STATE_DIR`` whenever the feature is on. Store failures never
raise: they mean no agreed state.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ft_core.wire import saved_state
from ft_core.wire.env import FT_JIT_RESUME_ENV_VAR, FT_JIT_RESUME_STEP_ENV_VAR, FT_JIT_STATE_DIR_ENV_VAR
from launcher.rendezvous.store_channel import STORE_ERRORS, STORE_PREFIX

logger = logging.getLogger(__name__)

OFFER_PREFIX = STORE_PREFIX + "jit_offer/"
READABLE_PREFIX = STORE_PREFIX + "jit_readable/"
EXCHANGE_WAIT = 10.0
"""Longest a node waits for the other nodes' offers (they publish right after the rendezvous)."""
POLL_INTERVAL = 0.05
MAX_VALUE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Offer:
    """What one node holds: its newest state's step and payload (None: nothing), and the path of
    that state's copy in the user's checkpoint directory (None: no copy)."""

    step: int | None = None
    path: str | None = None
    shared: str | None = None

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "shared": self.shared})

    @classmethod
    def from_json(cls, raw: Any) -> Offer:
        """An offer read from the store; anything malformed is an empty offer."""
        if isinstance(raw, (bytes, bytearray)):
            raw = raw[:MAX_VALUE_BYTES].decode("utf-8", "replace")
        try:
            data = json.loads(raw)
        except (TypeError, ValueError, RecursionError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        step, shared = data.get("step"), data.get("shared")
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
        return cls(step=step, shared=shared if isinstance(shared, str) and step is not None else None)


@dataclass(frozen=True)
class Agreement:
    """The outcome: the step and this node's payload for it (None: no state), and why not the
    newest offered step (empty when it was agreed or nothing was offered)."""

    step: int | None = None
    path: str | None = None
    reason: str = ""


def local_offer(directory: str | None) -> Offer:
    """This node's newest state in ``directory`` whose checksum verifies."""
    if not directory:
        return Offer()
    for state in saved_state.scan(directory):
        if saved_state.verify(state):
            return Offer(step=state.step, path=state.payload_path, shared=state.shared_path or None)
        logger.warning("just-in-time state of step %s in %s is corrupt (its checksum differs); not used",
                       state.step, directory)
    return Offer()


def readable_steps(own: Offer, offers: Sequence[Offer], exists: Callable[[str], bool] = os.path.exists) -> list[int]:
    """The offered steps this node can read: its own, and those whose shared copy it sees."""
    steps = {own.step} if own.step is not None else set()
    steps.update(o.step for o in offers if o.step is not None and o.shared and exists(o.shared))
    return sorted(steps)


def agree(offers: Sequence[Offer], readable: Sequence[Sequence[int]], own: Offer, own_index: int,
          nodes: Sequence[str] | None = None) -> Agreement:
    """The newest step every node can read, and this node's payload for it.

    Args:
        offers: Every node's offer, by group rank.
        readable: Every node's :func:`readable_steps`, by group rank.
        own: This node's offer (with its local path).
        own_index: This node's group rank.
        nodes: Names of the nodes for the reason (default ``node <group rank>``).
    """
    names = list(nodes) if nodes is not None else [f"node {i}" for i in range(len(offers))]
    offered = [o.step for o in offers if o.step is not None]
    if not offered:
        return Agreement()
    newest = max(offered)
    common = set(readable[0]) if readable else set()
    for steps in readable[1:]:
        common &= set(steps)
    step = max(common) if common else None
    reason = ""
    if step != newest:
        lacking = [names[i] for i, steps in enumerate(readable) if newest not in steps]
        reason = (f"the newest just-in-time state (step {newest}) cannot be read on {', '.join(lacking)} "
                  "(no state saved there and no shared copy)")
        reason += f"; every node resumes from step {step}" if step is not None else "; periodic checkpoints are used"
    if step is None:
        return Agreement(reason=reason)
    if own.step == step and own.path:
        path = own.path
    else:
        path = next(o.shared for o in offers if o.step == step and o.shared and os.path.exists(o.shared))
    return Agreement(step=step, path=path, reason=reason)


def agree_after_rendezvous(store: Any, group_rank: int, group_world_size: int, directory: str | None,
                           wait: float = EXCHANGE_WAIT) -> Agreement:
    """Exchange the offers through the round's store and agree (see the module docstring).

    Every node of the round must call it (with the feature on); with one node no store is used.
    """
    own = local_offer(directory)
    if group_world_size <= 1:
        return Agreement(step=own.step, path=own.path)
    offers = _exchange(store, OFFER_PREFIX, group_rank, group_world_size, own.to_json(), wait)
    if offers is None:
        return Agreement(reason=_no_exchange(own))
    offers_parsed = [Offer.from_json(raw) for raw in offers]
    offers_parsed[group_rank] = own
    mine = readable_steps(own, offers_parsed)
    readable_raw = _exchange(store, READABLE_PREFIX, group_rank, group_world_size, json.dumps(mine), wait)
    if readable_raw is None:
        return Agreement(reason=_no_exchange(own))
    readable = [_steps(raw) for raw in readable_raw]
    return agree(offers_parsed, readable, own, group_rank)


def resume_for_round(store: Any, group_rank: int, group_world_size: int, directory: str | None,
                     cycle: int) -> Agreement | None:
    """:func:`agree_after_rendezvous` for the workers of ``cycle``, with its log lines; None when
    just-in-time state is off (``directory`` None)."""
    if directory is None:
        return None
    agreement = agree_after_rendezvous(store, group_rank, group_world_size, directory)
    if agreement.reason:
        logger.warning("cycle %s: %s", cycle, agreement.reason)
    if agreement.step is not None:
        logger.info("cycle %s: the workers resume from the just-in-time state of step %s (%s)", cycle,
                    agreement.step, agreement.path)
    return agreement


def _no_exchange(own: Offer) -> str:
    if own.step is None:
        return ""
    return ("the nodes could not exchange their just-in-time states through the rendezvous store; periodic "
            "checkpoints are used")


def _steps(raw: Any) -> list[int]:
    if isinstance(raw, (bytes, bytearray)):
        raw = raw[:MAX_VALUE_BYTES].decode("utf-8", "replace")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return []
    return [s for s in data if isinstance(s, int) and not isinstance(s, bool)] if isinstance(data, list) else []


def _exchange(store: Any, prefix: str, group_rank: int, group_world_size: int, value: str,
              wait: float) -> list[Any] | None:
    """Publish ``value`` under this node's key, then read every node's (waiting up to ``wait``);
    None when the store failed or a node did not publish in time."""
    keys = [prefix + str(rank) for rank in range(group_world_size)]
    try:
        store.set(keys[group_rank], value)
        store.add(prefix + "count", 1)
        deadline = time.monotonic() + wait
        while store.add(prefix + "count", 0) < group_world_size:
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_INTERVAL)
        return list(store.multi_get(keys))
    except STORE_ERRORS as err:
        logger.warning("could not exchange just-in-time state offers through the rendezvous store: %s", err)
        return None


def worker_env(directory: str | None, agreement: Agreement | None) -> dict[str, str]:
    """The workers' just-in-time state variables (empty when the feature is off)."""
    if not directory:
        return {}
    env = {FT_JIT_STATE_DIR_ENV_VAR: directory}
    if agreement is not None and agreement.step is not None and agreement.path:
        env[FT_JIT_RESUME_ENV_VAR] = agreement.path
        env[FT_JIT_RESUME_STEP_ENV_VAR] = str(agreement.step)
    return env
