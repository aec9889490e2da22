"""Cold starts: the agent's start coordinator when every worker starts as a new interpreter.

:class:`StartCoordinator` is what :class:`launcher.agent.FaultTolerantAgent` calls at its hooks
about how workers start; :class:`launcher.warm.coordinator.WarmCoordinator` is the warm one
(workers forked from the node's template) and :class:`ColdStart` the plain one, as torchrun
starts workers: no template, no stand-ins, nothing to add to the workers' environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol


class StartCoordinator(Protocol):
    """How a cycle's workers start, as the agent sees it."""

    @property
    def uses_stand_ins(self) -> bool:
        """True when torch starts stand-ins whose workers have pids of their own."""
        ...

    @property
    def pid(self) -> int | None:
        """A helper process whose children are workers, not leftovers (None if there is none)."""
        ...

    @property
    def cold_reason(self) -> str | None:
        """Why the latest cycle (after :meth:`before_cycle`) starts cold; None if it starts warm."""
        ...

    def rendezvous_wait(self, cycle: int) -> AbstractContextManager[None]:
        """Around the rendezvous before ``cycle`` (a helper may start while it waits)."""
        ...

    def before_cycle(self, cycle: int) -> bool:
        """Before a cycle's workers start; True if they start warm."""
        ...

    def workers_started(self, now: float | None = None) -> None:
        """The cycle's workers were started at ``now`` (monotonic)."""
        ...

    def maybe_start(self, cycle: int, workers_up: bool, now: float | None = None) -> bool:
        """Called while the agent waits; True if a helper was started now."""
        ...

    def resolve_workers(self, stand_ins: dict[int, int]) -> dict[int, int]:
        """The workers' own pids (local rank -> pid) for the processes torch started."""
        ...

    def worker_env(self) -> dict[str, str]:
        """What each worker's environment needs."""
        ...


class ColdStart:
    """Every worker starts as a new interpreter (``--no-warm-restarts``, or an entry point that
    cannot be forked from the template); torch's processes are the workers."""

    uses_stand_ins = False
    pid = None
    cold_reason = "warm restarts are off (--no-warm-restarts, or an entry point the template cannot run)"

    @contextlib.contextmanager
    def rendezvous_wait(self, cycle: int) -> Iterator[None]:
        """Nothing to start while waiting."""
        yield

    def before_cycle(self, cycle: int) -> bool:
        """Nothing to prepare; the cycle starts cold."""
        return False

    def workers_started(self, now: float | None = None) -> None:
        """Nothing to note."""

    def maybe_start(self, cycle: int, workers_up: bool, now: float | None = None) -> bool:
        """Nothing to start."""
        return False

    def resolve_workers(self, stand_ins: dict[int, int]) -> dict[int, int]:
        """torch's processes are the workers."""
        return dict(stand_ins)

    def worker_env(self) -> dict[str, str]:
        """Nothing to add."""
        return {}
