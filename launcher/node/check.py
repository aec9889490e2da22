"""The node check that runs before each rendezvous: a node that fails it does not join the job.

A node with a full or read-only disk, a crawling file system or a broken GPU fails every cycle it
joins, and takes a restart of every node with it each time. ``ft_launcher`` checks its own node
before each rendezvous, bounded in time, and leaves the job (exit 65, as for ``ExcludeThisNode``:
a spare takes its place, and ``scripts/autoresume.sh`` excludes the node at its next requeue)
when a check fails:

- **disks**: each directory of ``node_check_dirs`` (default: the temp dir and ``/dev/shm``) must
  have ``node_check_min_free_mb`` free and take a 1 MiB write with ``fsync`` within
  ``node_check_max_write_seconds``;
- **GPUs**: where NVML exists (``libnvidia-ml.so.1``, the driver's library), every device must
  answer and report no uncorrected volatile ECC error; elsewhere this check is skipped, once, with
  one line;
- **the user's check**: ``node_health_check_cmd`` (``/bin/sh -c``), whose own exit status counts and
  whose output (its tail) goes into the ``node_check`` record, within ``node_health_check_timeout``;
  what it leaves running is killed after it (see :func:`check_command`).

Stdlib only (NVML through ``ctypes``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from launcher.node import check_reaper

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
WRITE_PROBE_BYTES = 1 << 20
MAX_OUTPUT_CHARS = 2000
OUTPUT_TAIL_BYTES = 64 * 1024
"""How much of the user's check's output is kept while it runs (its last bytes)."""
DRAIN_SECONDS = 1.0
"""How long the output is still read after the check's shell exited."""
READ_BYTES = 64 * 1024
POLL_SECONDS = 0.05
REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_reaper.py")
NVML_LIBRARY = "libnvidia-ml.so.1"


class NodeCheckFailed(Exception):
    """The node check failed: this node must not join the job (the message says why)."""


@dataclass(frozen=True)
class CheckResult:
    """One check of the node.

    Attributes:
        name: ``disk /path``, ``gpus`` or ``command``.
        ok: False when the node must not join.
        detail: What was found (free space and write time, the GPUs, the exit status).
        seconds: How long the check took.
        output: The user's command's output (stdout and stderr), at most 2000 characters.
        skipped: True when the check could not run here (no NVML): it does not fail the node.
    """

    name: str
    ok: bool
    detail: str
    seconds: float
    output: str | None = None
    skipped: bool = False


@dataclass(frozen=True)
class NodeCheckSettings:
    """What to check (the ``node_check_*`` and ``node_health_check_*`` config fields).

    Attributes:
        dirs: Directories whose space and write time are checked.
        min_free_mb: Free space each of them must have, in MiB.
        max_write_seconds: Longest time a 1 MiB write with fsync may take.
        command: The user's check (``/bin/sh -c``), or None.
        command_timeout: Seconds the command may run.
    """

    dirs: Sequence[str] = field(default_factory=lambda: default_dirs())
    min_free_mb: float = 50.0
    max_write_seconds: float = 10.0
    command: str | None = None
    command_timeout: float = 60.0


def default_dirs() -> list[str]:
    """The temp dir, and ``/dev/shm`` where it exists (workers' shared memory lives there).

    The temp dir is ``$TMPDIR`` whenever that names a directory, writable or not: Python's
    ``tempfile.gettempdir()`` skips a ``$TMPDIR`` it cannot write to and quietly returns ``/tmp``,
    which would pass a node whose temp file system went read-only while the workers (and every
    non-Python tool in them) are still told to use it. Without such a ``$TMPDIR``, the one
    ``tempfile`` chooses.
    """
    tmpdir = os.environ.get("TMPDIR", "")
    dirs = [tmpdir if os.path.isabs(tmpdir) and os.path.isdir(tmpdir) else tempfile.gettempdir()]
    if os.path.isdir(SHM_DIR):
        dirs.append(SHM_DIR)
    return dirs


def check_disk(path: str, min_free_mb: float, max_write_seconds: float) -> CheckResult:
    """Free space and the time of a 1 MiB write with fsync in ``path`` (the probe file is removed)."""
    started = time.monotonic()
    name = f"disk {path}"
    try:
        free_mb = shutil.disk_usage(path).free / (1 << 20)
    except OSError as err:
        return CheckResult(name, False, f"cannot read its free space: {err}", time.monotonic() - started)
    if free_mb < min_free_mb:
        return CheckResult(name, False, f"{free_mb:.0f} MiB free < {min_free_mb:g} MiB", time.monotonic() - started)
    write_started = time.monotonic()
    try:
        fd, probe = tempfile.mkstemp(prefix=".ft-node-check-", dir=path)
        try:
            os.write(fd, b"\0" * WRITE_PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        return CheckResult(name, False, f"cannot write: {err}", time.monotonic() - started)
    wrote = time.monotonic() - write_started
    ok = wrote <= max_write_seconds
    detail = f"{free_mb:.0f} MiB free, 1 MiB written and synced in {wrote:.3f} s" + (
        "" if ok else f" > {max_write_seconds:g} s")
    return CheckResult(name, ok, detail, time.monotonic() - started)


def check_gpus(library: str = NVML_LIBRARY) -> CheckResult:
    """Every GPU NVML sees answers and has no uncorrected volatile ECC error; skipped without NVML."""
    started = time.monotonic()
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return CheckResult("gpus", True, f"skipped: no NVML ({library}) on this node", 0.0, skipped=True)
    if nvml.nvmlInit_v2() != 0:
        return CheckResult("gpus", False, "NVML is there but does not initialise (a driver problem?)",
                           time.monotonic() - started)
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return CheckResult("gpus", False, "NVML cannot count the devices", time.monotonic() - started)
        problems, seen = [], []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                problems.append(f"GPU {index} does not answer")
                continue
            errors = ctypes.c_ulonglong(0)
            # uncorrected (1) volatile (0) ECC errors; NOT_SUPPORTED (3) on GPUs without ECC
            status = nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0, ctypes.byref(errors))
            if status == 0 and errors.value > 0:
                problems.append(f"GPU {index}: {errors.value} uncorrected ECC error(s)")
            seen.append(f"GPU {index} ok" if status in (0, 3) else f"GPU {index} (ECC unreadable, status {status})")
        if problems:
            return CheckResult("gpus", False, "; ".join(problems), time.monotonic() - started)
        return CheckResult("gpus", True, f"{count.value} GPU(s): " + (", ".join(seen) or "none"),
                           time.monotonic() - started)
    finally:
        nvml.nvmlShutdown()


def check_command(command: str, timeout: float) -> CheckResult:
    """The user's check: passes when ``/bin/sh -c command`` itself exits 0 within ``timeout``.

    What counts is the shell's own exit, not the end of its output: a background job or a daemon
    it leaves behind (which may hold the output open for ever) neither holds the launcher nor
    fails the check. The command runs under :mod:`launcher.node.check_reaper`, a helper that is
    the subreaper of everything the command starts: once the shell exited (or outlived
    ``timeout`` and was killed), every process left under it is killed, ``setsid`` children
    included, and if the launcher dies meanwhile the helper kills them all and ends too.

    Output (stdout and stderr) is read as it comes, so a chatty command never blocks on a full
    pipe, and only its last :data:`OUTPUT_TAIL_BYTES` are kept; the result carries at most
    :data:`MAX_OUTPUT_CHARS` characters of them. After the shell exits, what it wrote is read
    for at most :data:`DRAIN_SECONDS` more.
    """
    started = time.monotonic()
    out_read, out_write = os.pipe()
    control_read, control_write = os.pipe()
    try:
        # the command goes through the environment: no quoting, and no length limit of one argument
        helper = subprocess.Popen([sys.executable, "-I", "-S", REAPER, repr(float(timeout))],
                                  stdin=control_read, stdout=subprocess.PIPE, stderr=out_write,
                                  env=dict(os.environ, FT_NODE_CHECK_COMMAND=command), start_new_session=True)
    except OSError as err:
        for fd in (out_read, control_write):
            os.close(fd)
        return CheckResult("command", False, f"cannot run: {err}", time.monotonic() - started)
    finally:
        os.close(out_write)
        os.close(control_read)
    tail = _Tail(OUTPUT_TAIL_BYTES)
    try:
        # the helper ends once the shell exited or timed out and what it left is killed
        ended = _read_while_running(helper, out_read, tail, started + timeout + check_reaper.KILL_SECONDS + 5.0)
        if ended:
            _drain(out_read, tail, time.monotonic() + DRAIN_SECONDS)
        status = helper.stdout.read().decode("ascii", "replace").strip() if ended and helper.stdout else ""
    finally:
        os.close(control_write)  # the helper's stdin ends: if it still runs, it kills the command's processes
        if helper.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(helper.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                helper.wait(5.0)
        os.close(out_read)
        if helper.stdout:
            helper.stdout.close()
    seconds = time.monotonic() - started
    output = _text(tail.value())
    kind, _, number = status.partition(" ")
    if kind == "exit" and number.isdigit():
        code = int(number)
        return CheckResult("command", code == 0, f"exit status {code}", seconds, output)
    if kind == "signal" and number.isdigit():
        return CheckResult("command", False, f"killed by signal {_signal_name(int(number))}", seconds, output)
    if kind == "timeout":
        return CheckResult("command", False, f"did not finish within {timeout:g} s", seconds, output)
    logger.warning("the node check's helper ended without a status (helper exit %s, status %r)",
                   helper.returncode, status)
    return CheckResult("command", False, f"did not finish within {timeout:g} s (its helper did not report)",
                       seconds, output)


class _Tail:
    """The last ``limit`` bytes of a stream (amortised: trimmed once it holds twice that)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > 2 * self.limit:
            del self._data[:-self.limit]

    def value(self) -> bytes:
        return bytes(self._data[-self.limit:])


def _read_while_running(helper: subprocess.Popen, fd: int, tail: _Tail, deadline: float) -> bool:
    """Read ``fd`` into ``tail`` until ``helper`` ends (True) or ``deadline`` passes (False)."""
    open_ = True
    while helper.poll() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not open_:  # every writer closed its end: only the helper's exit is left to wait for
            try:
                helper.wait(left)
            except subprocess.TimeoutExpired:
                return False
            return True
        readable, _, _ = select.select([fd], [], [], min(POLL_SECONDS, left))
        if readable:
            chunk = os.read(fd, READ_BYTES)
            if chunk:
                tail.add(chunk)
            else:
                open_ = False
    return True


def _drain(fd: int, tail: _Tail, deadline: float) -> None:
    """Read what ``fd`` still holds into ``tail`` until its end or ``deadline``."""
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            return
        chunk = os.read(fd, READ_BYTES)
        if not chunk:
            return
        tail.add(chunk)


def _signal_name(number: int) -> str:
    try:
        return f"{number} ({signal.Signals(number).name})"
    except ValueError:
        return str(number)


def _text(output: bytes) -> str:
    text = output.decode("utf-8", "replace").strip()
    return text if len(text) <= MAX_OUTPUT_CHARS else "..." + text[-MAX_OUTPUT_CHARS + 3:]


def run_checks(settings: NodeCheckSettings, gpus: Callable[[], CheckResult] = check_gpus) -> list[CheckResult]:
    """Every check, each bounded: a disk check that does not return within its write limit plus
    5 s (a hung file system) fails as such."""
    results = [_bounded(f"disk {path}", settings.max_write_seconds + 5.0,
                        lambda path=path: check_disk(path, settings.min_free_mb, settings.max_write_seconds))
               for path in settings.dirs]
    results.append(_bounded("gpus", 30.0, gpus))
    if settings.command:
        results.append(check_command(settings.command, settings.command_timeout))
    return results


def _bounded(name: str, limit: float, check: Callable[[], CheckResult]) -> CheckResult:
    found: list[CheckResult] = []
    worker = threading.Thread(target=lambda: found.append(check()), name=f"node check {name}", daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(limit)
    if not found:
        return CheckResult(name, False, f"did not finish within {limit:g} s", time.monotonic() - started)
    return found[0]


def failures(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The checks that keep the node out of the job."""
    return [r for r in results if not r.ok]


def describe(results: Sequence[CheckResult]) -> str:
    """``disk /tmp: ...; gpus: ...`` for a log line."""
    return "; ".join(f"{r.name}: {r.detail}" for r in results)
