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
- **the user's check**: ``node_health_check_cmd`` (``/bin/sh -c``), whose exit status counts and
  whose output goes into the ``node_check`` record, within ``node_health_check_timeout``.

Stdlib only (NVML through ``ctypes``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
WRITE_PROBE_BYTES = 1 << 20
MAX_OUTPUT_CHARS = 2000
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
    """The user's check: exit status 0 passes; its output is kept (at most 2000 characters). It runs
    in a session of its own, killed whole (its children too) when it outlives ``timeout``."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as err:
        return CheckResult("command", False, f"cannot run: {err}", time.monotonic() - started)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return CheckResult("command", False, f"did not finish within {timeout:g} s", time.monotonic() - started,
                           _text(output or b""))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # what it left in its session (a background job)
    ok = process.returncode == 0
    return CheckResult("command", ok, f"exit status {process.returncode}", time.monotonic() - started,
                       _text(output))


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
