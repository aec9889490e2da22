"""Process bookkeeping for the launcher: who exited first, stopping workers, what they left behind."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import selectors
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ft_core.wire.env import FT_LAUNCHER_RUN_ENV_VAR
from ft_core.wire.procfs import ProcStat, list_processes, read_stat

logger = logging.getLogger(__name__)

REAP_TIMEOUT = 5.0
POLL_INTERVAL = 0.05
QUEUED_SIGNAL_FALLBACK = 30.0
"""A signal queued for a rank goes to its new worker when that connects to its monitor, or this
many seconds after the worker started if it never does."""


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


STARTING, READY, STOPPING = "starting", "ready", "stopping"
"""A worker's state for signal routing: started, connected to its monitor, being stopped."""


@dataclass
class _Worker:
    local_rank: int
    pid: int  # what torch started: the worker, or its stand-in (trampoline) under warm restarts
    pidfd: int | None
    worker_pid: int  # the worker itself (== pid for a cold start)
    worker_pidfd: int | None = None
    state: str = STARTING
    started_at: float = 0.0
    stop_signal: int | None = None


class WorkerProcesses:
    """The current cycle's workers: pids, pidfds, who is the real worker, and signals for them.

    torch knows each worker by the process it started; under warm restarts that is a stand-in
    (:mod:`launcher.warm.trampoline`) and the worker is a child of the warm template.
    :meth:`resolved` records the workers' own pids: logs, events and signals use those.

    Signals the launcher passes on (:meth:`route`) go to each live worker's process group, or
    wait in a per-rank queue when that rank has no live worker (between cycles, or while its
    worker is being stopped). Queued signals go to the rank's next worker once it connected to
    its monitor (:meth:`connected`; Python's default action for SIGUSR1 would kill a worker that
    has not installed its handlers yet), or :data:`QUEUED_SIGNAL_FALLBACK` seconds after it
    started if it never does (:meth:`overdue`).

    Thread-safe: the launcher's signal thread routes signals while the main thread starts and
    stops workers. Signal handlers never call into it (they would deadlock on its lock).

    Args:
        local_world_size: The node's number of workers (ranks for queued signals).
    """

    def __init__(self, local_world_size: int = 0) -> None:
        self._lock = threading.RLock()
        self._workers: dict[int, _Worker] = {}  # by local rank
        self._queued: dict[int, list[signal.Signals]] = {rank: [] for rank in range(local_world_size)}

    @property
    def pids(self) -> list[int]:
        """The pids torch started (stand-ins under warm restarts)."""
        return [w.pid for w in self._workers.values()]

    @property
    def worker_pids(self) -> dict[int, int]:
        """Local rank -> the worker's own pid."""
        return {rank: w.worker_pid for rank, w in self._workers.items()}

    @property
    def all_pids(self) -> list[int]:
        """Every pid of the workers: as torch started them and, under warm restarts, the workers' own."""
        return sorted({*self.pids, *self.worker_pids.values()})

    def worker_pid(self, pid: int) -> int:
        """The worker's own pid for a pid torch started (itself for a cold start)."""
        for w in list(self._workers.values()):
            if w.pid == pid:
                return w.worker_pid
        return pid

    def started(self, pids: dict[int, int]) -> None:
        """A new cycle's workers (local rank -> pid torch started) replace the previous ones."""
        with self._lock:
            self.close()
            now = time.monotonic()
            self._workers = {}
            for local_rank, pid in pids.items():
                pidfd = None
                with contextlib.suppress(OSError):
                    pidfd = os.pidfd_open(pid)
                self._workers[local_rank] = _Worker(local_rank, pid, pidfd, pid, started_at=now)
                self._queued.setdefault(local_rank, [])

    def resolved(self, worker_pids: dict[int, int]) -> None:
        """The workers' own pids (local rank -> pid), for stand-ins that were resolved."""
        with self._lock:
            for local_rank, pid in worker_pids.items():
                worker = self._workers.get(local_rank)
                if worker is None or pid == worker.pid:
                    continue
                worker.worker_pid = pid
                with contextlib.suppress(OSError):
                    worker.worker_pidfd = os.pidfd_open(pid)

    def fds(self) -> list[int]:
        """Descriptors that become readable when a worker exits."""
        return [w.pidfd for w in self._workers.values() if w.pidfd is not None]

    def exit_statuses(self) -> dict[int, int | None]:
        """pid torch started -> :func:`peek_exit_status` (None while running), without reaping."""
        return {w.pid: peek_exit_status(w.pid) for w in list(self._workers.values())}

    # ------------------------------------------------------------------ signals for the workers

    def route(self, sig: signal.Signals, job_wide: bool,
              received_at: float | None = None) -> tuple[list[int], list[int]]:
        """Pass ``sig`` on to the workers that need it from the launcher; queue it for the rest.

        Args:
            sig: A signal the launcher received.
            job_wide: The workers' processes got ``sig`` themselves (see launcher.node.signals).
            received_at: When the launcher received it (monotonic; None: now). A worker started
                since was not there for it: it gets it once connected to its monitor, as a
                restart's next worker does, even when it was sent to the whole job.

        Returns:
            The worker pids signalled now, and the local ranks it was queued for.
        """
        sent, queued = [], []
        with self._lock:
            for local_rank, queue in sorted(self._queued.items()):
                worker = self._workers.get(local_rank)
                if worker is not None and worker.state != STOPPING and self._alive(worker):
                    late = received_at is not None and worker.started_at > received_at
                    if late and worker.state != READY:  # started while the launcher decided
                        queue.append(sig)
                        queued.append(local_rank)
                        continue
                    # A live worker got a job-wide signal itself; one for the launcher alone it
                    # gets now (as from torchrun, even while it starts up).
                    if (late or not job_wide) and self._signal_worker(worker, sig):
                        sent.append(worker.worker_pid)
                    continue
                queue.append(sig)
                queued.append(local_rank)
        return sent, queued

    def connected(self, local_rank: int) -> tuple[int | None, list[signal.Signals]]:
        """The rank's worker connected to its monitor: deliver what was queued for it.

        Returns:
            The worker's pid and the signals delivered to it now.
        """
        with self._lock:
            worker = self._workers.get(local_rank)
            if worker is None or worker.state != STARTING:
                return None, []
            worker.state = READY
            return worker.worker_pid, self._deliver_queued(worker)

    def overdue(self, after: float, now: float | None = None) -> list[tuple[int, list[signal.Signals]]]:
        """Deliver queued signals to workers started ``after`` seconds ago that never connected.

        Returns:
            ``(worker pid, signals)`` for each worker that got some now.
        """
        now = time.monotonic() if now is None else now
        delivered = []
        with self._lock:
            for worker in self._workers.values():
                if (worker.state == STARTING and self._queued.get(worker.local_rank)
                        and now - worker.started_at >= after):
                    worker.state = READY
                    delivered.append((worker.worker_pid, self._deliver_queued(worker)))
        return delivered

    def discard_queued(self) -> dict[int, list[str]]:
        """Drop every queued signal (the run ends); returns them by local rank, for the log."""
        with self._lock:
            dropped = {rank: [s.name for s in queue] for rank, queue in self._queued.items() if queue}
            for queue in self._queued.values():
                queue.clear()
        return dropped

    def _deliver_queued(self, worker: _Worker) -> list[signal.Signals]:
        queue = self._queued.get(worker.local_rank, [])
        delivered = [sig for sig in queue if self._signal_worker(worker, sig)]
        queue.clear()
        return delivered

    def _alive(self, worker: _Worker) -> bool:
        if worker.worker_pidfd is not None:
            return not _has_exited(worker.worker_pidfd)
        return running_child(worker.pid)

    def _signal_worker(self, worker: _Worker, sig: int) -> bool:
        """``sig`` to the worker's process group, never to an exited (possibly reused) pid."""
        if worker.worker_pidfd is not None:
            # Not our child: while its pidfd is not readable it has not exited, so its pid (and
            # group) cannot have been reused.
            if _has_exited(worker.worker_pidfd):
                return False
            _signal_group(worker.worker_pid, sig)
            return True
        if running_child(worker.pid):
            _signal_group(worker.pid, sig)
            return True
        return False

    # ------------------------------------------------------------------ stopping

    def terminate(self, pids: list[int], grace: float, sig: signal.Signals = signal.SIGTERM,
                  already_signalled: bool = False) -> set[int]:
        """Stop some of the workers (by the pids torch started): ``sig`` to each worker's process
        group, SIGKILL after ``grace`` seconds (to the fraction), see :func:`terminate_groups`.

        Args:
            already_signalled: The workers got ``sig`` already (it was sent to the whole job):
                only wait for them, then SIGKILL. A worker this launcher is stopping with ``sig``
                already is not signalled twice either.

        Returns:
            The pids (as torch started them) that had to be SIGKILLed.
        """
        with self._lock:
            targets = [w for w in self._workers.values() if w.pid in pids]
            for worker in targets:
                first = not already_signalled and not (worker.state == STOPPING and worker.stop_signal == sig)
                worker.state, worker.stop_signal = STOPPING, sig
                if first:
                    self._signal_worker(worker, sig)
        pidfds = {w.pid: w.pidfd for w in targets if w.pidfd is not None}
        alive = _wait_for_exit([w.pid for w in targets], pidfds, grace)
        killed = {w.pid for w in targets if w.pid in alive}
        with self._lock:
            for worker in targets:
                if worker.pid in alive:
                    self._signal_worker(worker, signal.SIGKILL)
                    if worker.pid != worker.worker_pid and running_child(worker.pid):
                        _signal_group(worker.pid, signal.SIGKILL)
        if _wait_for_exit(list(alive), pidfds, REAP_TIMEOUT):
            logger.error("workers %s did not exit after SIGKILL (stuck in the kernel?)", sorted(alive))
        return killed

    def close(self) -> None:
        """Close the pidfds (the pids stay known, for what the workers left behind)."""
        with self._lock:
            for worker in self._workers.values():
                for fd in (worker.pidfd, worker.worker_pidfd):
                    if fd is not None:
                        os.close(fd)
                worker.pidfd = worker.worker_pidfd = None


def _has_exited(pidfd: int) -> bool:
    try:
        return bool(select.select([pidfd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def wait_for_any(fds: list[int], timeout: float) -> None:
    """Block until one of ``fds`` is readable or ``timeout`` seconds passed (closed fds ignored)."""
    with selectors.DefaultSelector() as selector:
        for fd in fds:
            with contextlib.suppress(ValueError, KeyError, OSError):
                selector.register(fd, selectors.EVENT_READ)
        if selector.get_map():
            selector.select(timeout)
        else:
            time.sleep(timeout)


def terminate_groups(pids: list[int], pidfds: dict[int, int], grace: float,
                     sig: signal.Signals = signal.SIGTERM) -> set[int]:
    """Send ``sig`` to each child's process group, SIGKILL whatever is left after ``grace`` seconds.

    Only children of this process that are still running are signalled (see
    :func:`running_child`), so an exited worker's pid is never signalled even if reused.

    ``grace`` is honoured to the fraction of a second: torch's own stop path takes whole
    seconds. Waits on the pidfds (bounded), so it returns as soon as all have exited; a pid
    without a pidfd is polled every :data:`POLL_INTERVAL`. A pid that does not lead a process
    group (a worker torch started without its own session) is signalled alone.

    Returns:
        The pids that had to be SIGKILLed.
    """
    for pid in pids:
        if running_child(pid):
            _signal_group(pid, sig)
    alive = _wait_for_exit(pids, pidfds, grace)
    for pid in alive:
        _signal_group(pid, signal.SIGKILL)
    _wait_for_exit(list(alive), pidfds, REAP_TIMEOUT)
    return alive


def _wait_for_exit(pids: list[int], pidfds: dict[int, int], timeout: float) -> set[int]:
    """Wait until the children ``pids`` exited or ``timeout`` passed; return those still running."""
    alive = [pid for pid in pids if running_child(pid)]
    deadline = time.monotonic() + timeout
    while alive and (remaining := deadline - time.monotonic()) > 0:
        watched = [pidfds[pid] for pid in alive if pid in pidfds]
        wait = remaining if len(watched) == len(alive) else min(remaining, POLL_INTERVAL)
        with selectors.DefaultSelector() as selector:
            for fd in watched:
                selector.register(fd, selectors.EVENT_READ)
            if watched:
                selector.select(wait)
            else:
                time.sleep(wait)
        alive = [pid for pid in alive if running_child(pid)]
    return set(alive)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # not a group leader: signal the process itself
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        pass


def running_child(pid: int) -> bool:
    """True while ``pid`` is a child of this process that has not exited.

    A child's pid cannot be reused before its owner reaps it, so signalling ``pid`` (or its
    group, which it leads) right after this returned True reaches that child.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # not our child, or already reaped
        return False


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


def kill_leftovers(worker_pids: list[int], keep: set[int], keep_alone: set[int] | None = None,
                   token: str | None = None) -> set[int]:
    """SIGKILL what workers left behind, and reap the ones re-parented to us.

    Leftovers are processes in a worker's session (workers start their own) and descendants of
    this launcher, except the processes in ``keep`` (the monitors) with their descendants and
    those in ``keep_alone`` (the warm template, whose children are workers; the run's
    :class:`launcher.node.sentinel.HelperPids`) without them.

    A candidate is killed only once a pidfd pins it and it is still ours (:func:`_kill_if_ours`):
    it carries the run token or descends from this launcher. A recorded session id alone proves
    nothing: the worker that led the session may have been reaped and its pid, now a session id
    again, taken by another user's process.

    Args:
        token: The run token (``FT_LAUNCHER_RUN``); by default this process's own.

    Returns:
        The pids that were killed.
    """
    procs = list_processes()
    me = os.getpid()
    token = os.environ.get(FT_LAUNCHER_RUN_ENV_VAR) if token is None else token
    needle = f"{FT_LAUNCHER_RUN_ENV_VAR}={token}".encode() if token else None
    protected = set(keep) | set(keep_alone or ())
    for pid in keep:
        protected |= descendants(pid, procs)
    sessions = set(worker_pids)
    candidates = {info.pid for info in procs
                  if info.alive and info.pid != me and info.pid not in protected and info.sid in sessions}
    candidates |= {pid for pid in descendants(me, procs) if pid not in protected}
    live = {info.pid for info in procs if info.alive}
    verdicts = {pid: _kill_if_ours(pid, me, needle) for pid in candidates & live}
    victims = {pid for pid, killed in verdicts.items() if killed}
    spared = sorted(pid for pid, killed in verdicts.items() if killed is False)
    if spared:
        logger.warning("not killing %s: in a recorded worker session, but not of this run (a reused pid?)", spared)
    _reap_orphans(victims | {info.pid for info in procs if info.ppid == me and info.state == "Z"}, protected)
    return victims


def _kill_if_ours(pid: int, me: int, needle: bytes | None) -> bool | None:
    """SIGKILL ``pid`` through a pidfd if it is a process of this run.

    The checks read ``/proc/<pid>`` after the pidfd was taken: if the pinned process was reaped
    meanwhile and its pid reused, the newcomer was checked, but the signal goes to the pinned
    process and fails (ESRCH); either way no process that is not ours is signalled.

    Returns:
        True if it was signalled, False if it is not ours, None if it is gone.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        if not (_descends_from(pid, me) or (needle is not None and _carries(pid, needle))):
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:  # exited meanwhile
        return None
    except OSError:  # not ours to signal (EPERM)
        return False
    finally:
        os.close(pidfd)


def _descends_from(pid: int, ancestor: int) -> bool:
    """``pid``'s parent chain, read now, leads to ``ancestor``."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        stat = read_stat(pid)
        if stat is None:
            return False
        if stat.ppid == ancestor:
            return True
        pid = stat.ppid
    return False


def _carries(pid: int, needle: bytes) -> bool:
    """``pid``'s environment holds ``needle`` (``NAME=value``); False if it is unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            return needle in stream.read().split(b"\0")
    except OSError:
        return False


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
