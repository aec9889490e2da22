"""Two different stop signals back to back: SIGTERM, then SIGINT (issue 21.5).

A real ft_launcher with two ``signal_worker.py`` ranks (each counts every run of its handler).
Python runs pending signal handlers in signal-number order (SIGINT, 2, before SIGTERM, 15), not
in arrival order, so the launcher's main thread may see SIGINT first although SIGTERM came first.
The launcher must still stop because of the first signal by arrival (the one its log names) and
keep the rule of docs/launcher.md#signals: each worker sees each signal once.

- job-wide (every process of the job, as SLURM's step daemon signals a step): each worker got
  both signals itself; the launcher passes neither on.
- launcher only: the launcher passes the first (SIGTERM) to the workers; the second changes
  nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launcher_util import live_descendants, start_launcher, wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "signal_worker.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def handled(root: Path, rank: int) -> list[str]:
    path = root / f"cycle0_rank{rank}.signals"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("delivery", ["job-wide", "launcher"])
def test_sigterm_then_sigint_each_worker_sees_each_signal_once(tmp_path, delivery):
    root = tmp_path / "run"
    root.mkdir()
    events = tmp_path / "events.jsonl"
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
            "--term-timeout", "20", "--ft-event-log", str(events), WORKER, "--dir", str(root)]
    proc = start_launcher(args)
    try:
        wait_for(lambda: all((root / f"cycle0_rank{r}.json").exists() for r in (0, 1)) or proc.poll() is not None,
                 120, "both workers running")
        assert proc.poll() is None, proc.communicate()[1][-5000:]
        pids = [proc.pid] if delivery == "launcher" else [proc.pid, *live_descendants(proc.pid)]
        # One sender for both signals: SIGTERM reaches every process before SIGINT does, and both
        # are usually pending together in the launcher when its main thread runs the handlers.
        subprocess.run([sys.executable, "-c",
                        "import os, sys\n"
                        "for sig in (15, 2):\n"
                        "    for pid in sys.argv[1:]:\n"
                        "        try:\n"
                        "            os.kill(int(pid), sig)\n"
                        "        except ProcessLookupError:\n"
                        "            pass\n",
                        *map(str, pids)], check=True, timeout=30)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    output = out + err
    assert proc.returncode == 0, output[-6000:]
    results = [e for e in map(json.loads, events.read_text().splitlines()) if e.get("event") == "result"]
    expected = sorted(["SIGTERM", "SIGINT"] if delivery == "job-wide" else ["SIGTERM"])
    seen = {rank: sorted(handled(root, rank)) for rank in (0, 1)}
    assert (seen, [r["outcome"] for r in results]) == ({0: expected, 1: expected}, ["signal SIGTERM"]), \
        output[-6000:]
