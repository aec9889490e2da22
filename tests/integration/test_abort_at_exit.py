"""A worker that ended its training cleanly and then aborts at exit is not a failure (issue 21, "Also").

A gloo group still alive when the interpreter shuts down can abort the process (SIGABRT) after the
training finished, under plain torchrun too. Before the fix the launcher counted that as a crash:
it restarted a finished job, or, without restarts left, failed it (exit 1). The front ends know
when the training ended cleanly and tell the monitor when they shut monitoring down; the monitor
tells the launcher, which records "finished, then aborted at exit" (``aborted_at_exit``), does not
restart, and counts no failure. An abort before the clean end stays a failure.

A real ft_launcher, 2 ranks (gloo on CPU, ``ft_core.integration``), ``--max-restarts 1``: rank 0
aborts right after its clean end while rank 1 still runs a second: the launcher must let rank 1
finish, not restart, and exit 0 after one cycle.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.launcher_util import SECTION_ARGS, start_launcher

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "abort_at_exit.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def events(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == kind]


def reported(root: Path, rank: int, cycle: int) -> list[str]:
    path = root / f"report_rank{rank}_cycle{cycle}.jsonl"
    return [json.loads(line)["op"] for line in path.read_text().splitlines()] if path.exists() else []


def test_an_abort_at_exit_after_a_clean_end_is_recorded_and_not_restarted(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    log = tmp_path / "events.jsonl"
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.05",
            "--ft-event-log", str(log), *SECTION_ARGS, WORKER, str(root)]
    proc = start_launcher(args, cwd=tmp_path)  # a core dump, should one be written, lands here
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    output = (out + err)[-6000:]
    cycles = [e["cycle"] for e in events(log, "cycle_start")]
    failures = [(e["cycle"], e["rank"], e["cause"]) for e in events(log, "failure")]
    aborted = [(e["cycle"], e["rank"], e["local_rank"], e["signal"]) for e in events(log, "aborted_at_exit")]
    result = [(e["outcome"], e["exit_code"], e["cycles"]) for e in events(log, "result")]
    assert (proc.returncode, cycles, result, failures) == (0, [0], [("succeeded", 0, 1)], []), output
    assert aborted == [(0, 0, 0, "SIGABRT")], aborted
    worker = json.loads((root / "report_rank0_cycle0.jsonl").read_text().splitlines()[0])["pid"]
    assert events(log, "aborted_at_exit")[0]["worker_pid"] == worker
    # rank 1 went on after rank 0's abort and exited 0 (the launcher did not stop it)
    assert reported(root, 1, 0) == ["finished", "released"], output
    assert "finished its training, then aborted at exit (SIGABRT): not a failure, not restarted" in output
