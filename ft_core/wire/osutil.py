"""Small Linux process facilities shared by the monitor, the launcher and the warm template."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import threading
from collections.abc import Iterable, Iterator

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PTRACER = 0x59616D61  # "Yama"

STEP_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
    signal.SIGTERM, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGVTALRM, signal.SIGPROF, signal.SIGPOLL,
    signal.SIGPWR,
)
"""Every signal a job scheduler may send whose default action ends a process: the standard
signals that terminate (or dump core) by default, except SIGKILL (cannot be handled), SIGPIPE
(Python ignores it) and the signals of synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
SIGTRAP, SIGSYS, SIGABRT). SLURM delivers a step signal to every process of the step; the helper
processes of the launcher (monitors, warm template, trampolines, sentinel) keep these blocked so
that none of them dies of one (see docs/launcher.md, "Signals"). Real-time signals are not
covered. ``launcher/warm/trampoline.py`` keeps a copy (checked by ``tests/unit/test_warm_protocol.py``)."""


def _prctl(option: int, value: int) -> bool:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    return False


def set_parent_death_signal(sig: signal.Signals | int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits (best effort).

    Returns:
        True if the kernel accepted the request.
    """
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def set_child_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init (best effort).

    Returns:
        True if the kernel accepted the request.
    """
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


@contextlib.contextmanager
def signals_blocked(signals: Iterable[int] = STEP_SIGNALS) -> Iterator[None]:
    """Block ``signals`` in the calling thread for the duration of the block.

    A child process started inside the block (``subprocess.Popen`` forks from the calling thread)
    inherits the blocked mask, and ``exec`` keeps it: the child starts with these signals held
    pending instead of dying of one before it could set itself up. Only helpers of ours that
    never unblock them (or unblock them themselves) may be started so.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def set_process_title(title: str) -> bool:
    """Make ``/proc/self/cmdline`` (what ``ps``, ``pgrep -f`` and py-spy show) read ``title``.

    The kernel shows the memory of the process's original argument strings; this writes
    ``title`` there in place, NUL-terminated, and leaves the area's last byte non-NUL, which tells
    the kernel (since Linux 4.18) that the process set a title and to show it up to its NUL.
    Python keeps copies of its arguments (``sys.argv``, ``sys.orig_argv``), so nothing reads the
    original memory afterwards. A title longer than the original argument strings is cut.

    Returns:
        True if the title was written; False where the area cannot be found or checked.
    """
    try:
        with open("/proc/self/stat", "rb") as stream:
            raw = stream.read()
        fields = raw[raw.rfind(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # proc(5) fields 48 and 49: arg_start, arg_end
        with open("/proc/self/cmdline", "rb") as stream:
            shown = stream.read()
    except (OSError, ValueError, IndexError):
        return False
    size = end - start
    if size < 2 or start <= 0:
        return False
    check = min(size, len(shown), 64)
    if ctypes.string_at(start, check) != shown[:check]:
        return False  # not the memory the kernel shows: leave it alone
    data = title.encode(errors="replace")[: size - 2] + b"\0"
    ctypes.memmove(start, data + b" " * (size - len(data)), size)
    return True


def allow_tracer(pid: int) -> bool:
    """Let process ``pid`` (and its descendants) trace this one under Yama ``ptrace_scope`` 1.

    Needed for a rank's monitor, a sibling, to read the rank's stacks with py-spy on hosts
    where Yama restricts ptrace to descendants (most Ubuntu-based cluster nodes). Harmless and
    False where Yama is absent; scope 2 and 3 forbid it regardless.

    Returns:
        True if the kernel accepted the request.
    """
    return _prctl(_PR_SET_PTRACER, pid)


def in_main_thread() -> bool:
    """True on the interpreter's main thread (the only one that may install signal handlers)."""
    return threading.current_thread() is threading.main_thread()


def wakeup_pair() -> tuple[socket.socket, socket.socket]:
    """A non-blocking ``(read end, write end)`` socket pair that wakes a selector.

    Used as ``signal.set_wakeup_fd`` target (a signal ends a ``select`` at once) or as a "work
    is queued" note between threads; :func:`drain` empties the read end.
    """
    read_end, write_end = socket.socketpair()
    read_end.setblocking(False)
    write_end.setblocking(False)
    return read_end, write_end


def drain(read_end: socket.socket) -> None:
    """Read and drop whatever is pending on a non-blocking wake-up socket."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while read_end.recv(4096):
            pass
