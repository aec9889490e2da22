"""The launcher's event log: one JSON record per cycle, failure, request and result.

Every failure also produces exactly one human-readable line on stderr. Records are appended
with a single ``write`` on an ``O_APPEND`` file, so several launchers may share one file on a
local filesystem. At exit the launcher prints a summary built from the same records.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

logger = logging.getLogger(__name__)


@dataclass
class FailureRecord:
    """Why one worker failed in one cycle.

    Attributes:
        cycle: Cycle index (0 = first start).
        rank: Global rank (``None`` if unknown).
        local_rank: Local rank on this node.
        pid: Worker process id.
        cause: Human-readable cause, e.g. ``hang: section 'step' open 12.3 s > timeout 10.0 s``,
            ``exit code 1`` or ``signal SIGSEGV``.
        kind: ``hang``, ``exit``, ``signal`` or ``terminated`` (stopped by us after another
            worker failed).
        detected_at: Wall-clock time of detection (epoch seconds).
        detail: Extra fields (hang kind, section, elapsed, timeout, exit code...).
    """

    cycle: int
    rank: int | None
    local_rank: int
    pid: int | None
    cause: str
    kind: str
    detected_at: float
    detail: dict[str, Any] = field(default_factory=dict)


class EventLog:
    """Writes event records to a JSON-lines file (optional) and failure lines to stderr.

    Args:
        path: File to append to; ``None`` keeps records in memory only. ``{node}`` in the
            path is replaced by the host name.
        node: Host name recorded in every event.
        stream: Where failure lines and the summary go.
    """

    def __init__(self, path: str | None, node: str | None = None, stream: TextIO | None = None):
        self.node = node or socket.gethostname()
        self.path = path.replace("{node}", self.node) if path else None
        self._stream = stream or sys.stderr
        self._fd: int | None = None
        self.records: list[dict[str, Any]] = []
        if self.path:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record and return it."""
        now = time.time()
        entry = {
            "event": event,
            "time": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "ts": round(now, 4),
            "node": self.node,
            "pid": os.getpid(),
            **fields,
        }
        self.records.append(entry)
        if self._fd is not None:
            line = (json.dumps(entry, default=str, separators=(",", ":")) + "\n").encode()
            try:
                os.write(self._fd, line)
            except OSError as err:
                logger.warning("cannot write to event log %s: %s", self.path, err)
        return entry

    def failure(self, failure: FailureRecord, decision: str) -> None:
        """Record a worker failure and print its one stderr line."""
        rank = "?" if failure.rank is None else failure.rank
        self._print(
            f"[ft_launcher] cycle {failure.cycle}: rank {rank} (local rank {failure.local_rank}, "
            f"pid {failure.pid}) on node {self.node} failed: {failure.cause}; {decision}"
        )
        self.record(
            "failure",
            cycle=failure.cycle,
            rank=failure.rank,
            local_rank=failure.local_rank,
            worker_pid=failure.pid,
            cause=failure.cause,
            cause_kind=failure.kind,
            detected_at=failure.detected_at,
            decision=decision,
            **failure.detail,
        )

    def summary(self) -> str:
        """Build, print and record a short summary of the run from the records so far."""
        cycles = [r for r in self.records if r["event"] == "cycle_start"]
        failures = [r for r in self.records if r["event"] == "failure" and r["cause_kind"] != "terminated"]
        by_kind = collections.Counter(_summary_kind(r) for r in failures)
        lost = sum(r.get("since_failure_s") or 0.0 for r in cycles)
        result = next((r for r in reversed(self.records) if r["event"] == "result"), None)
        parts = [
            f"{len(cycles)} cycle(s)",
            f"{len(failures)} failure(s)" + (
                " (" + ", ".join(f"{k}: {v}" for k, v in sorted(by_kind.items())) + ")" if by_kind else ""
            ),
            f"{lost:.1f} s from failure detection to restarted workers",
        ]
        if result is not None:
            parts.append(f"result: {result['outcome']} (exit code {result['exit_code']})")
        text = "[ft_launcher] summary: " + "; ".join(parts)
        self._print(text)
        if self.path:
            self._print(f"[ft_launcher] event log: {self.path}")
        self.record("summary", cycles=len(cycles), failures=len(failures), failures_by_kind=dict(by_kind),
                    restart_seconds=round(lost, 3))
        return text

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _print(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(text, file=self._stream, flush=True)


def _summary_kind(record: dict[str, Any]) -> str:
    if record["cause_kind"] == "hang":
        hang = record.get("hang_kind", "hang")
        return f"hang ({hang}{' ' + repr(record['section']) if record.get('section') else ''})"
    if record["cause_kind"] == "signal":
        return record["cause"]
    return record["cause_kind"]
