"""Issue 12 section 2: a rank monitor's socket goes wherever the caller chooses.

``RankMonitorServer.run_in_subprocess(cfg, ipc_socket_path=...)`` and a client pointed at that
path (``FT_RANK_MONITOR_IPC_SOCKET``) work with the socket in /tmp, in $TMPDIR, in a 0755
directory made by ``tempfile.mkdtemp()`` + chmod or by ``mkdir``, and in a nested job directory.
Security comes from the socket (0600 from birth, both ends check the peer's uid), so the only
directories refused are those where another user could swap the socket: writable by others (or
the group) without the sticky bit, or owned by another user. Real monitors, a real client.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import uuid

import pytest

from ft_core import FaultToleranceConfig, RankMonitorClient, RankMonitorServer
from ft_core.monitor.link import MonitorLink
from ft_core.wire import protocol
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR


@pytest.fixture
def scratch(run_dir: str) -> str:
    """A short directory under /tmp that the test shapes (modes, owners); removed afterwards."""
    return run_dir


def _mkdtemp_0755(scratch: str) -> str:
    path = tempfile.mkdtemp(dir=scratch)
    os.chmod(path, 0o755)
    return os.path.join(path, "rank_0.sock")


def _mkdir_0755(scratch: str) -> str:
    # as a shell's `mkdir` under the common umask 022 would make it
    subprocess.run(["sh", "-c", f"umask 022 && mkdir {scratch}/made-by-mkdir"], check=True)
    return os.path.join(scratch, "made-by-mkdir", "rank_0.sock")


def _job_dir(scratch: str) -> str:
    job = os.path.join(scratch, "project", "job-1234")
    os.makedirs(job)
    for level in (os.path.join(scratch, "project"), job):
        os.chmod(level, 0o755)
    return os.path.join(job, "rank_0.sock")


def _tmp(_scratch: str) -> str:
    return f"/tmp/ftt-{uuid.uuid4().hex[:12]}.sock"


def _tmpdir(_scratch: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"ftt-{uuid.uuid4().hex[:8]}.sock")


@pytest.mark.parametrize("where", [_tmp, _tmpdir, _mkdtemp_0755, _mkdir_0755, _job_dir],
                         ids=["/tmp", "$TMPDIR", "mkdtemp-0755", "mkdir-0755", "job-dir"])
def test_a_monitor_and_its_rank_work_with_the_socket_where_the_caller_puts_it(scratch, where, monkeypatch):
    path = where(scratch)
    handle = RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), ipc_socket_path=path)
    client = RankMonitorClient()
    try:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        link = MonitorLink(path)  # the launcher's end connects too
        monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
        client.init_workload_monitoring()
        client.send_heartbeat()
        client.shutdown_workload_monitoring()
        link.close()  # "launcher_bye": the monitor stops by itself
        handle.join(10)
        assert handle.exitcode == 0
    finally:
        client.shutdown_workload_monitoring()
        if handle.is_alive():
            handle.kill()
            handle.join(10)
    assert not os.path.exists(path)  # the monitor removed its socket


def test_a_missing_socket_directory_is_created_private(scratch):
    path = os.path.join(scratch, "new", "rank_0.sock")
    handle = RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), path)
    try:
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    finally:
        handle.terminate()
        handle.join(10)


@pytest.mark.parametrize("mode, why", [
    (0o777, "writable by others without the sticky bit"),
    (0o775, "writable by its group without the sticky bit"),
])
def test_a_directory_others_can_write_without_the_sticky_bit_is_refused(scratch, mode, why):
    shared = os.path.join(scratch, "shared")
    os.mkdir(shared)
    os.chmod(shared, mode)
    with pytest.raises(PermissionError, match=why) as err:
        RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), os.path.join(shared, "m.sock"))
    assert repr(shared) in str(err.value) and "sticky bit such as /tmp" in str(err.value)
    assert os.listdir(shared) == []


def test_a_directory_with_the_sticky_bit_is_accepted(scratch):
    sticky = os.path.join(scratch, "sticky")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    path = os.path.join(sticky, "m.sock")
    handle = RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        handle.terminate()
        handle.join(10)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another uid")
def test_a_directory_owned_by_another_user_is_refused(scratch):
    theirs = os.path.join(scratch, "theirs")
    os.mkdir(theirs, 0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), os.path.join(theirs, "m.sock"))


def test_something_else_at_the_socket_path_is_left_alone(scratch):
    path = os.path.join(scratch, "precious.yaml")
    with open(path, "w") as stream:
        stream.write("fault_tolerance: {}\n")
    with pytest.raises(FileExistsError, match="not a socket"):
        RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), path)
    with open(path) as stream:
        assert stream.read() == "fault_tolerance: {}\n"


def test_prepare_socket_path_replaces_only_a_socket_of_this_user(scratch):
    stale = os.path.join(scratch, "stale.sock")
    protocol.listen_unix(stale, 1).close()  # a socket left by a dead process
    protocol.prepare_socket_path(stale)
    assert not os.path.exists(stale)
    regular = os.path.join(scratch, "file")
    open(regular, "w").close()
    with pytest.raises(FileExistsError, match="not a socket"):
        protocol.prepare_socket_path(regular)
    assert os.path.exists(regular)
