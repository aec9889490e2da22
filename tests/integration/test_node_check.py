"""The node check before each rendezvous, with real launchers: a node that fails it never joins."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.exit_codes import EXIT_NODE_EXCLUDED
from launcher.node.check import MAX_OUTPUT_CHARS
from tests.launcher_util import (
    FT_LAUNCHER,
    WORKER,
    events_of,
    launcher_env,
    read_events,
    run_launcher,
    start_launcher,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_a_failing_check_keeps_the_node_out_before_any_worker_starts(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--ft-event-log", str(log),
                         "--ft-node-health-check-cmd", "echo 'gpu 3 lost'; exit 1",
                         "--ft-node-check-min-free-mb", "1e9", WORKER, "--record-dir", str(tmp_path)])
    assert done.returncode == EXIT_NODE_EXCLUDED, done.stderr[-3000:]
    events = read_events(log)
    assert events_of(events, "cycle_start") == []
    [record] = events_of(events, "node_check")
    failed = {c["name"]: c for c in record["checks"] if not c["ok"]}
    assert set(failed) >= {"command"} and failed["command"]["output"] == "gpu 3 lost"
    assert any(name.startswith("disk ") and "MiB free <" in c["detail"] for name, c in failed.items())
    assert "the node check failed, so this node does not join the job" in done.stderr
    assert events_of(events, "result")[-1]["outcome"] == "node check failed"


def test_a_check_that_fails_before_a_restart_stops_the_node_there(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    # passes before cycle 0; fails once a worker of cycle 0 has started (it writes this file)
    check = f"test ! -e {tmp_path}/cycle0_rank0.json || {{ echo 'bad node'; exit 1; }}"
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "3", "--ft-event-log", str(log),
                         "--ft-node-health-check-cmd", check, WORKER, "--record-dir", str(tmp_path),
                         "--crash-rank", "0", "--steps", "2"])
    assert done.returncode == EXIT_NODE_EXCLUDED, done.stderr[-3000:]
    events = read_events(log)
    assert len(events_of(events, "cycle_start")) == 1 and len(events_of(events, "failure")) == 1
    [record] = events_of(events, "node_check")
    assert record["cycle"] == 1 and record["passed"] is False


# A process the check leaves behind in a session of its own (out of the check's process group): it
# writes its pid where the test can see it (the check goes on once it is there: a leftover killed
# before it wrote it would tell the test nothing), then sleeps on, holding the check's output open.
def _leftover(pid_file: Path, seconds: int = 60) -> str:
    return (f"setsid sh -c 'echo $$ > {pid_file}.new; mv {pid_file}.new {pid_file}; exec sleep {seconds}' & "
            f"until [ -e {pid_file} ]; do sleep 0.05; done;")


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still the leftover ``sleep`` (not a zombie, not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return "(sleep)" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.parametrize("check", ["{leftover} echo check-ok", "sleep 100 & {leftover} echo check-ok"])
def test_a_check_that_leaves_children_behind_passes_by_its_own_exit_and_they_are_killed(
        tmp_path: Path, check: str) -> None:
    log, pid_file = tmp_path / "events.jsonl", tmp_path / "leftover.pid"
    started = time.monotonic()
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--ft-event-log", str(log),
                         "--ft-node-health-check-cmd", check.format(leftover=_leftover(pid_file)),
                         "--ft-node-health-check-timeout", "5", WORKER, "--record-dir", str(tmp_path),
                         "--steps", "2"])
    # was: blocked until the leftover ended (62 s), then "did not finish within 5 s" and exit 65
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 50
    events = read_events(log)
    assert all(record["passed"] for record in events_of(events, "node_check"))  # a passed first check: none
    assert len(events_of(events, "cycle_start")) == 1
    assert _wait_gone(int(pid_file.read_text()), 10), "the check's leftover outlived the launcher"


def test_a_check_that_times_out_with_a_daemon_holding_its_output_fails_in_time(tmp_path: Path) -> None:
    log, pid_file = tmp_path / "events.jsonl", tmp_path / "leftover.pid"
    started = time.monotonic()
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--ft-event-log", str(log),
                         "--ft-node-health-check-cmd", f"{_leftover(pid_file)} echo started; sleep 60",
                         "--ft-node-health-check-timeout", "2", WORKER, "--record-dir", str(tmp_path)])
    assert done.returncode == EXIT_NODE_EXCLUDED, done.stderr[-3000:]
    assert time.monotonic() - started < 40  # was: blocked in the second communicate() until the daemon ended
    [record] = events_of(read_events(log), "node_check")
    [command] = [c for c in record["checks"] if c["name"] == "command"]
    assert not command["ok"] and command["detail"] == "did not finish within 2 s" and command["output"] == "started"
    assert _wait_gone(int(pid_file.read_text()), 10)


def test_a_launcher_killed_during_its_check_leaves_nothing_of_the_check_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "leftover.pid"
    proc = start_launcher(["--standalone", "--nproc-per-node", "1", "--ft-event-log", "none",
                           "--ft-node-health-check-cmd", f"{_leftover(pid_file)} sleep 60",
                           "--ft-node-health-check-timeout", "100", WORKER, "--record-dir", str(tmp_path)])
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the check's leftover to start")
        os.kill(proc.pid, signal.SIGKILL)  # the launcher only: the check's helper must notice and clean up
        proc.communicate(timeout=30)
        assert _wait_gone(int(pid_file.read_text()), 15), "the check's leftover outlived the killed launcher"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def test_a_check_with_huge_output_keeps_only_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    # 400 MB of output, then its last line; the check fails, so no worker (with torch) ever starts
    check = "head -c 400000000 /dev/zero | tr '\\0' x; echo; echo last-line; exit 1"
    wrapper = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(done.returncode)")
    done = subprocess.run([sys.executable, "-c", wrapper, *FT_LAUNCHER, "--standalone", "--nproc-per-node", "1",
                           "--ft-event-log", str(log), "--ft-node-health-check-cmd", check,
                           "--ft-node-health-check-timeout", "100", WORKER],
                          env=launcher_env(), capture_output=True, text=True, timeout=150)
    assert done.returncode == EXIT_NODE_EXCLUDED, done.stderr[-3000:]
    [command] = [c for c in events_of(read_events(log), "node_check")[0]["checks"] if c["name"] == "command"]
    assert command["output"].endswith("x\nlast-line") and len(command["output"]) == MAX_OUTPUT_CHARS
    max_rss_mib = int(done.stderr.strip().splitlines()[-1]) / 1024
    assert max_rss_mib < 350, f"the launcher's peak memory was {max_rss_mib:.0f} MiB"  # was over 1 GiB
