"""Shared helpers for the benchmark scripts."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    """Median, min, max and count of a sample."""
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "n": len(ordered),
    }


def proc_memory_kb(pid: int) -> dict[str, int]:
    """RSS, PSS and USS (private clean + dirty) of a process, in kB, from smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as stream:
        for line in stream:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {
        "rss_kb": fields.get("Rss", 0),
        "pss_kb": fields.get("Pss", 0),
        "uss_kb": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds consumed by a process so far."""
    with open(f"/proc/{pid}/stat") as stream:
        fields = stream.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of all live threads of a process (``/proc/<pid>/task/*/schedstat``).

    Finer than ``/proc/<pid>/stat``'s clock ticks (10 ms), which round a nearly idle process to
    zero; threads that already exited are not counted.
    """
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stream:
                total += int(stream.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphans of our descendants re-parent to this process (Linux), so none escapes.

    torchrun starts each worker in a session of its own: killing a launcher's process group
    does not reach them, and a launcher killed at a time limit would leave them running.
    """
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc``), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stream:
                ppid = int(stream.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants(timeout: float = 10.0) -> list[int]:
    """SIGKILL whatever this process's runs left behind (its descendants) and reap them.

    Call it only when no child is expected to be alive. Returns the pids that were killed.
    """
    killed = descendants(os.getpid())
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no children left
        if pid == 0:
            time.sleep(0.05)
    return killed


def emit(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        json.dump(result, sys.stdout, indent=2)
        print()


class ProgressRecorder:
    """Rank 0's progress lines of a goodput training script, written unbuffered so that a kill
    loses nothing written (the other ranks write nothing)."""

    def __init__(self, path: Path, rank: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if rank == 0 else None

    def line(self, *fields: object) -> None:
        if self.fd is not None:
            os.write(self.fd, (" ".join(str(f) for f in fields) + "\n").encode())
