"""The event log's lock: another user cannot block a launcher, and our own writers wait a bounded time.

Issue 21 item 7: the event log is 0644, and a user who may only read it could take a shared
``lockf`` lock on it; a launcher that locked the log itself then blocked forever at its first
record (and its forced stop's own record blocked on the same lock). Records are now serialised
by a lock file of their own, ``<log>.lock``: 0600, created by us, never followed through a
symbolic link, so no other user can open it, let alone lock it; and a writer waits for that lock
at most :data:`launcher.events.log.LOCK_WAIT_S`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher_util import WORKER, run_launcher
from tests.lock_holder import LockHolder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users may enter and read (pytest's own tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="evlock-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_another_users_lock_on_the_event_log_does_not_block_the_launcher(shared_dir: Path) -> None:
    log = shared_dir / "events.jsonl"
    log.write_text("")
    log.chmod(0o644)  # as a log of an earlier run: readable by everyone
    with LockHolder(str(log), "lockf") as nobody:
        assert nobody.result == {"locked": True}, nobody.result
        # blocked for good at its first record before issue 21: the timeout is what fails then
        out = run_launcher(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1",
                            "--ft-event-log", str(log), WORKER, "--steps", "2"], timeout=60)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[0]["event"] == "launcher_start" and records[-1]["event"] == "summary"
    assert "could not lock" not in out.stderr, out.stderr
    lock = os.stat(str(log) + ".lock")
    assert (lock.st_uid, lock.st_mode & 0o777) == (os.getuid(), 0o600)


WRITE_ONE = """
import json, sys, time
from launcher.events.log import EventLog
from launcher.events.records import CycleStart
log = EventLog(sys.argv[1], node="n", run_id="r")
started = time.monotonic()
log.record_event(CycleStart(cycle=0))
print(json.dumps({"waited": time.monotonic() - started}))
log.close()
"""


def test_a_writer_waits_for_our_own_lock_holder_but_only_a_bounded_time(shared_dir: Path) -> None:
    # Another process of ours holds the lock (a launcher stopped in the middle of a write): the
    # writer waits for it, as concurrent writers must, then writes anyway and says so.
    from launcher.events.log import LOCK_WAIT_S

    log = shared_dir / "events.jsonl"
    lock_fd = os.open(str(log) + ".lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.lockf(lock_fd, fcntl.LOCK_EX)
        writer = subprocess.run([sys.executable, "-c", WRITE_ONE, str(log)], cwd=REPO, capture_output=True,
                                text=True, timeout=LOCK_WAIT_S + 60)
    finally:
        os.close(lock_fd)
    assert writer.returncode == 0, writer.stderr
    waited = json.loads(writer.stdout)["waited"]
    assert LOCK_WAIT_S - 0.1 <= waited < LOCK_WAIT_S + 5, waited
    assert f"could not lock {log}.lock within {LOCK_WAIT_S:g} s" in writer.stderr, writer.stderr
    assert json.loads(log.read_text())["event"] == "cycle_start"
