"""The node's rank monitors: one per local rank, started once, replaced when one dies."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from ft_core.config import FaultToleranceConfig
from ft_core.monitor import MonitorProcess, RankMonitorServer
from ft_core.monitor_link import MonitorLink

logger = logging.getLogger(__name__)

STOP_TIMEOUT = 5.0


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
    """

    def __init__(self, cfg: FaultToleranceConfig, run_dir: str, local_world_size: int) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.local_world_size = local_world_size
        self._slots: dict[int, _Slot] = {}

    def socket_path(self, local_rank: int) -> str:
        return os.path.join(self.run_dir, f"r{local_rank}.sock")

    def start(self) -> None:
        """Start every monitor (their interpreters start in parallel) and attach to each."""
        self._start_ranks(range(self.local_world_size))

    def _start_ranks(self, local_ranks: Any) -> None:
        spawned = {}
        try:
            for local_rank in local_ranks:
                spawned[local_rank] = MonitorProcess.spawn(
                    self.cfg, self.socket_path(local_rank), is_restarter_logger=local_rank == 0,
                    extra_args=["--name", f"local_rank {local_rank}", "--cleanup-dir", self.run_dir],
                )
            for local_rank, process in spawned.items():
                process.wait_ready(RankMonitorServer.RANK_MONITOR_INIT_TIMEOUT)
                self._slots[local_rank] = _Slot(local_rank, process.socket_path, process, MonitorLink(process.socket_path))
        except BaseException:
            for process in spawned.values():
                process.kill()
                process.join(STOP_TIMEOUT)
            raise

    def replace_dead(self) -> list[tuple[int, int | None]]:
        """Restart monitors that died or whose link broke.

        Returns:
            ``(local_rank, exit code of the dead monitor)`` for each one replaced.
        """
        dead = []
        for local_rank, slot in sorted(self._slots.items()):
            if slot.process.is_alive() and slot.link is not None and not slot.link.lost:
                continue
            if slot.process.is_alive():
                slot.process.kill()
            slot.process.join(STOP_TIMEOUT)
            dead.append((local_rank, slot.process.exitcode))
            if slot.link is not None:
                slot.link.close()
        if dead:
            self._start_ranks([local_rank for local_rank, _ in dead])
        return dead

    def worker_started(self, local_rank: int, pid: int, cycle: int, rank: int | None) -> None:
        slot = self._slots.get(local_rank)
        if slot is not None and slot.link is not None:
            slot.link.worker_started(pid, cycle, rank)

    def poll_events(self) -> list[tuple[int, dict[str, Any]]]:
        """Events from all monitors, without blocking; includes ``monitor_lost`` pseudo-events."""
        events = []
        for local_rank, slot in sorted(self._slots.items()):
            if slot.link is None:
                continue
            was_lost = slot.link.lost
            for event in slot.link.poll_events():
                events.append((local_rank, event))
            if slot.link.lost and not was_lost:
                slot.process.join(0.2)
                events.append((local_rank, {"type": "monitor_lost", "exit_code": slot.process.exitcode,
                                            "monitor_pid": slot.process.pid}))
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
