"""The launcher's event log: one JSON record per cycle, failure, request and result.

Every failure also produces exactly one human-readable line on stderr. Every record carries the
launcher's run id (``--rdzv-id``, or the random one). Records are appended with a single
``write`` on an ``O_APPEND`` file under an exclusive ``lockf`` lock (which NFS honours, where
``O_APPEND`` alone is not atomic), so the launchers of several nodes and of successive attempts
(``scripts/autoresume.sh``) share one file; a line left incomplete by a killed launcher is
closed before the next record. At exit the launcher prints a summary built from the same
records. ``ft_report`` (:mod:`launcher.events.report`) reads the file back.

The lock is not taken on the log, which others may read (and a reader can take a shared
``lockf`` lock, which would block every writer), but on ``<log>.lock``: a file of this user,
0600, so that no other user can open it, let alone lock it. Neither file is opened through a
symbolic link, and neither may belong to another user (a usage error at the start). A
writer waits at most :data:`LOCK_WAIT_S` for the lock (only our own writers hold it, each for
one write), then writes without it and says so: no record, not even a forced stop's, can hang.

Every record is one of the typed kinds of :mod:`launcher.events.records`, and :meth:`EventLog.record_event`
is the one way to write one (``record_event(CycleStart(cycle=0, ...))``): a field the kind does
not have is an error where the record is built.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import sys
import time
from typing import Any, TextIO, TypeVar

from ft_core.monitor.deadlines import HangKind
from launcher.decision.culprit import COLLATERAL, LOST, ROOT
from launcher.decision.failures import KIND_EXIT, KIND_HANG, KIND_SIGNAL, FailureRecord
from launcher.events import records
from launcher.events.records import CycleStart, EventRecord, Failure, RankEscalated, Result, Summary
from launcher.exit_codes import LauncherUsageError

logger = logging.getLogger(__name__)
R = TypeVar("R", bound=EventRecord)

LOCK_WAIT_S = 5.0
"""The longest a record waits for the log's lock before it is written without it."""
LOCK_SUFFIX = ".lock"
"""The lock file is the log's path with this appended."""
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC

class EventLog:
    """Writes event records to a JSON-lines file (optional) and failure lines to stderr.

    Args:
        path: File to append to; ``None`` keeps records in memory only. ``{node}`` in the
            path is replaced by the host name. Its lock file is the same path with
            :data:`LOCK_SUFFIX`.
        node: Host name recorded in every event.
        stream: Where failure lines and the summary go.
        run_id: The launcher's run id, recorded in every event (set it before the first record).

    Raises:
        LauncherUsageError: The log or its lock file is a symbolic link, another user's file, or not a
            regular file, or the log cannot be created (:mod:`launcher.options`' error: ft_launcher
            exits with a usage error).
        OSError: The lock file cannot be opened or created.
    """

    def __init__(self, path: str | None, node: str | None = None, stream: TextIO | None = None,
                 run_id: str | None = None):
        self.node = node or socket.gethostname()
        self.path = path.replace("{node}", self.node) if path else None
        self.run_id = run_id
        self._stream = stream or sys.stderr
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self.history: list[EventRecord] = []
        """The records written so far, typed."""
        self.records: list[dict[str, Any]] = []
        """The same as written (JSON objects)."""
        if self.path:
            directory = os.path.dirname(os.path.abspath(self.path))
            try:
                os.makedirs(directory, exist_ok=True)
                self._fd = _open_own(self.path, os.O_RDWR | os.O_APPEND, 0o644, "event log")
            except OSError as err:
                # the up-front check trusts access(2), which lets root "write" where nothing can be
                # made (/proc, a read-only mount): what the kernel says here is the answer
                raise _unfit(f"the event log {self.path} cannot be created: {err.strerror or err} "
                             f"({err.filename or directory}); choose another --ft-event-log") from None
            try:
                self._lock_fd = _open_own(self.path + LOCK_SUFFIX, os.O_RDWR, 0o600, "event log's lock file")
                if stat.S_IMODE(os.fstat(self._lock_fd).st_mode) != 0o600:
                    os.fchmod(self._lock_fd, 0o600)  # ours, but others could have opened it: narrow it
            except BaseException:
                self.close()
                raise

    def record_event(self, record: R) -> R:
        """Append ``record`` with its envelope filled in (time, node, pid, run id: those it does
        not set itself) and return it as written."""
        now = time.time()
        envelope = {
            "time": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "ts": round(now, 4),
            "node": self.node,
            "pid": os.getpid(),
            "run_id": self.run_id,
        }
        record = dataclasses.replace(record, **{k: v for k, v in envelope.items() if getattr(record, k) is None})
        entry = record.to_wire()
        self.history.append(record)
        self.records.append(entry)
        if self._fd is not None:
            line = (json.dumps(entry, default=str, separators=(",", ":")) + "\n").encode()
            try:
                self._append(line)
            except OSError as err:
                logger.warning("cannot write to event log %s: %s", self.path, err)
        return record

    def _append(self, line: bytes) -> None:
        """One ``write`` under the log's lock (or after a bounded wait for it), after closing a
        line a killed writer left open."""
        assert self._fd is not None
        locked = self._lock()
        try:
            size = os.fstat(self._fd).st_size
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            os.write(self._fd, line)
        finally:
            if locked:
                assert self._lock_fd is not None
                fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)

    def _lock(self) -> bool:
        """Take the lock file's ``lockf`` lock, waiting at most :data:`LOCK_WAIT_S`; whether it is held.

        Polled rather than a blocking call: a blocking ``lockf`` has no timeout, and a record
        written from a signal handler (a forced stop) must not wait without end.
        """
        assert self._lock_fd is not None
        deadline = time.monotonic() + LOCK_WAIT_S
        pause = 0.001
        while True:
            try:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    logger.warning("cannot lock %s%s (%s); writing %s without the lock",
                                   self.path, LOCK_SUFFIX, err, self.path)
                    return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.warning("could not lock %s%s within %g s (another process of this user holds it); "
                               "writing %s without the lock", self.path, LOCK_SUFFIX, LOCK_WAIT_S, self.path)
                return False
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.05)

    def failure(self, failure: FailureRecord, decision: str) -> None:
        """Record a worker failure and print its one stderr line.

        The root's line says what it did and who waited for it; a collateral rank's line names
        the rank it was waiting for.
        """
        rank = "?" if failure.rank is None else failure.rank
        who = (f"[ft_launcher] cycle {failure.cycle}: rank {rank} (local rank {failure.local_rank}, "
               f"pid {failure.pid}) on node {self.node}")
        if failure.role == ROOT:
            explained = f"; {failure.explanation}" if failure.explanation else ""
            self._print(f"{who} failed: {failure.cause}{explained}; {decision}")
        else:
            self._print(f"{who} {failure.explanation or 'stopped'} (collateral: {failure.cause}); {decision}")
        hang, progress, stacks, root = failure.hang, failure.progress, failure.stacks, failure.root
        self.record_event(Failure(
            cycle=failure.cycle,
            rank=failure.rank,
            local_rank=failure.local_rank,
            worker_pid=failure.pid,
            cause=failure.cause,
            cause_kind=failure.kind,
            role=failure.role,
            explanation=failure.explanation,
            detected_at=failure.detected_at,
            decision=decision,
            fingerprint=failure.fingerprint.digest if failure.fingerprint is not None else None,
            fingerprint_text=failure.fingerprint.describe() if failure.fingerprint is not None else None,
            root_step=failure.root_step,
            exit_code=failure.exit_code,
            error=failure.error,
            hang_kind=_hang_kind_text(hang.kind) if hang is not None else None,
            section=hang.section if hang is not None else None,
            elapsed=hang.elapsed if hang is not None else None,
            timeout=hang.timeout if hang is not None else None,
            signal=hang.signal if hang is not None else None,
            step=progress.step if progress is not None else None,
            open_section=progress.open_section if progress is not None else None,
            last_progress_at=progress.last_progress_at if progress is not None else None,
            stack_file=stacks.stack_file if stacks is not None else None,
            stack_frames=list(stacks.stack_frames) if stacks is not None else None,
            stack_error=stacks.stack_error if stacks is not None else None,
            user_frame=failure.user_frame,
            root_rank=root.rank if root is not None else None,
            root_node=root.node if root is not None else None,
            root_group_rank=root.group_rank if root is not None else None,
            root_cause=root.cause if root is not None else None,
            root_outcome=root.outcome if root is not None else None,
            lost_nodes=([{"group_rank": n.group_rank, "node": n.host} for n in root.lost_nodes]
                        if root is not None and root.lost_nodes is not None else None),
        ))

    def outcome_line(self, cycle: int, cause: str, decision: str) -> None:
        """Print the stderr line for a run stopped by a workload control request (no failure)."""
        self._print(f"[ft_launcher] cycle {cycle}: {cause or 'workload control request'}; {decision}")

    def summary(self) -> str:
        """Build, print and record a short summary of the run from the records so far.

        Failures are counted as incidents: one per failed cycle of this node, named by its root
        (a freeze and the ranks that stopped waiting for it are one incident). A run without
        failures shows no failure statistics; the time from failure detection to restarted
        workers only when a cycle started after a failure (none with ``--max-restarts 0``).
        """
        cycles = [r for r in self.history if isinstance(r, CycleStart)]
        failures = [r for r in self.history if isinstance(r, Failure)]
        incidents: dict[Any, str] = {}
        for record in failures:
            if record.effective_role == ROOT or record.cycle not in incidents:
                incidents[record.cycle] = _incident_kind(record)
        collateral = sum(1 for r in failures if r.effective_role == COLLATERAL)
        escalated = sum(1 for r in self.history if isinstance(r, RankEscalated))
        by_kind = collections.Counter(incidents.values())
        # Only cycles that followed a failure count: with --max-restarts 0 (or a stop) nothing restarted.
        restarted = [r for r in cycles if r.since_failure_s is not None]
        lost = sum(r.since_failure_s or 0.0 for r in restarted)
        result = next((r for r in reversed(self.history) if isinstance(r, Result)), None)
        parts = [f"{len(cycles)} {'cycle' if len(cycles) == 1 else 'cycles'}"]
        if incidents:
            kinds = ", ".join(f"{count} × {kind}" for kind, count in sorted(by_kind.items(), key=lambda kv: -kv[1]))
            parts.append(f"{len(incidents)} {'incident' if len(incidents) == 1 else 'incidents'}: {kinds}")
            if collateral:
                parts.append(f"{collateral} {'rank' if collateral == 1 else 'ranks'} stopped as collateral")
            if escalated:
                parts.append(f"{escalated} hung {'rank' if escalated == 1 else 'ranks'} needed SIGKILL")
            if restarted:
                parts.append(f"{lost:.1f} s from failure detection to restarted workers")
        if result is not None:
            parts.append(f"result: {result.outcome} (exit code {result.exit_code})")
        text = "[ft_launcher] summary: " + "; ".join(parts)
        self._print(text)
        if self.path:
            self._print(f"[ft_launcher] event log: {self.path}")
        self.record_event(Summary(cycles=len(cycles), incidents=len(incidents), incidents_by_kind=dict(by_kind),
                                  collateral=collateral, escalated=escalated, failures=len(incidents),
                                  failures_by_kind=dict(by_kind), restart_seconds=round(lost, 3)))
        return text

    def last_cycle_root_nodes(self) -> list[str]:
        """The nodes this launcher's records name as the root of the last started cycle's failure
        (see :func:`launcher.events.records.last_cycle_root_nodes`).

        Returns:
            Host names in the order first named; empty if the last cycle recorded no failure.
        """
        return records.last_cycle_root_nodes(self.history)

    def lost_root_nodes(self) -> list[str]:
        """The nodes this launcher's records name as a lost root in any cycle
        (see :func:`launcher.events.records.lost_root_nodes`)."""
        return records.lost_root_nodes(self.history)

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._lock_fd = None

    def _print(self, text: str) -> None:
        # One write call: print() writes the newline separately, and with stderr write-through a
        # worker's line sharing the launcher's stderr can land between the two.
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text + "\n")
            self._stream.flush()


def _open_own(path: str, flags: int, mode: int, what: str) -> int:
    """Open (creating it if missing, exclusively) this user's regular file ``path``, never
    through a symbolic link.

    Raises:
        LauncherUsageError: A symbolic link, another user's file, or not a regular file (ft_launcher
            exits with a usage error, before anything of the run started).
        OSError: As ``os.open``.
    """
    for _ in range(10):  # bounded: each round loses only to a file made or removed meanwhile
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
        except FileExistsError:
            pass
        try:
            fd = os.open(path, flags | _NOFOLLOW)
        except FileNotFoundError:
            continue
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _unfit(f"{what} {path} is a symbolic link: ft_launcher follows none there "
                                    "(another user could have made it point anywhere); remove it or choose "
                                    "another --ft-event-log") from None
            raise
        info = os.fstat(fd)
        if info.st_uid == os.getuid() and stat.S_ISREG(info.st_mode):
            return fd
        os.close(fd)
        why = (f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})" if info.st_uid != os.getuid()
               else "is not a regular file")
        raise _unfit(f"{what} {path} {why}: another user could block or fool the launcher's records "
                            "through it; remove it or choose another --ft-event-log")
    raise OSError(errno.EAGAIN, f"{path} keeps appearing and disappearing")


def _unfit(message: str) -> Exception:
    """The error for an event log another user could block or fool us through."""
    return LauncherUsageError(message)


def _hang_kind_text(kind: HangKind | str) -> str:
    """A hang kind as the record holds it: a :class:`HangKind` as its ``.value`` string."""
    return kind.value if isinstance(kind, HangKind) else kind


def _incident_kind(record: Failure) -> str:
    """How the summary names an incident, from its root's record (or a collateral one)."""
    if record.effective_role != ROOT:
        if record.root_outcome == LOST:  # a node that sent no view (rule 4 of launcher.decision.culprit)
            return "lost node"
        return "root on another node" if record.root_node is not None else "root unknown"
    if record.cause_kind == KIND_HANG:
        hang = record.hang_kind or "hang"
        return f"hang ({hang}{' ' + repr(record.section) if record.section else ''})"
    if record.cause_kind in (KIND_SIGNAL, KIND_EXIT):
        return f"crash ({record.cause})"
    return record.cause_kind
