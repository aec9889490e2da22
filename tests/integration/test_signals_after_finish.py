"""A stop signal that comes after a rank finished its training does not fail it (issue 21.3).

A real ft_launcher, 2 ranks (gloo on CPU) with ``graceful_stop=True``, Lightning callback and
``ft_core.integration``. Each rank completes its training (the graceful stop's handlers are gone),
then waits a moment before it exits, as a rank does while it writes its last files. SIGUSR1 comes
then, to the launcher alone (which passes it to each rank) or to every process of the job (as
SLURM's step daemon sends it). SIGUSR1's default action would kill the rank (-10): the launcher
would then report a failure (or restart and train a finished job again). The rank must absorb a
stop signal that had its default action before the graceful stop took it: the job succeeds, in
one cycle.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.launcher_util import (
    HEARTBEAT_ARGS,
    SECTION_ARGS,
    signal_whole_job,
    start_launcher,
    wait_for,
)

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "finish_then_wait.py")


pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def reports(root: Path, rank: int, op: str, cycle: int = 0) -> list[dict]:
    path = root / f"report_rank{rank}_cycle{cycle}.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op]


def events(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == kind]


@pytest.mark.parametrize("delivery", ["launcher", "job-wide"])
@pytest.mark.parametrize("front", ["integration", "lightning"])
def test_a_stop_signal_after_the_training_ended_does_not_fail_the_ranks(tmp_path, front, delivery):
    root = tmp_path / "run"
    root.mkdir()
    log = tmp_path / "events.jsonl"
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.05",
            "--term-timeout", "20", "--ft-event-log", str(log),
            *(HEARTBEAT_ARGS if front == "lightning" else SECTION_ARGS),
            WORKER, json.dumps({"front": front, "root": str(root)})]
    proc = start_launcher(args, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(tmp_path / "finished.flag")})
    try:
        wait_for(lambda: all(reports(root, r, "finished") for r in (0, 1)) or proc.poll() is not None, 150,
                 "both ranks to finish their training")
        assert proc.poll() is None, proc.communicate()[1][-5000:]
        if delivery == "launcher":
            proc.send_signal(signal.SIGUSR1)  # ft_launcher passes it to each rank's process group
            wait_for(lambda: events(log, "signal_forwarded"), 30, "the launcher to pass SIGUSR1 on")
        else:
            signal_whole_job(proc.pid, signal.SIGUSR1)
        (root / "release").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    output = out + err
    outcome = [(e["outcome"], e["cycles"]) for e in events(log, "result")]
    released = [bool(reports(root, rank, "released")) for rank in (0, 1)]
    assert (proc.returncode, outcome, released) == (0, [("succeeded", 1)], [True, True]), output[-6000:]
