"""The run directory's files: ``state``, ``history.tsv``, ``node_history.tsv`` and ``excluded_nodes``.

``state`` and ``excluded_nodes`` are replaced atomically (a temporary file in the same
directory, then a rename), so a reader never sees half of one. ``history.tsv`` and
``node_history.tsv`` only grow, whole lines per write; after a requeue the script appends its
``history.tsv`` line itself, with shell builtins (see ``scripts/autoresume.sh``), from fields
this module formats.

Readers are forgiving: a corrupt or half-written line is skipped, never fatal, because the loop
must go on with what it can still read. What they read, and what is written, is only ever this
user's file, never reached through a symbolic link (:mod:`launcher.resume.own_files`): a file
another user planted is an error, not something to read or to write into.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from launcher.resume.own_files import ForeignFileError, open_own, read_own
from launcher.resume.policy import is_count, is_node_name
from launcher.resume.repeats import KINDS, NO_NODE, Event, is_fingerprint

logger = logging.getLogger(__name__)

HISTORY_COLUMNS = ("attempt", "job_id", "start", "end", "exit_code", "flag", "failures",
                   "decision")
HISTORY_HEADER = "\t".join(HISTORY_COLUMNS)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


def now() -> str:
    """The current local time as ``history.tsv`` records it."""
    return time.strftime(TIME_FORMAT)


def atomic_write(path: str, text: str) -> None:
    """Replace ``path`` with ``text``: readers see the old file or the new one, never a mix."""
    tmp = f"{path}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        # O_EXCL: never write through what is already at that name. In the run directory, which
        # only this user can write to, that is a file an earlier step with this pid left.
        fd = os.open(tmp, flags, 0o666)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------- state


@dataclass(frozen=True)
class State:
    """``RUN_DIR/state``: the loop's counters between attempts (and between jobs).

    Attributes:
        attempt: The number of the last attempt started.
        failures: Consecutive failed attempts.
        stalled: Consecutive failed attempts without progress.
        running: Whether an attempt is running (left set by a script that was killed).
        start: The running attempt's start time, or ``-``.
        job_id: The running attempt's job id (``local`` in local mode), or ``-``.
        progress: The newest mtime (ns) under ``--progress-path`` when the attempt started,
            or empty.
    """

    attempt: int = 0
    failures: int = 0
    stalled: int = 0
    running: bool = False
    start: str = "-"
    job_id: str = "-"
    progress: str = ""

    def ended(self, **changes: object) -> State:
        """This state with no attempt running, and ``changes`` applied."""
        return replace(self, running=False, start="-", job_id="-", progress="", **changes)


def parse_state(text: str) -> State:
    """Parse ``key=value`` lines; unknown keys and malformed values are ignored."""
    values: dict[str, object] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key in ("attempt", "failures", "stalled"):
            if is_count(value):
                values[key] = int(value)
        elif key == "running":
            values[key] = value == "1"
        elif key in ("start", "job_id", "progress"):
            if value and "\t" not in value:
                values[key] = value
    return State(**values)  # type: ignore[arg-type]


def format_state(state: State) -> str:
    """The file's text for ``state``."""
    return (f"attempt={state.attempt}\nfailures={state.failures}\n"
            f"running={int(state.running)}\nstart={state.start}\njob_id={state.job_id}\n"
            f"stalled={state.stalled}\nprogress={state.progress}\n")


def read_state(run_dir: str) -> State:
    """``RUN_DIR/state``, or a fresh state when there is none (or it cannot be read).

    Raises:
        ForeignFileError: The file is a symbolic link or another user's.
    """
    try:
        text = read_own(os.path.join(run_dir, "state"))
        return State() if text is None else parse_state(text)
    except ForeignFileError:
        raise
    except OSError as err:
        logger.warning("cannot read %s/state (%s); starting from a fresh state", run_dir, err)
        return State()


def write_state(run_dir: str, state: State) -> None:
    """Replace ``RUN_DIR/state`` atomically."""
    atomic_write(os.path.join(run_dir, "state"), format_state(state))


# ---------------------------------------------------------------------------- history


@dataclass(frozen=True)
class HistoryRow:
    """One line of ``history.tsv``."""

    attempt: int
    job_id: str
    start: str
    end: str
    exit_code: str
    flag: str
    failures: int
    decision: str


def one_field(text: object) -> str:
    """``text`` made safe for one field of a tab-separated line (no tab, no line break)."""
    return " ".join(str(text).split()) or "-"


def history_fields(attempt: int, job_id: str, start: str, end: str, exit_code: object,
                   flag: bool, failures: int) -> str:
    """All fields of a history line but the decision, tab-separated, with no trailing tab."""
    return "\t".join(one_field(v) for v in (attempt, job_id, start, end, exit_code,
                                            "yes" if flag else "no", failures))


def parse_history(lines: Iterable[str]) -> list[HistoryRow]:
    """The rows of ``history.tsv``; the header, and lines that are not a whole row, are skipped.

    A line is cut short when a node dies while the script writes it; the rows after it are
    still good.
    """
    rows = []
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != len(HISTORY_COLUMNS) or not is_count(fields[0]) \
                or not is_count(fields[6]) or not fields[7]:
            continue
        rows.append(HistoryRow(int(fields[0]), fields[1], fields[2], fields[3], fields[4],
                               fields[5], int(fields[6]), fields[7]))
    return rows


def read_history(run_dir: str) -> list[HistoryRow]:
    """The rows of ``RUN_DIR/history.tsv`` (none when there is no such file)."""
    text = read_own(os.path.join(run_dir, "history.tsv"))
    return [] if text is None else parse_history(text.splitlines())


def ensure_history_header(run_dir: str) -> None:
    """Start ``history.tsv`` with its header unless it already has content."""
    _append(run_dir, HISTORY_HEADER + "\n", only_if_empty=True)


def append_history(run_dir: str, fields: str, decision: str) -> None:
    """Append one line; a single write, so that lines never interleave."""
    ensure_history_header(run_dir)
    _append(run_dir, f"{fields}\t{one_field(decision)}\n")


def _append(run_dir: str, text: str, only_if_empty: bool = False, name: str = "history.tsv") -> None:
    """One ``write`` of ``text`` at the end of ``name`` (this user's file, no link)."""
    fd = open_own(os.path.join(run_dir, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        if not only_if_empty or os.fstat(fd).st_size == 0:
            os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- node history

NODE_HISTORY = "node_history.tsv"
NODE_HISTORY_COLUMNS = ("attempt", "node", "event", "fingerprint", "detail")
NODE_HISTORY_HEADER = "\t".join(NODE_HISTORY_COLUMNS)


def parse_node_history(lines: Iterable[str]) -> list[Event]:
    """The rows of ``node_history.tsv``; the header and lines that are not a whole, valid row
    (a line cut short by a dying node, an unknown event) are skipped."""
    events = []
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != len(NODE_HISTORY_COLUMNS):
            continue
        attempt, node, kind, fingerprint, detail = fields
        if not is_count(attempt) or kind not in KINDS or not detail \
                or (node != NO_NODE and not is_node_name(node)) \
                or (fingerprint != "-" and not is_fingerprint(fingerprint)):
            continue
        events.append(Event(int(attempt), node, kind, fingerprint, detail))
    return events


def read_node_history(run_dir: str) -> list[Event]:
    """The rows of ``RUN_DIR/node_history.tsv``, oldest first (none when there is no file)."""
    text = read_own(os.path.join(run_dir, NODE_HISTORY))
    return [] if text is None else parse_node_history(text.splitlines())


def append_node_history(run_dir: str, events: Iterable[Event]) -> None:
    """Append ``events`` in one write (the header first, into an empty file)."""
    text = "".join("\t".join(one_field(v) for v in (e.attempt, e.node, e.kind, e.fingerprint, e.detail))
                   + "\n" for e in events)
    if text:
        _append(run_dir, NODE_HISTORY_HEADER + "\n", only_if_empty=True, name=NODE_HISTORY)
        _append(run_dir, text, name=NODE_HISTORY)


# ---------------------------------------------------------------------------- excluded nodes


def parse_excluded(text: str) -> list[str]:
    """The node names of ``excluded_nodes``, one a line; anything else is skipped."""
    return [line.strip() for line in text.splitlines() if is_node_name(line.strip())]


def read_excluded(run_dir: str) -> list[str]:
    """``RUN_DIR/excluded_nodes``, oldest first (empty when there is none)."""
    text = read_own(os.path.join(run_dir, "excluded_nodes"))
    return [] if text is None else parse_excluded(text)


def write_excluded(run_dir: str, nodes: Iterable[str]) -> None:
    """Replace ``RUN_DIR/excluded_nodes`` (removed when ``nodes`` is empty)."""
    path = os.path.join(run_dir, "excluded_nodes")
    nodes = list(nodes)
    if nodes:
        atomic_write(path, "".join(f"{node}\n" for node in nodes))
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------------- progress


def newest_mtime(path: str) -> str:
    """The newest mtime (ns, as text) of a regular file at or under ``path``; empty if none.

    Symbolic links below ``path`` are not followed (a link out of the checkpoint directory is
    not progress); ``path`` itself may be one.
    """
    if not path or not os.path.exists(path):
        return ""
    if not os.path.isdir(path):
        return str(os.stat(path).st_mtime_ns) if os.path.isfile(path) else ""
    newest = -1
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue   # removed while we looked (a checkpoint being rotated)
            if stat.S_ISREG(st.st_mode):
                newest = max(newest, st.st_mtime_ns)
    return str(newest) if newest >= 0 else ""
