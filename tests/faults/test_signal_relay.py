"""A worker killed by a signal, started through the warm template: the trampoline that stands in
for it dies of the same signal (so torch records the same cause), and leaves nothing of its own.

Where core dumps are on (``ulimit -c unlimited`` on many clusters) the worker writes ``core`` in
its working directory; the trampoline, re-raising SIGSEGV in the same directory, used to write
its own ``core`` over it, and the user lost the dump that mattered.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The worker keeps a marker computed at run time (so the trampoline's memory never holds it),
# prints it, and segfaults.
SEGFAULT = (
    "import ctypes, os\n"
    "MARKER = ('ft-core-marker-' + str(os.getpid() * 7919)).encode()\n"
    "print(MARKER.decode(), flush=True)\n"
    "ctypes.string_at(0)\n"
)


def core_pattern() -> str:
    try:
        return Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return ""


def allow_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.mark.skipif(not core_pattern().startswith("core") or "/" in core_pattern(),
                    reason="core files are not written to the working directory on this machine")
@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_CORE)[1] != resource.RLIM_INFINITY,
                    reason="core dumps cannot be enabled here")
def test_a_segfaulting_warm_worker_keeps_its_core_dump_and_the_trampoline_adds_none(run_dir, tmp_path):
    socket_path = os.path.join(run_dir, "warm.sock")
    template = subprocess.Popen(
        [sys.executable, str(REPO / "launcher" / "warm" / "zygote.py"), "--socket", socket_path,
         "--parent-pid", str(os.getpid()), "--preload", ""],
        stdin=subprocess.DEVNULL, preexec_fn=allow_core_dumps,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(socket_path):
            assert template.poll() is None and time.monotonic() < deadline, "the warm template did not start"
            time.sleep(0.02)
        trampoline = subprocess.run(
            [sys.executable, "-I", "-S", str(REPO / "launcher" / "warm" / "trampoline.py"), "-c", SEGFAULT],
            env={**os.environ, "FT_WARM_TEMPLATE_SOCKET": socket_path}, cwd=tmp_path,
            capture_output=True, text=True, timeout=60, preexec_fn=allow_core_dumps,
        )
    finally:
        template.send_signal(signal.SIGTERM)
        template.wait(10)
    assert trampoline.returncode == -signal.SIGSEGV, trampoline.stderr  # what torch records
    marker = trampoline.stdout.strip().encode()
    assert marker.startswith(b"ft-core-marker-")
    cores = [p for p in tmp_path.iterdir() if p.name.startswith("core")]
    assert len(cores) == 1, cores  # the worker's, and no second one from the trampoline
    assert marker in cores[0].read_bytes(), "the core file is not the worker's"
