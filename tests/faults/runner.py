"""Runs fault-matrix cases: real ft_launcher processes, each case in its own TMPDIR, concurrently.

A case's launchers run with ``TMPDIR=<case dir>/t`` (so their run directories, sockets and
anything else they create land there) and with the environment variable
``FAULTS_CASE_ID=<case id>``, which every process they start inherits (monitors, warm template,
trampolines, workers, workers' children). After the case, "nothing left" is checked exactly for
that case: no live process carrying its marker, and an empty TMPDIR.

Most of a launcher's wall time is spent importing torch (about 2 s of CPU) or waiting for a
timeout, so cases run in a small thread pool; each case is bounded by its own deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.launcher_util import FT_LAUNCHER, launcher_env, wait_for

WORKER = str(Path(__file__).resolve().parent.parent / "workers" / "faults_worker.py")
MARKER = "FAULTS_CASE_ID"
# The marker's value is the case id plus this run's own token: two runs of the matrix on one
# machine (two clones, two sessions) must never count, or kill, each other's processes.
_RUN_TOKEN = uuid.uuid4().hex[:12]


def marker_value(case_id: str) -> str:
    """What this run of the matrix puts in ``FAULTS_CASE_ID`` for one case."""
    return f"{case_id}@{_RUN_TOKEN}"
LEFTOVER_GRACE = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_json_lines(path: Path) -> list[dict]:
    """Complete records of a JSON-lines file that may still be appended to."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]  # a line being written has no newline yet
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


class Launcher:
    """One ft_launcher of a case; output goes to ``<name>.log`` in the case directory."""

    def __init__(self, run: CaseRun, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.events_path = run.dir / f"{name}.events.jsonl"
        self.log_path = run.dir / f"{name}.log"
        env = launcher_env({**(env or {}), "TMPDIR": str(run.tmp), MARKER: marker_value(run.case_id)})
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*FT_LAUNCHER, *args], env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, cwd=run.dir,
            )
        self.started_at = time.monotonic()
        self.code: int | None = None

    def events(self, kind: str | None = None) -> list[dict]:
        records = read_json_lines(self.events_path)
        return records if kind is None else [r for r in records if r["event"] == kind]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float) -> int:
        """Wait for the launcher to exit; kill its process group if it takes longer."""
        try:
            self.code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise AssertionError(f"launcher {self.name} did not exit within {timeout} s") from None
        return self.code


@dataclass
class CaseRun:
    """Everything a case produced, for its test to assert on."""

    case_id: str
    dir: Path
    tmp: Path
    launchers: dict[str, Launcher] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    leaked_pids: list[str] = field(default_factory=list)
    leaked_files: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def launch(self, args: list[str], name: str = "a", env: dict[str, str] | None = None) -> Launcher:
        launcher = Launcher(self, name, args, env)
        self.launchers[name] = launcher
        return launcher

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """:func:`wait_for`, failing at once if a launcher of the case exits meanwhile."""

        def check() -> Any:
            for launcher in self.launchers.values():
                if launcher.proc.poll() is not None:
                    raise AssertionError(f"launcher {launcher.name} exited ({launcher.proc.returncode}) "
                                         f"while waiting for {what}")
            return predicate()

        return wait_for(check, timeout, what)

    def record(self, cycle: int, rank: int, suffix: str = "") -> dict | None:
        """A record written by faults_worker.py (None if absent)."""
        path = self.dir / f"cycle{cycle}_rank{rank}{suffix}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def describe(self) -> str:
        parts = [f"case {self.case_id} ({self.wall_s:.1f} s)"]
        for launcher in self.launchers.values():
            parts.append(f"--- launcher {launcher.name}: exit {launcher.code}\n{launcher.log()[-6000:]}")
        return "\n".join(parts)


def live_case_processes(case_id: str) -> list[str]:
    """Non-zombie processes whose environment carries this case's marker."""
    needle = f"{MARKER}={marker_value(case_id)}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as stream:
                environ = stream.read().split(b"\0")
            if needle not in environ:
                continue
            with open(f"/proc/{entry}/stat", "rb") as stream:
                raw = stream.read()
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                cmdline = stream.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X"):
            found.append(f"{entry}: {cmdline[:200]}")
    return found


def leftover_files(tmp: Path) -> list[str]:
    """Everything left in a case's TMPDIR (run directories, sockets, logs...)."""
    leftovers = []
    for root, dirs, files in os.walk(tmp):
        for name in dirs + files:
            path = os.path.join(root, name)
            kind = "socket" if stat.S_ISSOCK(os.lstat(path).st_mode) else "file"
            leftovers.append(f"{kind} {os.path.relpath(path, tmp)}")
    return leftovers


def run_case(case_id: str, index: int, base: Path, drive: Callable[[CaseRun], None]) -> CaseRun:
    """Run one case's driver and check that nothing of it is left afterwards."""
    case_dir = base / f"c{index:02d}"
    tmp = case_dir / "t"
    tmp.mkdir(parents=True)
    run = CaseRun(case_id, case_dir, tmp)
    started = time.monotonic()
    try:
        drive(run)
    except BaseException:
        run.error = traceback.format_exc()
    finally:
        for launcher in run.launchers.values():
            if launcher.proc.poll() is None:  # the driver failed half-way
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(launcher.proc.pid, signal.SIGKILL)
                launcher.proc.wait(10)
            launcher.code = launcher.proc.returncode
        run.wall_s = time.monotonic() - started
        deadline = time.monotonic() + LEFTOVER_GRACE
        while True:
            run.leaked_pids = live_case_processes(case_id)
            if not run.leaked_pids or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for entry in run.leaked_pids:  # our own descendants, found by our marker
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
        run.leaked_files = leftover_files(tmp)
    return run


def run_all(cases: list[tuple[str, Callable[[CaseRun], None]]], parallel: int, base: Path) -> dict[str, CaseRun]:
    """Run the cases in a pool of ``parallel`` threads, in the given order (put the longest
    first); each case gets a directory under ``base``. Returns the runs by case id."""
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="fault-case") as pool:
        futures = {
            case_id: pool.submit(run_case, case_id, index, base, drive)
            for index, (case_id, drive) in enumerate(cases)
        }
        return {case_id: future.result() for case_id, future in futures.items()}
