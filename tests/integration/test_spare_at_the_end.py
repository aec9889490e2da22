"""A spare that waits when the job's training ends must not restart it.

Nodes a and b (two ft_launchers on 127.0.0.1, one rank each, c10d, ``--nnodes 2``) train to the
end; b's rank then lingers in its shutdown (it reported that its training ended, its process has
not exited yet), and a spare, node c, arrives in the rendezvous meanwhile. torch's agent restarts
the workers of a healthy node whenever nodes wait ("another node entered the rendezvous"): before,
b restarted its finished rank with the spare and redid the steps since the last checkpoint, while
a waited in torch's exit barrier for b (300 s). Now b sees that the training ended, says so once,
and lets its rank exit: a and b end with exit 0, no cycle restarted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_launcher_multinode import free_port
from tests.launcher_util import FT_LAUNCHER, events_of, launcher_env, read_events, wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "jit_plain_train.py")

pytestmark = pytest.mark.slow

REFUSAL = "workers are not restarted for the waiting node(s)"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _reported(tmp_path: Path, rank: int, op: str) -> bool:
    path = tmp_path / f"report_rank{rank}_cycle0.jsonl"
    return path.exists() and any(json.loads(line)["op"] == op for line in path.read_text().splitlines() if line)


@pytest.mark.timeout(240)
def test_a_spare_arriving_while_the_last_rank_shuts_down_restarts_nothing(tmp_path: Path) -> None:
    port = free_port()
    release = tmp_path / "release"
    (tmp_path / "ckpt").mkdir()
    cfg = {"ckpt_dir": str(tmp_path / "ckpt"), "report_dir": str(tmp_path), "steps": 60, "ckpt_every": 50,
           "linger": {"rank": 1, "until": str(release), "seconds": 90}}
    short_tmp = tempfile.mkdtemp(prefix="spend")
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}

    def start(name: str) -> None:
        (tmp_path / name).mkdir()
        logs[name] = tmp_path / name / "stderr.txt"
        with open(logs[name], "w") as stderr:
            procs[name] = subprocess.Popen(
                [*FT_LAUNCHER, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}", "--max-restarts", "2",
                 "--monitor-interval", "0.1", "--rdzv-conf",
                 "join_timeout=60,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=5",
                 "--ft-event-log", str(tmp_path / name / "events.jsonl"),
                 "--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null",
                 "--ft-param-rank_section_timeouts", "setup:60,step:60,checkpointing:60",
                 "--ft-param-rank_out_of_section_timeout", "60", WORKER, json.dumps(cfg)],
                env=launcher_env({"TMPDIR": short_tmp}), stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                start_new_session=True)

    def b_restarted() -> bool:
        path = tmp_path / "b" / "events.jsonl"
        return path.exists() and bool(events_of(read_events(path), "restart"))

    def b_declined() -> bool:
        return any(REFUSAL in line for line in logs["b"].read_text().splitlines())

    try:
        start("a")
        wait_for(lambda: _listening(port), 60, "node a's rendezvous store")
        start("b")
        # b's rank ended its training and lingers (a's rank may have exited already); then the spare
        wait_for(lambda: _reported(tmp_path, 1, "lingering") or procs["b"].poll() is not None, 150,
                 "rank 1 lingering after its training")
        start("c")
        wait_for(lambda: b_restarted() or b_declined(), 60, "node b to see the spare waiting")
        release.touch()
        for name in ("a", "b"):
            procs[name].wait(timeout=60)
    finally:
        release.touch()
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(short_tmp, ignore_errors=True)
    err = {name: path.read_text() for name, path in logs.items()}
    assert procs["a"].returncode == 0, err["a"][-4000:]
    assert procs["b"].returncode == 0, err["b"][-4000:]
    assert not b_restarted(), err["b"][-4000:]
    assert not (tmp_path / "report_rank1_cycle1.jsonl").exists(), "b restarted its rank with the spare"
    assert len([line for line in err["b"].splitlines() if REFUSAL in line]) == 1, err["b"][-4000:]
    declined = events_of(read_events(tmp_path / "b" / "events.jsonl"), "join_declined")
    assert len(declined) == 1 and declined[0]["cycle"] == 0, declined
