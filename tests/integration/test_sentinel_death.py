"""A SIGKILLed sentinel is noticed and replaced (issue 21.10).

A real ft_launcher with two ``signal_worker.py`` ranks, each with a double-forked daemon (its own
session, re-parented to the launcher). The test SIGKILLs the sentinel; the launcher must start a
new one, which then does both duties of the old one:

- a job-wide SIGUSR1 (every process of the job, as SLURM's step daemon sends it) is recognised as
  such: each worker handles it once (without a sentinel the launcher took it for its own and
  passed it on: twice);
- a SIGKILL of the launcher still ends the run: the new sentinel sweeps the workers' daemons
  (without one they kept running).

Before issue 21.10 nothing noticed the death: no new sentinel appeared (the test fails there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from ft_core.wire.procfs import pid_alive
from launcher.node.sentinel import SCRIPT
from tests.launcher_util import live_descendants, signal_whole_job, start_launcher, wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "signal_worker.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def events(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            record = json.loads(line)
            if record.get("event") == kind:
                found.append(record)
    return found


def sentinels(launcher_pid: int) -> list[int]:
    """The live sentinel processes under the launcher."""
    found = []
    for pid in live_descendants(launcher_pid):
        with contextlib.suppress(OSError):
            if SCRIPT.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def handled(root: Path, rank: int) -> list[str]:
    """The signals rank's worker handled (its daemon, a fork with the same handler, logs too)."""
    path = root / f"cycle0_rank{rank}.signals"
    worker = json.loads((root / f"cycle0_rank{rank}.json").read_text())["pid"]
    lines = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [name for name, pid, _ in lines if int(pid) == worker]


def test_a_killed_sentinel_is_replaced_and_keeps_its_duties(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    log = tmp_path / "events.jsonl"
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
            "--term-timeout", "20", "--ft-event-log", str(log), WORKER, "--dir", str(root), "--spawn-daemon"]
    proc = start_launcher(args)
    daemons: list[int] = []
    try:
        wait_for(lambda: all((root / f"cycle0_rank{r}.json").exists() for r in (0, 1)) or proc.poll() is not None,
                 120, "both workers running")
        assert proc.poll() is None, proc.communicate()[1][-5000:]
        daemons = [json.loads((root / f"cycle0_rank{r}.json").read_text())["daemon"] for r in (0, 1)]
        first = events(log, "launcher_start")[0]["sentinel_pid"]
        assert sentinels(proc.pid) == [first]

        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: [pid for pid in sentinels(proc.pid) if pid != first], 15,
                          "a new sentinel after the first was SIGKILLed")[0]

        signal_whole_job(proc.pid, signal.SIGUSR1)
        received = wait_for(lambda: events(log, "signal_received"), 20, "the launcher to decide on SIGUSR1")
        wait_for(lambda: all("SIGUSR1" in handled(root, r) for r in (0, 1)), 20, "both workers to handle SIGUSR1")
        assert [(r["signal"], r["job_wide"]) for r in received] == [("SIGUSR1", True)]
        assert not events(log, "signal_forwarded")
        assert {r: handled(root, r) for r in (0, 1)} == {0: ["SIGUSR1"], 1: ["SIGUSR1"]}

        assert all(pid_alive(pid) for pid in daemons)
        proc.kill()
        _, err = proc.communicate(timeout=60)  # the pipe closes once the sweep ended the run
        wait_for(lambda: not any(pid_alive(pid) for pid in daemons), 15, "the workers' daemons to be swept")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in daemons:  # the sweep's work, if it did not happen (they hold the launcher's pipes)
            with contextlib.suppress(ProcessLookupError):
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        if proc.stdout is not None and not proc.stdout.closed:
            proc.communicate(timeout=60)
    assert f"the sentinel (pid {first}) died (killed by SIGKILL); started a new one (pid {second})" in err, err[-5000:]
    assert f"[ft_launcher sentinel] launcher pid {proc.pid} exited without cleaning up" in err, err[-5000:]
