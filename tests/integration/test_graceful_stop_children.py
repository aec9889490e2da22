"""A graceful stop survives the rank's children: DataLoader workers (issue 21.2).

``graceful_stop=True`` with ``DataLoader(num_workers=2)`` under a real ft_launcher (2 ranks, gloo on
CPU), with the Lightning callback and with ``ft_core.integration``. The stop signal comes in both
ways it can: to the launcher alone (which passes it to each rank's process group, loader workers
included) and to every process of the job at once (as SLURM's step daemon sends it). Forked
loader workers inherit the rank's handler; it must leave them running, so the loader keeps
serving batches until every rank stops after the same step with a checkpoint.
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

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "loader_stop.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def reports(root: Path, rank: int, op: str) -> list[dict]:
    path = root / f"report_rank{rank}_cycle0.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op]


def stepping(root: Path, step: int) -> bool:
    return all(any(r["step"] >= step for r in reports(root, rank, "step")) for rank in (0, 1))


@pytest.mark.parametrize("delivery", ["launcher", "job-wide"])
@pytest.mark.parametrize("front", ["lightning", "integration"])
def test_a_graceful_stop_survives_dataloader_workers(tmp_path, front, delivery):
    root = tmp_path / "run"
    root.mkdir()
    cfg = {"front": front, "root": str(root), "loader_workers": 2}
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
            "--term-timeout", "20", "--ft-event-log", str(tmp_path / "events.jsonl"),
            *(HEARTBEAT_ARGS if front == "lightning" else SECTION_ARGS),
            WORKER, json.dumps(cfg)]
    proc = start_launcher(args, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(tmp_path / "finished.flag")})
    try:
        wait_for(lambda: stepping(root, 5) or proc.poll() is not None, 120, "both ranks training")
        assert proc.poll() is None, proc.communicate()[1][-5000:]
        loaders = {rank: [r["pid"] for r in reports(root, rank, "loader")] for rank in (0, 1)}
        assert all(len(pids) == 2 for pids in loaders.values()), loaders
        if delivery == "launcher":
            proc.send_signal(signal.SIGUSR1)  # ft_launcher passes it to each rank's process group
        else:
            signal_whole_job(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    output = out + err
    # The loader workers served batches until their rank stopped: none died of the signal.
    assert "is killed by signal" not in output, output[-6000:]
    assert proc.returncode == 0, output[-6000:]
    for rank in (0, 1):
        assert not reports(root, rank, "exception"), reports(root, rank, "exception")
    stopped = [reports(root, rank, "stopped") for rank in (0, 1)]
    assert all(len(s) == 1 for s in stopped), output[-6000:]
    assert stopped[0][0]["step"] == stopped[1][0]["step"]  # every rank after the same step
    assert "SIGUSR1" in stopped[0][0]["signal"]
    if front == "lightning":
        assert (root / "ckpt" / "last.ckpt").exists()
        assert not (tmp_path / "finished.flag").exists()  # stopped, not finished
    else:
        assert json.loads((root / "ckpt" / "checkpoint.json").read_text())["step"] == stopped[0][0]["step"]
