"""What the agent learns while a cycle fails: hang reports, exits, and evidence from the monitors.

:class:`CycleWatch` is reset at every cycle start. The agent feeds it the monitors' hang reports
(:meth:`CycleWatch.on_hang`) and the workers' exit statuses (:meth:`CycleWatch.observe`); once
something failed it gathers the evidence, before anything is stopped
(:meth:`CycleWatch.gather_evidence`: every monitor's ``progress_query``, and ``capture_stacks``
for the ranks still running, within the stack capture budget); at the decision it hands
:func:`launcher.decision.failures.failure_records` an :class:`~launcher.decision.failures.Evidence`.

A hang fails the cycle whatever the exit status that follows (a SIGTERM handler may exit 0):
:meth:`CycleWatch.hung_failures` supplies torch-style failures for hung workers torch does not
count as failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ft_core.wire import messages
from ft_core.wire.messages import ProgressReport, RankHang, StacksCaptured
from ft_core.wire.stacks import RANK_EXITED
from launcher.decision.failures import Evidence
from launcher.node import processes
from launcher.node.monitors import MonitorPool

logger = logging.getLogger(__name__)

QUERY_TIMEOUT = 1.0
"""Seconds (beyond the stack capture budget) the agent waits for the monitors' answers."""
HUNG_EXIT_MARGIN = 2.0
"""Seconds beyond ``rank_termination_grace`` a hung worker may take to exit before the launcher
kills it itself (its monitor sends SIGKILL at the grace; this covers a monitor that cannot)."""


def about_an_earlier_worker(event: messages.Message, worker_pid: int | None) -> bool:
    """True when a monitor's report (``rank_hang``, ``rank_escalated``) names another pid than
    the rank's current worker: a report the monitor sent about the previous cycle's worker that
    the agent reads only after the restart (e.g. a collateral rank whose own timeout fired while
    the launcher was stopping it). It must not fail the new cycle nor blame the new worker.
    A report without a pid, or a rank whose worker is not known, is taken as current."""
    pid = event.pid if isinstance(event, (RankHang, messages.RankEscalatedMessage)) else None
    if worker_pid is None or pid is None:
        return False
    return pid != worker_pid


class CycleWatch:
    """One cycle's failure state (see the module docstring)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new cycle starts)."""
        self.hangs: dict[int, RankHang] = {}
        self.exits_seen_at: dict[int, float] = {}
        self.exit_statuses: dict[int, int] = {}
        self.reports: dict[int, ProgressReport] = {}
        self.stacks: dict[int, StacksCaptured] = {}
        self.first_failure_at: float | None = None
        """Monotonic time of the first failure noticed (a hang's detection or a crash)."""
        self.evidence_taken = False
        self._hung_deadline: float | None = None

    # ------------------------------------------------------------------ observations

    def on_hang(self, local_rank: int, event: RankHang, grace: float) -> None:
        """A monitor's ``rank_hang`` report (sent before it signalled the rank)."""
        self.hangs[local_rank] = event
        mono = time.monotonic()
        mono = min(mono, mono - (time.time() - event.detected_at))
        self._note_failure(mono)
        # A monitor that asks its rank for its just-in-time state first signals it that much later.
        deadline = time.monotonic() + grace + (event.save_timeout or 0.0) + HUNG_EXIT_MARGIN
        self._hung_deadline = deadline if self._hung_deadline is None else max(self._hung_deadline, deadline)

    def observe(self, statuses: Mapping[int, int | None]) -> None:
        """Exit statuses by local rank (None: running); remembers when each exit was first seen."""
        now_epoch, now_mono = time.time(), time.monotonic()
        for local_rank, status in statuses.items():
            if status is not None and local_rank not in self.exits_seen_at:
                self.exits_seen_at[local_rank] = now_epoch
                self.exit_statuses[local_rank] = status
                if status != 0:
                    self._note_failure(now_mono)

    def _note_failure(self, mono: float) -> None:
        if self.first_failure_at is None or mono < self.first_failure_at:
            self.first_failure_at = mono

    def failed(self, statuses: Mapping[int, int | None]) -> bool:
        """True once a worker crashed or a hang was reported."""
        return bool(self.hangs) or any(status not in (None, 0) for status in statuses.values())

    def hung_still_running(self, statuses: Mapping[int, int | None]) -> list[int]:
        """Local ranks reported hung whose workers have not exited yet."""
        return [local_rank for local_rank in self.hangs if statuses.get(local_rank, 0) is None]

    def hung_overdue(self) -> bool:
        """True when hung workers had their grace (and a margin) and must be killed by us."""
        return self._hung_deadline is not None and time.monotonic() >= self._hung_deadline

    # ------------------------------------------------------------------ evidence

    def gather_evidence(self, monitors: MonitorPool, local_ranks: list[int], running: list[int],
                        budget: float) -> None:
        """Ask every monitor for its rank's progress, and the monitors of ``running`` ranks that
        were not reported hung for their stacks (their own monitors took those of hung ranks),
        all at once, bounded by ``budget`` + :data:`QUERY_TIMEOUT`. Call before stopping anyone."""
        self.evidence_taken = True
        questions: dict[int, list[messages.Message]] = {}
        for local_rank in local_ranks:
            if local_rank in self.hangs:
                continue  # its hang report carries its progress and stacks
            questions[local_rank] = [messages.ProgressQuery()]
            if local_rank in running and budget > 0:
                questions[local_rank].append(messages.CaptureStacks(reason="another rank of the job failed"))
        answers = monitors.ask_each(questions, budget + QUERY_TIMEOUT)
        for local_rank, replies in answers.items():
            report, stacks = replies.get(ProgressReport), replies.get(StacksCaptured)
            if isinstance(report, ProgressReport):
                self.reports[local_rank] = report
            if isinstance(stacks, StacksCaptured):
                self.stacks[local_rank] = stacks
        exited = sorted(rank for rank, answer in self.stacks.items()
                        if answer.stacks is not None and answer.stacks.stack_error == RANK_EXITED)
        if exited:
            # one line for the node: these ranks were on their way out, not hung; their monitors log it at debug
            logger.info("no stacks of local rank(s) %s: they exited before their stacks could be read "
                        "(a rank that exits on its own is not hung; its stack is not needed)",
                        ", ".join(map(str, exited)))

    def evidence(self, node: str, group_rank: int | None) -> Evidence:
        return Evidence(node=node, group_rank=group_rank, reports=self.reports, stacks=self.stacks,
                        exits_seen_at=self.exits_seen_at)

    # ------------------------------------------------------------------ hung workers torch calls healthy

    def hung_failures(self, pids: Mapping[int, int], global_ranks: Mapping[int, int],
                      failures: Mapping[int, Any]) -> dict[int, Any]:
        """torch-style failures (global rank -> ``ProcessFailure``) for hung workers that exited
        but are not in ``failures`` (they exited 0 after the termination signal)."""
        added = {}
        for local_rank in self.hangs:
            global_rank = global_ranks.get(local_rank)
            if global_rank is None or global_rank in failures:
                continue
            status = self.exit_statuses.get(local_rank)
            if status is None:
                pid = pids.get(local_rank)
                if pid is None or processes.running_child(pid):
                    continue
                # torch reaped it without counting it as failed: it exited 0.
                status = 0
            added[global_rank] = ProcessFailure(local_rank=local_rank, pid=pids.get(local_rank, -1),
                                                exitcode=status, error_file="")
        return added
