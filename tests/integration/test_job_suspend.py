"""A job-wide suspend longer than the heartbeat timeout is not a hang (issue 21.4).

``scontrol suspend`` and SLURM's PreemptMode=SUSPEND send SIGSTOP to every process of the job,
monitors included, and SIGCONT later. A monitor that was stopped with its rank must restart its
deadlines on resume instead of finding every rank "hung"; a rank stopped alone is still a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from ft_core import FaultToleranceConfig
from ft_core.monitor.link import MonitorLink
from ft_core.wire import protocol
from tests.launcher_util import events_of, live_descendants, read_events, start_launcher, wait_for
from tests.monitor_events import received, wait_event

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "ft_worker.py")
HB_TIMEOUT = 1.5
SUSPEND = 2.5 * HB_TIMEOUT

pytestmark = pytest.mark.timeout(180)


def heartbeating_rank(start_monitor, spawn_rank):
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=30, rank_heartbeat_timeout=HB_TIMEOUT)
    handle, path = start_monitor(cfg)
    link = MonitorLink(path)
    # "sleep" marks the start of ~8 s of heartbeats every 20 ms.
    rank = spawn_rank([["init"], ["hb", 1, 0], ["sleep", 0], ["hb", 400, 0.02], ["shutdown"]], path)
    rank.next_event("sleep")
    return handle, link, rank


def stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)


def cont(pids: list[int], gap: float = 0.05) -> None:
    # One at a time, in order, as slurmstepd walks a job's processes: a monitor that resumes
    # before its rank must not find it "hung" in the moment the rank is still stopped.
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        time.sleep(gap)


@pytest.mark.parametrize("order", ["monitor-first", "rank-first"])
def test_a_monitor_stopped_with_its_rank_reports_no_hang(start_monitor, spawn_rank, order):
    handle, link, rank = heartbeating_rank(start_monitor, spawn_rank)
    pids = [handle.pid, rank.proc.pid] if order == "monitor-first" else [rank.proc.pid, handle.pid]
    try:
        stop(pids)
        time.sleep(SUSPEND)  # the suspension itself: longer than the heartbeat timeout
    finally:
        cont(pids)
    rank.next_event("done", timeout=30)
    assert rank.wait(20) == 0, rank.stderr()
    assert not received(link, protocol.MSG_RANK_HANG)
    link.close()


def test_a_rank_stopped_alone_is_still_a_hang(start_monitor, spawn_rank):
    _handle, link, rank = heartbeating_rank(start_monitor, spawn_rank)
    stopped_at = time.monotonic()
    os.kill(rank.proc.pid, signal.SIGSTOP)
    hang = wait_event(link, protocol.MSG_RANK_HANG, timeout=20)
    assert hang["kind"] == "heartbeat" and hang["pid"] == rank.proc.pid
    assert time.monotonic() - stopped_at < HB_TIMEOUT + 1.0  # on its deadline, not later
    assert rank.wait(20) == -signal.SIGKILL
    link.close()


def test_a_job_wide_suspend_longer_than_the_heartbeat_timeout_is_no_restart(tmp_path):
    timeout = 3.0
    args = ["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.05", "--max-restarts", "1",
            "--ft-event-log", str(tmp_path / "events.jsonl"),
            "--ft-param-initial_rank_heartbeat_timeout", "60", "--ft-param-rank_heartbeat_timeout", str(timeout),
            WORKER, "--record-dir", str(tmp_path), "--gloo", "--steps", "200", "--step-time", "0.05"]
    proc = start_launcher(args)
    try:
        wait_for(lambda: all((tmp_path / f"cycle0_rank{r}.json").exists() for r in (0, 1)), 90,
                 "both ranks of cycle 0 to run")
        # Every process of the job, as slurmstepd signals them: launcher, sentinel, monitors, warm
        # template, stand-ins, workers.
        pids = sorted([proc.pid, *live_descendants(proc.pid)])  # about the order they started
        assert len(pids) >= 6, pids
        try:
            stop(pids)
            time.sleep(2 * timeout)
        finally:
            cont(pids)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    assert not events_of(events, "failure"), events_of(events, "failure")
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0]
    assert events_of(events, "result")[0]["outcome"] == "succeeded"
    assert "deadlines restarted" in err
