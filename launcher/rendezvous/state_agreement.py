"""Which just-in-time state the restarted workers resume from: the same step on every node.

After each rendezvous every node offers the newest complete state of its node-local state
directory (this launcher's run: saved by an earlier cycle; checksum verified), with the path of its copy in
the user's checkpoint directory when there is one (:mod:`ft_core.wire.saved_state`). The agreed
step is the newest step that EVERY node can read: its own copy, or a shared copy another node
offered that this node sees. Readability of shared copies differs from node to node, so it is
published too (a second exchange), and every node computes the same answer from the same data.
A node that cannot read the newest state (its survivors saved nothing, no shared copy) is healed
first: the node with the lowest group rank among those holding the newest state sends it to the
nodes that lack it through the round's store (:mod:`launcher.rendezvous.state_transfer`), and a
third exchange publishes what each node can read then. Only if healing fails (or is off:
``jit_heal_timeout`` 0) does the whole job use an older agreed state or none: one log line says
why, and the ranks use their periodic checkpoints. One node alone needs no exchange.

The workers get ``FT_JIT_RESUME`` (the payload) and ``FT_JIT_RESUME_STEP`` from
:func:`worker_env`, and ``FT_JIT_STATE_DIR`` whenever the feature is on. Store failures never
raise: they mean no agreed state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ft_core.wire import saved_state
from ft_core.wire.env import FT_JIT_RESUME_ENV_VAR, FT_JIT_RESUME_STEP_ENV_VAR, FT_JIT_STATE_DIR_ENV_VAR
from launcher.events.records import JitStateHealed, JitStateHealFailed
from launcher.rendezvous import state_transfer
from launcher.rendezvous.store_channel import STORE_ERRORS, STORE_PREFIX

logger = logging.getLogger(__name__)

OFFER_PREFIX = STORE_PREFIX + "jit_offer/"
READABLE_PREFIX = STORE_PREFIX + "jit_readable/"
HEALED_PREFIX = STORE_PREFIX + "jit_healed/"
EXCHANGE_WAIT = 10.0
"""Longest a node waits for the other nodes' offers (they publish right after the rendezvous)."""
POLL_INTERVAL = 0.05
MAX_VALUE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Offer:
    """What one node holds: its newest state's step and payload (None: nothing), the path of
    that state's copy in the user's checkpoint directory (None: no copy), the payload's size (it
    sizes a transfer's bound) and the node's host name (for the log lines)."""

    step: int | None = None
    path: str | None = None
    shared: str | None = None
    bytes: int = 0
    node: str = ""

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "shared": self.shared, "bytes": self.bytes, "node": self.node})

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
        step = step if _natural(step) else None
        size, node = data.get("bytes"), data.get("node")
        return cls(step=step, shared=shared if isinstance(shared, str) and step is not None else None,
                   bytes=size if _natural(size) and step is not None else 0,
                   node=node[:255] if isinstance(node, str) else "")


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Agreement:
    """The outcome: the step and this node's payload for it (None: no state), and why not the
    newest offered step (empty when it was agreed or nothing was offered), and the transfer that
    healed this node or that this node sent (None: none)."""

    step: int | None = None
    path: str | None = None
    reason: str = ""
    heal: Heal | None = None


@dataclass(frozen=True)
class HealPlan:
    """Who sends the newest state to whom: the same on every node (computed from the same data)."""

    step: int
    holder: int
    receivers: tuple[int, ...]
    bytes: int


@dataclass(frozen=True)
class Heal:
    """This node's part in a heal: ``role`` ``received`` or ``sent``, the peer(s) named."""

    role: str
    peer: str
    transfer: state_transfer.Transfer


def local_offer(directory: str | None) -> Offer:
    """This node's newest state in ``directory`` whose checksum verifies."""
    if not directory:
        return Offer()
    for state in saved_state.scan(directory):
        if saved_state.verify(state):
            return Offer(step=state.step, path=state.payload_path, shared=state.shared_path or None,
                         bytes=state.bytes)
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


def heal_plan(offers: Sequence[Offer], readable: Sequence[Sequence[int]]) -> HealPlan | None:
    """Which node sends the newest offered state to the nodes that cannot read it (None: every
    node can, or nothing was offered). The sender is the lowest group rank holding it on its own."""
    offered = [o.step for o in offers if o.step is not None]
    if not offered:
        return None
    newest = max(offered)
    receivers = tuple(i for i, steps in enumerate(readable) if newest not in steps)
    holders = [i for i, o in enumerate(offers) if o.step == newest]
    if not receivers or not holders:
        return None
    return HealPlan(step=newest, holder=holders[0], receivers=receivers, bytes=offers[holders[0]].bytes)


def node_name(offers: Sequence[Offer], index: int) -> str:
    """``node <group rank> (<host>)`` for the log lines."""
    host = offers[index].node if 0 <= index < len(offers) else ""
    return f"node {index} ({host})" if host else f"node {index}"


def agree_after_rendezvous(store: Any, group_rank: int, group_world_size: int, directory: str | None,
                           wait: float = EXCHANGE_WAIT, heal_timeout: float | None = None) -> Agreement:
    """Exchange the offers through the round's store, heal the nodes that lack the newest state,
    and agree (see the module docstring).

    Every node of the round must call it (with the feature on); with one node no store is used.

    Args:
        store: The round's store.
        group_rank, group_world_size: This node's place in the round.
        directory: This node's state directory.
        wait: Longest wait for the other nodes' offers.
        heal_timeout: ``jit_heal_timeout``: None sizes a transfer's bound from its bytes, 0 turns
            healing off.
    """
    own = local_offer(directory)
    if group_world_size <= 1:
        return Agreement(step=own.step, path=own.path)
    own = dataclasses.replace(own, node=socket.gethostname())
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
    plan = heal_plan(offers_parsed, readable)
    if plan is None or heal_timeout == 0 or directory is None:
        return agree(offers_parsed, readable, own, group_rank, _names(offers_parsed))
    bound = state_transfer.heal_timeout(heal_timeout, plan.bytes)
    deadline = time.monotonic() + bound  # the other nodes' results are due by then (plus the usual wait)
    heal, own = _heal(store, plan, group_rank, directory, bound, own, offers_parsed)
    mine = readable_steps(own, offers_parsed)
    failed = heal.transfer.reason if heal is not None and not heal.transfer.ok else ""
    healed_raw = _exchange(store, HEALED_PREFIX, group_rank, group_world_size,
                           json.dumps({"steps": mine, "failed": failed}),
                           max(0.0, deadline - time.monotonic()) + wait)
    if healed_raw is None:
        return Agreement(reason=_no_exchange(own), heal=heal)
    healed = [_healed(raw) for raw in healed_raw]
    agreement = agree(offers_parsed, [steps for steps, _ in healed], own, group_rank, _names(offers_parsed))
    failures = [f"{node_name(offers_parsed, i)}: {why}" for i, (_, why) in enumerate(healed) if why]
    reason = agreement.reason
    if reason:
        why = "; ".join(failures) if failures else "a receiver did not report"
        reason = (f"healing from {node_name(offers_parsed, plan.holder)} failed ({why}); " + reason)
    return Agreement(step=agreement.step, path=agreement.path, reason=reason, heal=heal)


def _heal(store: Any, plan: HealPlan, group_rank: int, directory: str, bound: float, own: Offer,
          offers: Sequence[Offer]) -> tuple[Heal | None, Offer]:
    """This node's part of ``plan``: send, receive, or nothing; and its offer afterwards."""
    if group_rank == plan.holder and own.path:
        state = next((s for s in saved_state.scan(directory) if s.step == plan.step), None)
        if state is None:
            transfer = state_transfer.Transfer(False, plan.step, reason="the state is no longer in the state directory")
            state_transfer.abort(store, plan.step, transfer.reason)
        else:
            transfer = state_transfer.send(store, state, len(plan.receivers), bound)
        peers = ", ".join(node_name(offers, i) for i in plan.receivers)
        return Heal("sent", peers, transfer), own
    if group_rank in plan.receivers:
        transfer = state_transfer.receive(store, directory, plan.step, bound)
        heal = Heal("received", node_name(offers, plan.holder), transfer)
        if transfer.ok:
            own = Offer(step=plan.step, path=transfer.path, bytes=transfer.bytes, node=own.node)
        return heal, own
    return None, own


def resume_for_round(store: Any, group_rank: int, group_world_size: int, directory: str | None,
                     cycle: int, heal_timeout: float | None = None, events: Any = None) -> Agreement | None:
    """:func:`agree_after_rendezvous` for the workers of ``cycle``, with its log lines and a
    ``state_healed``/``state_heal_failed`` record (through ``events.record_event``) when this node
    took part in a heal; None when just-in-time state is off (``directory`` None)."""
    if directory is None:
        return None
    agreement = agree_after_rendezvous(store, group_rank, group_world_size, directory, heal_timeout=heal_timeout)
    heal = agreement.heal
    if heal is not None:
        _record_heal(cycle, heal, events)
    if agreement.reason:
        logger.warning("cycle %s: %s", cycle, agreement.reason)
    if agreement.step is not None:
        cost = ""
        if heal is not None and heal.role == "received" and heal.transfer.ok:
            cost = (f"; healed from {heal.peer}: {heal.transfer.bytes} bytes in {heal.transfer.seconds:.2f} s "
                    "through the rendezvous store")
        logger.info("cycle %s: the workers resume from the just-in-time state of step %s (%s)%s", cycle,
                    agreement.step, agreement.path, cost)
    return agreement


def _record_heal(cycle: int, heal: Heal, events: Any) -> None:
    transfer = heal.transfer
    if transfer.ok:
        if heal.role == "sent":
            logger.info("cycle %s: sent the just-in-time state of step %s to %s (%s bytes in %.2f s)", cycle,
                        transfer.step, heal.peer, transfer.bytes, transfer.seconds)
        record: Any = JitStateHealed(cycle=cycle, role=heal.role, peer=heal.peer, step=transfer.step,
                                     bytes=transfer.bytes, seconds=transfer.seconds)
    else:
        logger.warning("cycle %s: the just-in-time state of step %s was not %s %s (after %.2f s): %s", cycle,
                       transfer.step, "sent to" if heal.role == "sent" else "received from", heal.peer,
                       transfer.seconds, transfer.reason)
        record = JitStateHealFailed(cycle=cycle, role=heal.role, peer=heal.peer, step=transfer.step,
                                    bytes=transfer.bytes, seconds=transfer.seconds, reason=transfer.reason)
    if events is not None:
        events.record_event(record)


def _names(offers: Sequence[Offer]) -> list[str]:
    return [node_name(offers, i) for i in range(len(offers))]


def _healed(raw: Any) -> tuple[list[int], str]:
    if isinstance(raw, (bytes, bytearray)):
        raw = raw[:MAX_VALUE_BYTES].decode("utf-8", "replace")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return [], ""
    if not isinstance(data, dict):
        return [], ""
    failed = data.get("failed")
    return _steps(json.dumps(data.get("steps"))), failed[:1024] if isinstance(failed, str) else ""


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
