"""A live ft_launcher is closed to strangers: its run directory is 0700, its sockets (rank monitors,
control socket, warm template) are 0600, and another uid is refused by each of them even when the
permissions are opened up.

This starts a real ft_launcher; the socket servers alone are in test_security.py, and that a
warm-started worker's own requests are served is a case of the fault matrix
(tests/faults/test_fault_matrix.py, "workload-control-after-a-warm-restart").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from ft_core.wire import protocol
from tests.launcher_util import events_of, read_events, start_launcher, wait_for
from tests.other_user import as_nobody
from tests.unit.test_security import request_frame

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "faults_worker.py")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to switch to another uid")
def test_a_running_launcher_is_closed_to_other_users(tmp_path):
    # A TMPDIR that other users may traverse, so that only the launcher's own modes are tested.
    tmpdir = tempfile.mkdtemp(prefix="ftt-open-", dir="/tmp")
    os.chmod(tmpdir, 0o711)
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.05", "--warm-preload=",
                           "--ft-event-log", str(tmp_path / "events.jsonl"), WORKER, "--dir", str(tmp_path),
                           "--steps", "2000"], env={"TMPDIR": tmpdir})
    try:
        record = wait_for(lambda: (tmp_path / "cycle0_rank0.json").exists()
                          and json.loads((tmp_path / "cycle0_rank0.json").read_text()), 60, "a worker")
        run_dir = os.path.dirname(record["control_socket"])
        # (the worker does not see the template's socket: the trampoline keeps it to itself)
        sockets = {"monitor": record["monitor_socket"], "control": record["control_socket"],
                   "warm template": os.path.join(run_dir, "warm.sock")}
        assert os.path.dirname(sockets["monitor"]) == run_dir, sockets
        # the template starts once every worker of the cycle is up, a moment after the first one
        wait_for(lambda: os.path.exists(sockets["warm template"]), 60, "the warm template's socket")
        info = os.stat(run_dir)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        for name, path in sockets.items():
            mode = os.stat(path).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, name
        hello = {
            "monitor": protocol.encode({"type": "init", "protocol": protocol.PROTOCOL_VERSION}),
            "control": request_frame(),
            "warm template": protocol.encode({"type": "spawn", "argv": ["-c", "pass"], "env": {}, "cwd": "/"}),
        }
        # Layer 1: the directory keeps them out.
        for name, path in sockets.items():
            assert as_nobody(path, hello[name])["connect"] == "Permission denied", name
        # Layer 2: with the directory and sockets opened up, each server checks the peer's uid.
        os.chmod(run_dir, 0o711)
        for path in sockets.values():
            os.chmod(path, 0o666)
        for name, path in sockets.items():
            assert as_nobody(path, hello[name]) == {"connect": "ok", "reply": "<closed>"}, name
        os.chmod(run_dir, 0o700)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        left = os.listdir(tmpdir)
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert proc.returncode == 1, err  # stopped by SIGTERM; the workers died of it (no handler): 1
    assert not left, left
    events = read_events(tmp_path / "events.jsonl")
    assert not events_of(events, "control_request") and not events_of(events, "failure")
    assert not os.path.exists(run_dir)
