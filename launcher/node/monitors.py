"""The node's rank monitors: one per local rank, started once, replaced when one dies or stops
answering.

Besides starting and replacing them, the pool asks them questions on their launcher links, all
monitors at once, each question bounded in time (:meth:`MonitorPool.ask`): ``ping`` (the
liveness probe at each cycle start, :meth:`MonitorPool.replace_dead`), ``progress_query`` and
``capture_stacks`` (the evidence the agent gathers when a cycle fails).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ft_core.monitor.link import MonitorLink
from ft_core.monitor.process import MONITOR_READY_TIMEOUT, MonitorProcess
from ft_core.wire import messages
from ft_core.wire.config import FaultToleranceConfig
from ft_core.wire.osutil import signals_blocked
from launcher.node import processes

logger = logging.getLogger(__name__)

STOP_TIMEOUT = 5.0
PING_TIMEOUT = 2.0
"""A monitor that does not answer ``ping`` within this (plus the stack capture budget, which
it may be spending) is replaced."""
UNRESPONSIVE = "unresponsive"
EXITED = "exited"
REPLIES = messages.REPLIES
"""The answer a monitor gives to each question of the launcher (see ft_core.wire.messages)."""


@dataclass(frozen=True)
class Replaced:
    """A monitor that :meth:`MonitorPool.replace_dead` replaced.

    Attributes:
        local_rank: Whose monitor.
        exit_code: The old monitor's exit code (negative: signal), as it ended.
        reason: :data:`EXITED` (it died, or its link broke) or :data:`UNRESPONSIVE` (no answer
            to ``ping``: stopped or stuck; it was killed).
        pid: The old monitor's pid.
    """

    local_rank: int
    exit_code: int | None
    reason: str
    pid: int


@dataclass
class _Slot:
    local_rank: int
    socket_path: str
    process: MonitorProcess
    link: MonitorLink | None = None


class MonitorPool:
    """Owns the monitors of one node.

    Args:
        cfg: Configuration every monitor enforces.
        run_dir: Private directory for the sockets.
        local_world_size: Number of local ranks.
        stacks_dir: Where monitors write the stacks of hung ranks (None: no files).
    """

    def __init__(self, cfg: FaultToleranceConfig, run_dir: str, local_world_size: int,
                 stacks_dir: str | None = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.local_world_size = local_world_size
        self.stacks_dir = stacks_dir
        self._slots: dict[int, _Slot] = {}

    def socket_path(self, local_rank: int) -> str:
        return os.path.join(self.run_dir, f"r{local_rank}.sock")

    def start(self) -> None:
        """Start every monitor (their interpreters start in parallel) and attach to each."""
        self._start_ranks(range(self.local_world_size))

    def _start_ranks(self, local_ranks: Any) -> None:
        spawned = {}
        extra = ["--stacks-dir", self.stacks_dir] if self.stacks_dir else []
        try:
            for local_rank in local_ranks:
                # Born with the step signals blocked, and they stay blocked: SLURM signals every
                # process of a step, and a monitor must survive them (its own handlers are for a
                # monitor run on its own); it learns of the launcher's end from its link.
                with signals_blocked():
                    spawned[local_rank] = MonitorProcess.spawn(
                        self.cfg, self.socket_path(local_rank), is_restarter_logger=local_rank == 0,
                        extra_args=["--name", f"local_rank {local_rank}", "--cleanup-dir", self.run_dir,
                                    *extra],
                    )
            for local_rank, process in spawned.items():
                process.wait_ready(MONITOR_READY_TIMEOUT)
                self._slots[local_rank] = _Slot(local_rank, process.socket_path, process,
                                                MonitorLink(process.socket_path))
        except BaseException:
            for process in spawned.values():
                process.kill()
                process.join(STOP_TIMEOUT)
            raise

    def replace_dead(self, probe: bool = True) -> list[Replaced]:
        """Restart monitors that died, whose link broke, or (``probe``) that do not answer a
        ``ping`` within :data:`PING_TIMEOUT` plus the stack capture budget (e.g. stopped).

        Returns:
            One :class:`Replaced` per monitor replaced.
        """
        reasons = {
            local_rank: EXITED for local_rank, slot in self._slots.items()
            if not (slot.process.is_alive() and slot.link is not None and not slot.link.lost)
        }
        if probe:
            alive = [local_rank for local_rank in self._slots if local_rank not in reasons]
            budget = self.cfg.stack_capture_budget or 0.0
            answered = self.ask(alive, messages.Ping(), PING_TIMEOUT + budget)
            reasons.update((local_rank, UNRESPONSIVE) for local_rank in alive if local_rank not in answered)
        replaced = []
        for local_rank, reason in sorted(reasons.items()):
            slot = self._slots[local_rank]
            if slot.process.is_alive():
                slot.process.kill()  # SIGKILL also ends a stopped process
            slot.process.join(STOP_TIMEOUT)
            replaced.append(Replaced(local_rank, slot.process.exitcode, reason, slot.process.pid))
            if slot.link is not None:
                slot.link.close()
        if replaced:
            self._start_ranks([r.local_rank for r in replaced])
        return replaced

    def ask(self, local_ranks: Iterable[int], message: messages.Message,
            timeout: float) -> dict[int, messages.Message]:
        """Send ``message`` to the monitors of ``local_ranks`` at once; collect their answers.

        Returns:
            Local rank -> answer (of the class :data:`REPLIES` names), for the monitors that
            answered in time.
        """
        reply_type = REPLIES[type(message)]
        answers = self.ask_each({local_rank: [message] for local_rank in local_ranks}, timeout)
        return {local_rank: replies[reply_type] for local_rank, replies in answers.items() if reply_type in replies}

    def ask_each(self, questions: dict[int, list[messages.Message]], timeout: float,
                 until: Callable[[dict[int, dict[type[messages.Message], messages.Message]]], bool] | None = None,
                 poll_interval: float | None = None) -> dict[int, dict[type[messages.Message], messages.Message]]:
        """Send each monitor its questions (in order), all monitors at once; collect the answers.

        A monitor answers its questions in order; other messages that arrive meanwhile stay
        for :meth:`poll_events`.

        Args:
            questions: Local rank -> requests (:class:`~ft_core.wire.messages.Ping`,
                :class:`~ft_core.wire.messages.ProgressQuery`,
                :class:`~ft_core.wire.messages.CaptureStacks`).
            timeout: Seconds to wait for all answers in total.
            until: Stop waiting as soon as it returns True for the answers so far (checked after
                each wake-up).
            poll_interval: Wake up at least this often (for ``until`` to look at something else).

        Returns:
            Local rank -> reply class -> answer, for the answers that arrived in time.
        """
        waiting: dict[int, tuple[MonitorLink, set[type[messages.Message]]]] = {}
        for local_rank, asked in questions.items():
            slot = self._slots.get(local_rank)
            if slot is None or slot.link is None or slot.link.lost or not asked:
                continue
            if all(slot.link.send(message) for message in asked):
                waiting[local_rank] = (slot.link, {REPLIES[type(m)] for m in asked})
        answers: dict[int, dict[type[messages.Message], messages.Message]] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            for local_rank, (link, expected) in list(waiting.items()):
                for reply_type in list(expected):
                    answer = link.take_message(reply_type)
                    if answer is not None:
                        answers.setdefault(local_rank, {})[reply_type] = answer
                        expected.discard(reply_type)
                if not expected or link.lost:
                    del waiting[local_rank]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0 or (until is not None and until(answers)):
                break
            if poll_interval is not None:
                remaining = min(remaining, poll_interval)
            processes.wait_for_any([link.fileno() for link, _ in waiting.values()], remaining)
        return answers

    def worker_started(self, local_rank: int, pid: int, cycle: int, rank: int | None) -> None:
        slot = self._slots.get(local_rank)
        if slot is not None and slot.link is not None:
            slot.link.worker_started(pid, cycle, rank)

    def poll_events(self) -> list[tuple[int, messages.Message]]:
        """Typed messages from all monitors, without blocking (``rank_hang``, ``rank_escalated``,
        ``rank_connected``...); includes a :class:`~ft_core.wire.messages.MonitorLost` for a
        link that broke."""
        events: list[tuple[int, messages.Message]] = []
        for local_rank, slot in sorted(self._slots.items()):
            if slot.link is None:
                continue
            was_lost = slot.link.lost
            for event in slot.link.poll_messages():
                events.append((local_rank, event))
            if slot.link.lost and not was_lost:
                slot.process.join(0.2)
                events.append((local_rank, messages.MonitorLost(exit_code=slot.process.exitcode,
                                                                monitor_pid=slot.process.pid)))
        return events

    def filenos(self) -> list[int]:
        """Descriptors that become readable when a monitor has something to report."""
        return [slot.link.fileno() for slot in self._slots.values() if slot.link is not None and not slot.link.lost]

    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self._slots.values()]

    def stop(self) -> None:
        """Say goodbye to every monitor and wait for them to exit (kill stragglers)."""
        for slot in self._slots.values():
            if slot.link is not None:
                slot.link.close()
        for slot in self._slots.values():
            slot.process.join(STOP_TIMEOUT)
            if slot.process.is_alive():
                logger.warning("monitor for local rank %s did not exit; killing it", slot.local_rank)
                slot.process.kill()
                slot.process.join(STOP_TIMEOUT)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(slot.socket_path)
        self._slots.clear()
