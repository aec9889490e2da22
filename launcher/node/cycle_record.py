"""The ``cycle_start`` record of a cycle whose workers torch just started: who runs where, and
what the start cost (rendezvous, spawn, time since the failure that led to it)."""

from __future__ import annotations

from typing import Any

from launcher.events.records import CycleStart


def cycle_start(cycle: int, worker_group: Any, remaining_restarts: int, pids: dict[int, int],
                worker_pids: dict[int, int], starts: Any, warm_ready: bool,
                timings: dict[str, float | None]) -> CycleStart:
    """The record of cycle ``cycle``.

    Args:
        cycle: The cycle's index.
        worker_group: torch's worker group, after its rendezvous (ranks and group sizes).
        remaining_restarts: torch's restart counter now (the restart count is read from it).
        pids: Local rank -> pid as torch started the process (a stand-in under warm starts).
        worker_pids: Local rank -> the worker's own pid.
        starts: The start coordinator (stand-ins in use, why a start was cold).
        warm_ready: The workers were forked from a ready template.
        timings: ``rendezvous_s``, ``spawn_s`` and ``since_failure_s`` in seconds (None: not known),
            rounded to 0.1 ms in the record.
    """
    return CycleStart(
        cycle=cycle,
        restart_count=worker_group.spec.max_restarts - remaining_restarts,
        group_rank=worker_group.group_rank,
        group_world_size=worker_group.group_world_size,
        ranks={str(w.local_rank): w.global_rank for w in worker_group.workers},
        worker_pids={str(k): v for k, v in worker_pids.items()},
        stand_in_pids={str(k): v for k, v in pids.items()} if starts.uses_stand_ins else None,
        warm_start=warm_ready,
        cold_reason=None if warm_ready else starts.cold_reason,
        **{name: None if value is None else round(value, 4) for name, value in timings.items()},
    )
