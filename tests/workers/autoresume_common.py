"""Helpers shared by the auto-resume tests (local mode and real SLURM); not a worker itself."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "autoresume.sh"
WORKER = Path(__file__).resolve().parent / "autoresume_worker.py"
FT_LAUNCHER = Path(sys.executable).parent / "ft_launcher"
TOKEN_ENV = "AUTORESUME_TEST_TOKEN"
HISTORY_COLUMNS = ["attempt", "job_id", "start", "end", "exit_code", "flag", "failures", "decision"]


@dataclass(frozen=True)
class Attempt:
    """One line of RUN_DIR/history.tsv."""

    attempt: int
    job_id: str
    start: str
    end: str
    exit_code: str
    flag: str
    failures: int
    decision: str


@dataclass
class AutoresumeRun:
    """One test's run of the script: its files and the environment its processes get."""

    tmp_path: Path
    private_tmp: Path  # the processes' TMPDIR: short (sockets live here) and checked empty after
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # marks the processes it starts

    @property
    def run_dir(self) -> Path:
        return self.tmp_path / "run"

    @property
    def state_dir(self) -> Path:
        return self.tmp_path / "worker-state"

    @property
    def flag(self) -> Path:
        return self.run_dir / "finished.flag"

    def _script_env(self, base: dict[str, str], keep: tuple[str, ...] = ()) -> dict[str, str]:
        """``base`` without the job, launcher and script variables of the test's own session."""
        env = {name: value for name, value in base.items()
               if name in keep or not name.startswith(("SLURM_", "AUTORESUME_", "FT_LAUNCHER", "FAULT_TOL_"))}
        env.update({TOKEN_ENV: self.token, "TMPDIR": str(self.private_tmp), "OMP_NUM_THREADS": "1"})
        return env


def read_history(run_dir: Path) -> list[Attempt]:
    """Parse the script's history file; the header must be exactly the documented one."""
    lines = (run_dir / "history.tsv").read_text().splitlines()
    assert lines and lines[0].split("\t") == HISTORY_COLUMNS, f"bad history header: {lines[:1]}"
    rows = []
    for line in lines[1:]:
        fields = line.split("\t")
        assert len(fields) == len(HISTORY_COLUMNS), f"bad history line: {line!r}"
        rows.append(Attempt(int(fields[0]), fields[1], fields[2], fields[3], fields[4], fields[5],
                            int(fields[6]), fields[7]))
    return rows


def worker_runs(state_dir: Path, rank: int = 0) -> int:
    """How many times the worker of ``rank`` really ran (its own count, not the script's)."""
    path = state_dir / "runs.log"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.split()[:2] == ["rank", str(rank)])


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.1):
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def processes_with_token(token: str) -> list[int]:
    """Pids of live processes whose environment carries ``TOKEN_ENV=token``.

    Everything a test starts (script, launcher, monitors, workers, also under SLURM) inherits
    the variable, so this finds leftovers wherever they were re-parented.
    """
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
    return found


def assert_no_leftovers(token: str, private_tmp: Path, timeout: float = 10.0) -> None:
    """Fail if a process of this test outlives ``timeout`` or a file is left in ``private_tmp``.

    Leftover processes are killed (by pid) before failing, so one test cannot break the next.
    """
    deadline = time.monotonic() + timeout
    left = processes_with_token(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_with_token(token)
    details = {pid: _cmdline(pid) for pid in left}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running: {details}"
    files = sorted(str(p.relative_to(private_tmp)) for p in private_tmp.rglob("*"))
    assert not files, f"files left in the private TMPDIR {private_tmp}: {files}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
