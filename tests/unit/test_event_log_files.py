"""The event log and its lock file: this user's regular files, never reached through a link (issue 21 item 7).

A usage error at the start (ft_launcher exits 2) rather than records another user could block
or redirect. The lock itself, against another user and against our own writers, is tested with
real processes in tests/integration/test_event_log_locks.py.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from launcher.events.log import LOCK_SUFFIX, EventLog
from launcher.events.records import CycleStart
from launcher.exit_codes import LauncherUsageError

NOBODY = 65534


def test_the_log_gets_a_private_lock_file_and_records_as_before(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), node="n", stream=io.StringIO(), run_id="r")
    try:
        log.record_event(CycleStart(cycle=0))
    finally:
        log.close()
    lock = Path(str(path) + LOCK_SUFFIX).stat()
    assert (lock.st_uid, stat.S_IMODE(lock.st_mode)) == (os.getuid(), 0o600)
    assert '"event":"cycle_start"' in path.read_text()


@pytest.mark.skipif(os.getuid() != 0, reason="gives files to another user (chown)")
@pytest.mark.parametrize(("planted", "message"), [
    ("log-of-another-user", f"event log .*events.jsonl belongs to uid {NOBODY}"),
    ("lock-of-another-user", f"event log's lock file .*events.jsonl.lock belongs to uid {NOBODY}"),
    ("log-is-a-link", "event log .*events.jsonl is a symbolic link"),
    ("lock-is-a-link", "lock file .*events.jsonl.lock is a symbolic link"),
])
def test_a_planted_log_or_lock_file_is_a_usage_error(tmp_path: Path, planted: str, message: str) -> None:
    path = tmp_path / "events.jsonl"
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    target = path if planted.startswith("log") else Path(str(path) + LOCK_SUFFIX)
    if planted.endswith("link"):
        target.symlink_to(secret)
    else:
        target.write_text("")
        target.chmod(0o666)
        os.chown(target, NOBODY, NOBODY)
    with pytest.raises(LauncherUsageError, match=message):
        EventLog(str(path), node="n", stream=io.StringIO())
    assert secret.read_text() == "root only\n"


class _WriteCalls(io.StringIO):
    """A stream that remembers each write call (stderr is write-through: one call, one syscall)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_stderr_line_is_one_write_so_a_worker_line_cannot_land_inside_it() -> None:
    # ft_launcher's stderr is the workers' stderr too; print() writes the newline in a second call,
    # and a worker's log line written in between was glued to the end of the launcher's line.
    stream = _WriteCalls()
    log = EventLog(None, node="n", stream=stream)
    log.outcome_line(0, "rank 0 (pid 1) requested ShutdownWorkload: ConfigError: x", "no restart")
    log.summary()
    assert stream.calls, "nothing printed"
    assert all(call.endswith("\n") and call.count("\n") == 1 for call in stream.calls), stream.calls
