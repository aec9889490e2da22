"""``make demo``'s scenario: examples/demo/run_demo.py, as the Makefile runs it, in a scratch run dir.

2 ranks of Lightning on CPU under scripts/autoresume.sh and the real ft_launcher; rank 1 freezes,
the hang is detected, the workers restart, resume from their checkpoint and finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launcher_util import events_of, launcher_env, read_events

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo" / "run_demo.py"

pytestmark = pytest.mark.slow


def run_demo(*args: str, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, str(DEMO), *args], cwd=REPO, env=launcher_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the demo did not finish in {timeout} s:\n{out[-5000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_demo_detects_the_hang_restarts_resumes_and_finishes(tmp_path):
    run_dir = tmp_path / "demo"
    result = run_demo("--run-dir", str(run_dir), "--timeout", "100", timeout=115)
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    assert "demo OK" in out

    events = read_events(run_dir / "ft_events.jsonl")
    failures = [f for f in events_of(events, "failure") if f["cause_kind"] != "terminated"]
    frozen = [f for f in failures if f["rank"] == 1]
    assert frozen and frozen[0]["cycle"] == 0 and frozen[0]["hang_kind"] == "heartbeat", out[-6000:]
    assert frozen[0]["timeout"] == 3.0
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
    assert [r["outcome"] for r in events_of(events, "result")] == ["succeeded"]

    # The summary says what failed, when, and how long detection and restart took.
    summary = out[out.index("==== demo summary ===="):]
    assert "rank 1 froze (simulated fault: SIGSTOP" in summary
    assert f"cycle 0, rank 1 (pid {frozen[0]['worker_pid']}): {frozen[0]['cause']}" in summary
    assert "s after it froze" in summary and "cycle 1 started" in summary
    assert "trained from the checkpoint at step" in summary
    state = run_dir / "ft_state" / "_ft_state.json"
    assert f"timeouts file {state}" in summary
    assert json.loads(state.read_text())["hb_timeouts"]["were_calculated"] is True
    flag = json.loads((run_dir / "finished.flag").read_text())
    assert flag["reason"] == "max_steps=120 reached"
    history = (run_dir / "history.tsv").read_text().splitlines()
    assert len(history) == 2 and history[1].endswith("finished: flag file present")


def test_demo_never_deletes_a_directory_it_did_not_create(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data.txt").write_text("keep me\n")
    result = run_demo("--run-dir", str(precious), timeout=60)
    assert result.returncode != 0
    assert "was not created by the demo; refusing to delete it" in result.stdout
    assert (precious / "data.txt").read_text() == "keep me\n"
