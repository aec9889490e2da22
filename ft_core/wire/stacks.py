"""Python stacks of a rank, taken by its monitor before the rank is signalled.

Evidence before the kill: a hang report says *where* the rank was, not only *that* it stopped.
Two ways to read a rank's stacks (all threads), tried in this order within a time budget:

1. **py-spy** (``py-spy dump --pid P --json``, the PyPI wheel ``py-spy``; optional extra
   ``ptl-resiliency[stacks]``). It reads the rank's memory, so it works while the rank is stuck
   in C code holding the GIL. A stopped rank (SIGSTOP) is read with ``--nonblocking``: py-spy
   cannot suspend a stopped process, and a stopped process needs no suspending. The rank must
   allow the monitor to trace it where the Yama LSM restricts ptrace (``ptrace_scope`` 1): the
   client calls ``prctl(PR_SET_PTRACER, monitor_pid)`` at init (:func:`ft_core.wire.osutil.allow_tracer`),
   which also covers py-spy as the monitor's child.
2. **faulthandler**, the fallback: at init the client registers
   ``faulthandler.register(DUMP_SIGNAL, file=<memfd>, all_threads=True)`` and passes the memfd to
   the monitor in the handshake (:class:`DumpHandler`). The monitor sends the signal and reads
   what the C-level handler wrote, which also works while the main thread holds the GIL in C
   code. A stopped rank gets the dump signal first and SIGCONT after it, so the handler runs
   before any Python code of the rank does (the stack is the freeze point).

:func:`capture` returns a :class:`StackCapture`: the whole dump as text (for a file) and the
innermost frames of the main thread as ``"file:line function"`` strings (for the hang report).
:func:`innermost_user_frame` picks the first frame outside the standard library, installed
packages and this package, which is what the launcher's failure line names.

Standard library only: the rank monitor uses it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ft_core.wire import procfs
from ft_core.wire.env import FT_PY_SPY_ENV_VAR

DUMP_SIGNAL = signal.SIGRTMIN + 6
"""The signal the client's faulthandler listens on. A real-time signal nothing else in a
training job uses (not SIGUSR1/SIGUSR2, which clusters send as preemption warnings); the client
tells its monitor the number in the handshake, and the monitor sends it only to a rank that
registered it (its default action would end the process)."""

RANK_EXITED = "the rank exited before its stack could be read"
""":attr:`StackCapture.error` of a rank that had exited or was exiting: not a fault of the
capture (a rank that ends on its own is not hung, and the launcher asks every rank still running
when another fails, some of which are already on their way out)."""
MAX_FRAMES = 10
"""Frames of the main thread in a hang report (innermost first)."""
MAX_DUMP_BYTES = 1024 * 1024
"""Most of a faulthandler dump the monitor reads."""
_PF_EXITING = 0x4  # include/linux/sched.h
_SETTLE = 0.02  # a faulthandler dump is complete once its size stopped changing this long
_POLL = 0.005
_OFF = ("", "0", "off", "none", "no", "false")


@dataclass(frozen=True)
class StackTarget:
    """What a monitor knows of a rank to read its stacks.

    Attributes:
        pid: The rank's process.
        dump_fd: The memfd the rank's faulthandler writes to (received in the handshake), or
            None when the rank registered no handler.
        dump_signal: The signal that triggers the rank's faulthandler.
        main_thread: ``threading.main_thread().ident`` of the rank (faulthandler names threads
            by it).
    """

    pid: int
    dump_fd: Optional[int] = None
    dump_signal: Optional[int] = None
    main_thread: Optional[int] = None


@dataclass
class StackCapture:
    """The outcome of :func:`capture`.

    Attributes:
        text: Every thread's stack, readable (empty when nothing was captured).
        frames: The main thread's innermost frames, ``"file:line function"``, innermost first.
        method: ``"py-spy"`` or ``"faulthandler"`` (None when nothing was captured).
        error: Why there is no stack (None when there is one); :data:`RANK_EXITED` for a rank
            that had exited or was exiting.
        note: Why the fallback was used (py-spy missing or refused), or for a rank that exited
            what each way said, for the monitor's log.
        seconds: Time the capture took.
        exited: The rank had exited or was exiting: there was no stack to read, and none is
            needed (its monitor logs this at debug level, not as a warning).
    """

    text: str = ""
    frames: list[str] = field(default_factory=list)
    method: Optional[str] = None
    error: Optional[str] = None
    note: Optional[str] = None
    seconds: float = 0.0
    exited: bool = False


# ---------------------------------------------------------------------- rank side


class DumpHandler:
    """The rank's end of the faulthandler fallback: a memfd and a registered signal.

    Create with :meth:`install` (at client init); :meth:`uninstall` at shutdown. The memfd is
    passed to the monitor over the handshake socket, so no path exists anywhere.
    """

    def __init__(self, fd: int, signum: int) -> None:
        self.fd = fd
        self.signum = signum

    @classmethod
    def install(cls) -> DumpHandler | None:
        """Register the dump signal; None where that is impossible (not the main thread, no memfd)."""
        try:
            fd = os.memfd_create("ft-stacks", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            return None
        try:
            faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
        except (OSError, RuntimeError, ValueError):
            os.close(fd)
            return None
        return cls(fd, int(DUMP_SIGNAL))

    def uninstall(self) -> None:
        """Unregister the signal (its default action returns) and close the memfd."""
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            faulthandler.unregister(self.signum)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


# ---------------------------------------------------------------------- monitor side


def find_py_spy() -> str | None:
    """The py-spy executable to use: ``FT_PY_SPY`` (a path, or ``off``), else the one installed
    next to this interpreter (a virtual environment's ``bin``), else the one on ``PATH``."""
    setting = os.environ.get(FT_PY_SPY_ENV_VAR)
    if setting is not None:
        return None if setting.strip().lower() in _OFF else setting
    candidate = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(candidate, os.X_OK):
        return candidate
    return shutil.which("py-spy")


def capture(target: StackTarget, budget: float, stopped: bool = False) -> StackCapture:
    """Read every thread's Python stack of ``target`` within ``budget`` seconds.

    Args:
        target: The rank.
        budget: Seconds this may take in total (0: capture nothing).
        stopped: The rank is stopped (SIGSTOP): py-spy reads it without suspending it, and the
            faulthandler fallback continues it after queueing the dump signal.

    Returns:
        The capture; on failure its ``error`` says why (never raises for a rank that is gone,
        forbids tracing or does not answer). A rank that has exited or is exiting, found so
        before or after the attempts, gets :data:`RANK_EXITED` and ``exited`` (what py-spy and
        faulthandler said of it, "Failed to parse python binary", "no stack within the budget",
        goes to ``note``): a process on its way out has no stack to read.
    """
    started = time.monotonic()
    deadline = started + budget
    if budget <= 0:
        return StackCapture(error="stack capture is off (stack_capture_budget 0)")
    if has_exited(target.pid):  # nothing to read: spend none of the budget
        return StackCapture(error=RANK_EXITED, exited=True)
    errors = []
    py_spy = find_py_spy()
    result: StackCapture | None = None
    if py_spy is not None:
        result, why = _py_spy_dump(py_spy, target.pid, deadline, stopped)
        if why:
            errors.append(f"py-spy: {why}")
    else:
        errors.append("py-spy is not installed")
    if result is None:
        if target.dump_fd is None or target.dump_signal is None:
            errors.append("the rank registered no faulthandler signal")
        else:
            result, why = _faulthandler_dump(target, deadline, stopped)
            if why:
                errors.append(f"faulthandler: {why}")
    if result is None and has_exited(target.pid):
        result = StackCapture(error=RANK_EXITED, note="; ".join(errors), exited=True)
    elif result is None:
        result = StackCapture(error="; ".join(errors))
    elif errors:
        result.note = "; ".join(errors)
    result.seconds = round(time.monotonic() - started, 4)
    return result


def _py_spy_dump(py_spy: str, pid: int, deadline: float, stopped: bool) -> tuple[StackCapture | None, str]:
    args = [py_spy, "dump", "--pid", str(pid), "--json"]
    if stopped:
        args.append("--nonblocking")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None, "no time left in the budget"
    try:
        done = subprocess.run(args, capture_output=True, timeout=remaining, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer within the budget ({remaining:.2f} s)"
    except OSError as err:
        return None, f"cannot run {py_spy}: {err.strerror or err}"
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, " ".join(message[:2])[:300] or f"exit code {done.returncode}"
    try:
        threads = json.loads(done.stdout)
    except ValueError as err:
        return None, f"unreadable output: {err}"
    if not isinstance(threads, list):
        return None, "unreadable output"
    return _from_py_spy(threads, pid), ""


def _from_py_spy(threads: list[Any], pid: int) -> StackCapture:
    lines: list[str] = []
    main: list[str] = []
    for thread in threads:
        if not isinstance(thread, dict):
            continue
        frames = [
            (str(f.get("filename")), f.get("line"), str(f.get("name")))
            for f in thread.get("frames") or () if isinstance(f, dict)
        ]
        is_main = thread.get("os_thread_id") == pid or thread.get("thread_name") == "MainThread"
        state = "active" if thread.get("active") else "idle"
        if thread.get("owns_gil"):
            state += ", holds the GIL"
        lines.append(f"Thread {thread.get('os_thread_id')} {thread.get('thread_name')!r} "
                     f"({state}{', main thread' if is_main else ''}), most recent call first:")
        lines += [f'  File "{filename}", line {line} in {name}' for filename, line, name in frames]
        lines.append("")
        if is_main and not main:
            main = [frame_text(filename, line, name) for filename, line, name in frames]
    return StackCapture(text="\n".join(lines), frames=main[:MAX_FRAMES], method="py-spy")


def _faulthandler_dump(target: StackTarget, deadline: float, stopped: bool) -> tuple[StackCapture | None, str]:
    fd = target.dump_fd
    try:
        info = os.fstat(fd)
    except OSError as err:
        return None, f"dump file unusable: {err.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return None, "the rank's dump descriptor is not a file"
    start = info.st_size
    try:
        os.kill(target.pid, target.dump_signal)
        if stopped:
            # The dump signal is pending now; on SIGCONT it is handled before any code of the
            # rank runs, so the stack shows where it was stopped.
            os.kill(target.pid, signal.SIGCONT)
    except ProcessLookupError:
        return None, "the rank is gone"
    except PermissionError as err:
        return None, f"cannot signal the rank: {err.strerror}"
    size, stable_since = start, None
    while True:
        now = time.monotonic()
        try:
            current = os.fstat(fd).st_size
        except OSError as err:
            return None, f"dump file unusable: {err.strerror}"
        if current != size:
            size, stable_since = current, now
        elif size > start and stable_since is not None and now - stable_since >= _SETTLE:
            break
        if now >= deadline or (size == start and has_exited(target.pid)):
            if size > start:
                break  # take what was written
            if now < deadline:
                return None, "the rank exited"
            return None, "the rank wrote no stack within the budget (a signal handler cannot run?)"
        time.sleep(_POLL)
    text = os.pread(fd, min(size - start, MAX_DUMP_BYTES), start).decode("utf-8", "replace")
    return StackCapture(text=text, frames=_faulthandler_main_frames(text, target.main_thread),
                        method="faulthandler"), ""


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FH_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def has_exited(pid: int) -> bool:
    """Whether ``pid`` is gone, a zombie, or exiting (the kernel's ``PF_EXITING`` in
    ``/proc/<pid>/stat``: its memory may already be unmapped, which py-spy reports as
    "Failed to parse python binary")."""
    facts = procfs.read_stat(pid)
    if facts is None:
        return True
    return facts.state in ("Z", "X", "x") or bool(facts.flags & _PF_EXITING)


def _faulthandler_main_frames(text: str, main_thread: Optional[int]) -> list[str]:
    """The main thread's frames of a faulthandler dump (the first thread if it is not named)."""
    blocks: list[tuple[int, list[str]]] = []
    for line in text.splitlines():
        header = _FH_THREAD.match(line)
        if header:
            blocks.append((int(header.group(2), 16), []))
            continue
        frame = _FH_FRAME.match(line)
        if frame and blocks:
            blocks[-1][1].append(frame_text(frame.group(1), frame.group(2), frame.group(3)))
    for ident, frames in blocks:
        if ident == main_thread:
            return frames[:MAX_FRAMES]
    return blocks[0][1][:MAX_FRAMES] if blocks else []


def frame_text(filename: str, line: Any, function: str) -> str:
    """One frame as reports carry it: ``"file:line function"``."""
    return f"{filename}:{line} {function}"


# ---------------------------------------------------------------------- reading reports


_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    found.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ft_core itself
    return tuple(os.path.join(os.path.realpath(p), "") for p in found if p)


def innermost_user_frame(frames: list[str]) -> str | None:
    """The first frame (innermost first) outside the standard library, installed packages and
    ft_core: the user's line the rank was executing or waiting in. None if there is none."""
    libraries = _library_dirs()
    for frame in frames:
        filename = frame.rpartition(" ")[0].rpartition(":")[0]
        if not filename or filename.startswith("<"):
            continue
        if not os.path.realpath(filename).startswith(libraries) and not _INSTALLED.search(filename):
            return frame
    return None


def write_stack_file(directory: str, name: str, header: str, capture_: StackCapture) -> tuple[str | None, str | None]:
    """Write a capture to ``directory/name`` (mode 0600; the directory is created).

    Returns:
        ``(path, None)``, or ``(None, why)`` when the file cannot be written.
    """
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(header.rstrip("\n") + "\n\n" + capture_.text.rstrip("\n") + "\n")
    except OSError as err:
        return None, f"cannot write {directory}: {err.strerror or err}"
    return path, None
