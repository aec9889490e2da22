"""Process facts from ``/proc`` (Linux): state, parent, process group, session."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` we use."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    flags: int = 0
    """The kernel's ``PF_*`` flags (``PF_EXITING``: the process is exiting)."""

    @property
    def alive(self) -> bool:
        """Not a zombie (exited but not reaped) and not dead."""
        return self.state not in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat`` parsed, or None if the process is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            raw = stream.read()
    except OSError:
        return None
    # The fields follow the parenthesised command name, which may itself contain ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        # state ppid pgrp session tty_nr tpgid flags
        return ProcStat(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[6]))
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    stat = read_stat(pid)
    return stat is not None and stat.alive


def parent_pid(pid: int) -> int | None:
    """Parent pid of ``pid`` (None if it is gone)."""
    stat = read_stat(pid)
    return None if stat is None else stat.ppid


def list_processes() -> list[ProcStat]:
    """A snapshot of every process on the host."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(ValueError):
                stat = read_stat(int(entry))
                if stat is not None:
                    found.append(stat)
    return found
