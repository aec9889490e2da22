"""Process bookkeeping for the launcher: who exited first, and what workers left behind."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Iterable

from ft_core.procfs import ProcStat, list_processes

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
REAP_TIMEOUT = 5.0


def set_child_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init (Linux).

    Workers' children that outlive them (data-loader workers, daemons) then stay reachable and
    can be cleaned up. Returns True on success.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return False


def peek_exit_status(pid: int) -> int | None:
    """Exit status of child ``pid`` if it has exited, without reaping it (its owner still can).

    Returns:
        The exit code, ``-N`` if it was killed by signal N, or None while it runs and once it
        was reaped (then its owner has seen its status already).
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def terminate_groups(pids: list[int], pidfds: dict[int, int], grace: float) -> None:
    """SIGTERM each pid's process group, SIGKILL whatever is left after ``grace`` seconds.

    Waits on the pidfds (bounded), so it returns as soon as all have exited.
    """
    import selectors

    def signal_all(sig: signal.Signals) -> list[int]:
        alive = [pid for pid in pids if peek_exit_status(pid) is None and _exists(pid)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        return alive

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, REAP_TIMEOUT)):
        alive = signal_all(sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            with selectors.DefaultSelector() as selector:
                for pid in alive:
                    if pid in pidfds:
                        selector.register(pidfds[pid], selectors.EVENT_READ)
                if not selector.get_map():
                    break
                selector.select(max(0.0, deadline - time.monotonic()))
            alive = [pid for pid in alive if peek_exit_status(pid) is None and _exists(pid)]
        if not alive:
            return


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(root: int, procs: Iterable[ProcStat]) -> set[int]:
    """Pids of every live descendant of ``root`` in the snapshot."""
    children: dict[int, list[int]] = {}
    for info in procs:
        children.setdefault(info.ppid, []).append(info.pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def kill_leftovers(worker_pids: list[int], keep: set[int], keep_alone: set[int] | None = None) -> set[int]:
    """SIGKILL what workers left behind, and reap the ones re-parented to us.

    Leftovers are processes in a worker's session (workers start their own) and descendants of
    this launcher, except the processes in ``keep`` (the monitors) with their descendants and
    those in ``keep_alone`` (the warm template, whose children are workers) without them.

    Returns:
        The pids that were killed.
    """
    procs = list_processes()
    me = os.getpid()
    protected = set(keep) | set(keep_alone or ())
    for pid in keep:
        protected |= descendants(pid, procs)
    sessions = set(worker_pids)
    victims = {
        info.pid for info in procs
        if info.alive and info.pid != me and info.pid not in protected
        and info.sid in sessions
    }
    victims |= {pid for pid in descendants(me, procs) if pid not in protected}
    live = {info.pid for info in procs if info.alive}
    victims &= live
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _reap_orphans(victims | {info.pid for info in procs if info.ppid == me and info.state == "Z"}, protected)
    return victims


def _reap_orphans(pids: set[int], protected: set[int]) -> None:
    """``waitpid`` the given pids that are our children (never all children: that would steal
    exit statuses from ``subprocess.Popen`` objects)."""
    deadline = time.monotonic() + REAP_TIMEOUT
    for pid in pids - protected:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)
