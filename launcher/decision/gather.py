"""The facts of a failed cycle, gathered: records, exchanged views, healthy nodes, the crash loop.

:class:`CycleFailures` is the agent's collaborator for everything between "a worker failed" and
:func:`launcher.decision.decide.decide`: it counts the healthy nodes (min-healthy), turns
torch's failures and the cycle's evidence into failure records while exchanging this node's
view with the other nodes (:func:`launcher.decision.failures.failure_records`), feeds the
cycle's root to the crash-loop guard (which keeps the history of failed cycles), and returns
one :class:`~launcher.decision.facts.CycleFacts`. It also writes the records with the
decision's reason, and publishes this node's leaving as its view. The rendezvous store is its
only I/O (through :class:`~launcher.rendezvous.store_channel.StoreChannel`).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

from ft_core.wire.config import FaultToleranceConfig
from launcher.decision import culprit
from launcher.decision.crash_loop import CrashLoopGuard, CycleFailure, Fingerprint
from launcher.decision.culprit import ROOT, LostNode, RankState
from launcher.decision.facts import CycleFacts, WorkloadRequest
from launcher.decision.failures import (
    KIND_TERMINATED,
    Exchanged,
    FailureRecord,
    dropped_member_records,
    failure_records,
    group_unhealthy_record,
)
from launcher.decision.incident import CycleWatch
from launcher.decision.restart_policy import RestartPolicy
from launcher.events.log import EventLog
from launcher.node.processes import WorkerProcesses
from launcher.rendezvous.store_channel import StoreChannel

STOPPED_BY_THE_LAUNCHER = "stopped by the launcher"
"""The decision a collateral record stopped by the launcher carries instead of the cycle's."""


class CycleFailures:
    """Gathers the facts of failed cycles (see the module docstring).

    Args:
        policy: The node's restart policy.
        ft_cfg: The config (the crash-loop guard's limits, ``no_restart_exit_code``).
        channel: The cross-node channel of the current round.
        events: Where the records go (its ``node`` names this node).
        workers: The node's worker table (records name the workers' own pids).
    """

    def __init__(self, policy: RestartPolicy, ft_cfg: FaultToleranceConfig, channel: StoreChannel,
                 events: EventLog, workers: WorkerProcesses) -> None:
        self.policy = policy
        self._no_restart_exit_code = ft_cfg.no_restart_exit_code
        self._guard = CrashLoopGuard(ft_cfg.max_no_progress_cycles, ft_cfg.min_progress_iterations)
        self._channel = channel
        self._events = events
        self._workers = workers
        self.last_fingerprint: Fingerprint | None = None
        """The root failure of the latest failed cycle (for the result file), None before one."""

    def after_failure(self, worker_group: Any, failures: Mapping[int, Any], cycle: int, watch: CycleWatch,
                      stopped_by_us: Collection[int], remaining_restarts: int) -> CycleFacts:
        """The facts of a failed cycle: healthy nodes first (this node marked unhealthy), then the
        records (the views exchanged), then the crash-loop guard's verdict on the cycle's root."""
        healthy = None
        if self.policy.checks_node_health(worker_group.group_world_size) and self._channel.mark_unhealthy(
                worker_group.group_rank, cycle):
            healthy = self._channel.healthy_nodes(worker_group.group_world_size, live_group_ranks(worker_group))
        records = self.records(worker_group, failures, cycle, watch, stopped_by_us)
        first = records[0]  # every record of a cycle carries its root's fingerprint (None: no root)
        self.last_fingerprint = first.fingerprint
        # One node fewer must still make a round (--nnodes MIN) for a node to leave instead of a stop.
        # Spares are not counted here: every node must reach the same verdict, and each would read
        # the waiting spares at its own moment.
        can_lose_a_node = self.policy.can_lose_a_node(worker_group.group_world_size)
        verdict = (self._guard.on_failure(
            CycleFailure(cycle, first.fingerprint, first.root_step, self._root_node(first, worker_group),
                         first.root_before_first_step, first.root_from_outside),
            can_lose_a_node) if first.fingerprint is not None else None)
        return self._facts(worker_group, remaining_restarts, records=tuple(records), healthy_nodes=healthy,
                           crash_loop=verdict)

    def after_dropped_member(self, worker_group: Any, cycle: int, watch: CycleWatch,
                             noticed_at: float) -> list[FailureRecord]:
        """When torch restarts this node's running workers for nodes waiting in the rendezvous:
        the records naming the member the round lost (torch dropped it: its keep-alive lapsed),
        the views exchanged (:func:`~launcher.decision.failures.dropped_member_records`); empty
        when no member was dropped (a node restarted or joined) or no root was found."""
        nodes = worker_group.group_world_size or 1
        dead = getattr(worker_group.spec.rdzv_handler, "dead_group_ranks", None)
        dropped = dead(confirm=DEAD_CONFIRM) if nodes > 1 and callable(dead) else None
        if not dropped:
            return []
        pids = self._workers.worker_pids
        workers = {w.global_rank: (w.local_rank, pids.get(w.local_rank)) for w in worker_group.workers}
        return dropped_member_records(
            workers, dropped=dropped, cycle=cycle, now=noticed_at,
            evidence=watch.evidence(self._events.node, worker_group.group_rank),
            # the dropped nodes publish nothing: wait for the live ones only
            exchange=lambda states: self._exchange_views(worker_group, states, expected=nodes - len(dropped)))

    def while_waiting(self, worker_group: Any, remaining_restarts: int) -> CycleFacts:
        """The facts of a min-healthy re-check: the healthy nodes now."""
        healthy = self._channel.healthy_nodes(worker_group.group_world_size, live_group_ranks(worker_group))
        return self._facts(worker_group, remaining_restarts, waiting=True, healthy_nodes=healthy)

    def at_request(self, worker_group: Any, remaining_restarts: int, request: WorkloadRequest | None,
                   cause: str) -> CycleFacts:
        """The facts when a workload control request decided the run; for a replace request also
        the round's size and the spare nodes waiting (read from the rendezvous only then)."""
        if request is not WorkloadRequest.REPLACE:
            return self._facts(worker_group, remaining_restarts, request=request, request_cause=cause)
        return self._facts(worker_group, remaining_restarts, request=request, request_cause=cause,
                           group_world_size=worker_group.group_world_size,
                           spares_waiting=spares_waiting(worker_group))

    def _facts(self, worker_group: Any, remaining_restarts: int, **facts: Any) -> CycleFacts:
        return CycleFacts(policy=self.policy, remaining_restarts=remaining_restarts,
                          max_restarts=worker_group.spec.max_restarts,
                          no_restart_exit_code=self._no_restart_exit_code, **facts)

    def records(self, worker_group: Any, failures: Mapping[int, Any], cycle: int, watch: CycleWatch,
                stopped_by_us: Collection[int]) -> list[FailureRecord]:
        """This node's failure records of the cycle, the root first (the views exchanged)."""
        now = time.time()
        evidence = watch.evidence(self._events.node, worker_group.group_rank)
        return failure_records(
            failures, local_ranks={w.global_rank: w.local_rank for w in worker_group.workers},
            hangs=watch.hangs, stopped_by_us=stopped_by_us, cycle=cycle, now=now,
            evidence=evidence, exchange=lambda states: self._exchange_views(worker_group, states),
        ) or [group_unhealthy_record(cycle, now)]

    def write(self, records: Collection[FailureRecord], reason: str,
              stopped_reason: str = STOPPED_BY_THE_LAUNCHER) -> None:
        """Record each failure with the decision's ``reason`` and print its line; a worker the
        launcher stopped gets ``stopped_reason`` (a dropped member's records: the restart itself)."""
        for record in records:
            if record.pid is not None:  # torch's pid is the stand-in's under warm restarts
                record = dataclasses.replace(record, pid=self._workers.worker_pid(record.pid))
            self._events.failure(record, reason if record.kind != KIND_TERMINATED else stopped_reason)

    def publish_leaving(self, worker_group: Any, pids: Mapping[int, int], cause: str,
                        bound: float | None = None) -> None:
        """Before this node kills its workers to leave: publish them as this node's view of the
        failure its peers are about to see (rule 0 of :mod:`launcher.decision.culprit`), so that
        the peers name this node's leaving as the root, not their own ranks whose collectives
        fail, and do not wait for a view from a node that is gone. ``pids``: local rank -> pid
        as torch started it. With ``bound``, waits at most that many seconds (a store that does
        not answer must not hold up a stop; the write then goes on in a daemon thread)."""
        if (worker_group.group_world_size or 1) <= 1 or not self._channel.attached:
            return
        if bound is not None:
            publish = threading.Thread(target=self.publish_leaving, name="ft-publish-leaving", daemon=True,
                                       args=(worker_group, pids, cause))
            publish.start()
            publish.join(bound)
            return
        at = time.time()
        left = f"its node left the job ({cause})"
        own = {rank: self._workers.worker_pid(pid) for rank, pid in pids.items()}
        states = [RankState(rank=w.global_rank, local_rank=w.local_rank, node=self._events.node,
                            group_rank=worker_group.group_rank, pid=own.get(w.local_rank),
                            outcome=culprit.LEFT, cause=left, event_at=at).to_json()
                  for w in worker_group.workers]
        self._channel.publish_view(worker_group.group_rank, states)

    def _root_node(self, first: FailureRecord, worker_group: Any) -> str | None:
        """The root's node as every node names it: its host and its rank in this round (the host
        alone does not tell apart several launchers on one host); None if not known."""
        if first.role == ROOT:
            host, group_rank = self._events.node, worker_group.group_rank
        elif first.root is not None:
            host, group_rank = first.root.node, first.root.group_rank
        else:
            host, group_rank = None, None
        if not host:
            return None
        return f"{host} (group rank {group_rank})" if group_rank is not None else str(host)

    def _exchange_views(self, worker_group: Any, states: list[RankState], expected: int | None = None) -> Exchanged:
        """Publish this node's ranks of the failed cycle; read the other nodes' (bounded, or until
        ``expected`` nodes published) and name the nodes that sent none (only if this node's own
        view got through)."""
        nodes = worker_group.group_world_size or 1
        if nodes <= 1 or not self._channel.attached:
            return Exchanged()
        published = self._channel.publish_view(worker_group.group_rank, [s.to_json() for s in states])
        views = self._channel.gather_views(nodes, worker_group.group_rank, expected=expected)
        remote = [RankState.from_json(item) for item in views.states]
        lost = [LostNode(group_rank, host) for group_rank, host in views.missing.items()] if published else []
        return Exchanged([state for state in remote if state is not None], with_addresses(lost), views.waited)


def live_group_ranks(worker_group: Any) -> frozenset[int] | None:
    """The round's nodes whose launcher is alive, from the membership proxy
    (:mod:`launcher.rendezvous.membership`)."""
    live = getattr(worker_group.spec.rdzv_handler, "live_group_ranks", None)
    return live() if callable(live) else None


def spares_waiting(worker_group: Any) -> int | None:
    """The nodes waiting in the rendezvous that are not members of this round (spares, new
    nodes), from the membership proxy (:mod:`launcher.rendezvous.membership`); None if unknown."""
    count = getattr(worker_group.spec.rdzv_handler, "spares_waiting", None)
    return count() if callable(count) else None


DEAD_CONFIRM = 1.0
"""Seconds a round member must stay gone from torch's rendezvous state to count as dropped: a
member that restarts is gone from it for a moment, between leaving its round and joining the wait
list (:meth:`launcher.rendezvous.membership.MembershipHandler.dead_group_ranks`)."""

RESOLVE_TIMEOUT = 1.0
"""Longest the lost nodes' host names are resolved (a DNS that does not answer must not hold up
the decision; ``/etc/hosts`` or a cache answers at once)."""


def with_addresses(lost: list[LostNode], timeout: float = RESOLVE_TIMEOUT) -> list[LostNode]:
    """The lost nodes with their hosts' addresses (rule 5 of :mod:`launcher.decision.culprit`
    matches them against the peer addresses in the failed collectives' errors); a node whose
    host cannot be resolved within ``timeout`` keeps none."""
    hosts = sorted({n.host for n in lost if n.host})
    if not hosts:
        return lost
    found: dict[str, tuple[str, ...]] = {}

    def resolve() -> None:
        for host in hosts:
            try:
                infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except (OSError, UnicodeError):
                continue
            found[host] = tuple(dict.fromkeys(str(info[4][0]) for info in infos))

    # A daemon thread: a resolver stuck on an unreachable DNS server is left behind, not waited for.
    thread = threading.Thread(target=resolve, name="ft-resolve-lost-nodes", daemon=True)
    thread.start()
    thread.join(timeout)
    return [dataclasses.replace(n, addresses=found.get(n.host or "", ())) for n in lost]
