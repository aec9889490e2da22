"""Helpers to run real ft_launcher processes in tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKER = str(Path(__file__).resolve().parent / "workers" / "ft_worker.py")
FT_LAUNCHER = [sys.executable, "-m", "launcher"]


def launcher_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("FT_", "PET_", "TORCHELASTIC_")) or key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            del env[key]
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def start_launcher(args: list[str], env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start ``ft_launcher ARGS`` in its own session (stdout/stderr captured as text)."""
    return subprocess.Popen(
        FT_LAUNCHER + args, env=launcher_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, **popen_kwargs,
    )


def run_launcher(args: list[str], timeout: float = 90,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``ft_launcher ARGS`` to completion (bounded by ``timeout``)."""
    proc = start_launcher(args, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"ft_launcher did not finish in {timeout} s; stderr:\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def events_of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


def records(record_dir: Path) -> dict[tuple[int, int], dict]:
    """``{(cycle, rank): record}`` written by ft_worker.py."""
    found = {}
    for path in Path(record_dir).glob("cycle*_rank*.json"):
        data = json.loads(path.read_text())
        found[(data["cycle"], data["rank"])] = data
    return found


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def live_descendants(root: int) -> list[int]:
    """Pids of the live (not zombie) descendants of ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                raw = Path(f"/proc/{entry}/stat").read_bytes()
                fields = raw[raw.rfind(b")") + 2 :].split()
                if fields[0] not in (b"Z", b"X"):
                    children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


# Fault tolerance options of the graceful-stop and signal tests: generous timeouts (no hang is
# meant), for a heartbeats front end and for a sections one.
HEARTBEAT_ARGS = ["--ft-param-initial_rank_heartbeat_timeout", "60", "--ft-param-rank_heartbeat_timeout", "30"]
SECTION_ARGS = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null",
                "--ft-param-rank_section_timeouts", "setup:60,step:60,checkpointing:60",
                "--ft-param-rank_out_of_section_timeout", "60"]


def signal_whole_job(launcher_pid: int, sig: int) -> None:
    """Send ``sig`` to the launcher and every live process under it, as slurmstepd does."""
    for pid in [launcher_pid, *live_descendants(launcher_pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
