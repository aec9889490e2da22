"""Workers that ended their training cleanly: an abort at their exit is not a failure.

A process can abort in its interpreter's teardown after its training ended: a gloo (or NCCL)
process group still alive at exit makes the C++ destructors abort, with plain torchrun too. The
front ends know when the training ended cleanly (completed, or stopped gracefully) and say so
when they shut monitoring down; the monitor passes it on as
:class:`~ft_core.wire.messages.RankFinished`, before the rank can exit. A worker of the current
cycle that said so and then dies of :data:`AT_EXIT_SIGNAL` "finished, then aborted at exit": the
agent records it (``aborted_at_exit``), counts it as exited 0, and neither restarts it nor counts
a failure. Any other death of such a worker is a failure as before (a finished rank that later
segfaults, or exits 1 in the user's own code after ``fit``, is not this module's business).

:class:`CleanEnds` is the per-cycle bookkeeping; the agent (:mod:`launcher.agent`) consults it
where it reads exit statuses and torch's failures.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

AT_EXIT_SIGNAL = signal.SIGABRT
"""The death that counts as "aborted at exit" after a clean end (``abort()``, ``std::terminate``)."""


class CleanEnds:
    """Which local ranks' current workers ended their training cleanly, and what that excuses.

    Not thread-safe: the agent's main thread alone uses it.
    """

    def __init__(self) -> None:
        self._finished: dict[int, int] = {}  # local rank -> pid of the worker that said so

    def reset(self) -> None:
        """A new cycle: no worker has ended yet."""
        self._finished.clear()

    def finished(self, local_rank: int, pid: int) -> None:
        """The rank's worker ``pid`` ended its training cleanly (its monitor said so)."""
        self._finished[local_rank] = pid

    def any_finished(self) -> bool:
        """Whether a worker of this cycle ended its training cleanly (and is not training again)."""
        return bool(self._finished)

    def reconnected(self, local_rank: int) -> None:
        """The rank connected to its monitor again (a second ``fit``): it is training again."""
        self._finished.pop(local_rank, None)

    def aborted_at_exit(self, local_rank: int, status: int | None) -> bool:
        """True if the rank's worker ended cleanly and then died of :data:`AT_EXIT_SIGNAL`.

        Args:
            status: The exit status as :func:`launcher.node.processes.peek_exit_status` or torch
                reports it (``-N`` for signal N; under warm restarts the stand-in dies of the
                worker's signal, so torch sees the same).
        """
        return status == -AT_EXIT_SIGNAL and local_rank in self._finished

    def as_exited_zero(self, statuses: Mapping[int, int | None]) -> dict[int, int | None]:
        """``statuses`` (local rank -> exit status) with every abort at exit counted as 0."""
        return {rank: 0 if self.aborted_at_exit(rank, status) else status for rank, status in statuses.items()}

    def others_still_running(self, statuses: Mapping[int, int | None]) -> bool:
        """A worker aborted at exit and another is still running: the cycle is not over (torch's
        poll would take the abort for a failure and stop the others)."""
        return (any(self.aborted_at_exit(rank, status) for rank, status in statuses.items())
                and any(status is None for status in statuses.values()))

    def split(self, failures: Mapping[int, Any]) -> tuple[dict[int, Any], list[Any]]:
        """Separate torch's failures (global rank -> ``ProcessFailure``) into real ones and the
        aborts at exit.

        Returns:
            The failures that remain, and the ``ProcessFailure`` of each abort at exit.
        """
        remaining: dict[int, Any] = {}
        aborted: list[Any] = []
        for global_rank, failure in failures.items():
            if self.aborted_at_exit(failure.local_rank, failure.exitcode):
                aborted.append(failure)
            else:
                remaining[global_rank] = failure
        return remaining, aborted
