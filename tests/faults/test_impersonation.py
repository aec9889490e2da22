"""Issue 13 item 11, the attack itself: another user swaps the launcher's run directory.

With a TMPDIR that every user may write to and that lacks the sticky bit, a stranger (``nobody``,
tests/stranger.py) can rename the launcher's run directory out of the way, create one of the same
name and listen at every socket path in it. Before the fix the trampolines of the next (warm)
cycle sent it their whole environment (a secret token here) and their stdio fds, and the ranks
took its fake monitor. Now the launcher keeps its run directory out of such a TMPDIR (it says so
and uses /tmp), so there is nothing to swap; the job restarts and succeeds, and the stranger is
never contacted. (Every client also checks the server's uid: tests/unit/test_impersonation.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from tests.launcher_util import events_of, read_events, start_launcher, wait_for
from tests.other_user import Stranger

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "impersonation_worker.py")
SECRET = "ftt-secret-token-9d41a7"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the stranger as another uid")
def test_a_stranger_who_swaps_the_run_directory_gets_nothing(tmp_path):
    tmpdir = tempfile.mkdtemp(prefix="ftt-open-", dir="/tmp")
    os.chmod(tmpdir, 0o777)  # writable by everyone, no sticky bit
    trigger = tmp_path / "trap-is-set"
    events = tmp_path / "events.jsonl"
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                           "--monitor-interval", "0.05", "--warm-preload=", "--ft-event-log", str(events),
                           WORKER, str(tmp_path), str(trigger)],
                          env={"TMPDIR": tmpdir, "FTT_SECRET": SECRET})
    stranger = None
    try:
        first = wait_for(lambda: (tmp_path / "cycle0_rank0.json").exists()
                         and json.loads((tmp_path / "cycle0_rank0.json").read_text()), 60, "a worker")
        run_dir = os.path.dirname(first["monitor_socket"])
        # the warm template is up once every worker of the cycle is: the next cycle is warm
        wait_for(lambda: os.path.exists(os.path.join(run_dir, "warm.sock")), 60, "the warm template")
        names = sorted(name for name in os.listdir(run_dir) if name.endswith(".sock"))
        stranger = Stranger("steal", tmpdir, run_dir, json.dumps(names), "120")
        stranger.wait("listening")
        trigger.touch()  # rank 0 fails: the launcher restarts the workers into the trap, if any
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        lines = stranger.stop() if stranger is not None else []
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert SECRET not in json.dumps(lines), lines
    assert not [line for line in lines if "got" in line], lines  # no process of ours contacted it
    assert not [line for line in lines if "renamed" in line], lines  # nothing of ours was in reach
    assert not run_dir.startswith(tmpdir + os.sep)
    warnings = [line for line in err.splitlines() if "not using TMPDIR" in line]
    assert len(warnings) == 1 and tmpdir in warnings[0] and "sticky bit" in warnings[0], err
    assert proc.returncode == 0, err
    second = [json.loads((tmp_path / f"cycle1_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert {record["monitor_socket"] for record in second} == {
        os.path.join(run_dir, os.path.basename(record["monitor_socket"])) for record in second}
    assert [e["outcome"] for e in events_of(read_events(events), "result")] == ["succeeded"]
    assert not os.path.exists(run_dir)
