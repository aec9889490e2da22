"""The node check before each rendezvous, with real launchers: a node that fails it never joins."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.exit_codes import EXIT_NODE_EXCLUDED
from tests.launcher_util import WORKER, events_of, read_events, run_launcher

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
