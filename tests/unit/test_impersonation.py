"""Every client refuses a server run by another user (issue 13 item 11, issue 12 section 2).

A stranger (``nobody``, tests/stranger.py) listens where one of our clients connects: a rank to
its monitor and to the launcher's control socket, the launcher to a monitor, a trampoline to the
warm template. Each client must check the server's uid right after connecting and send nothing:
no handshake, no environment, no file descriptors; the fake monitor must not be accepted even
though it answers a well-formed ``init_ok`` with a progress slot. Before the fix every client
talked to the stranger (the trampoline sent its whole environment and its stdio fds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from ft_core import FaultToleranceConfig, RankMonitorClient, RankMonitorClientError
from ft_core.monitor.link import MonitorLink
from ft_core.wire import protocol
from ft_core.wire.config import Role
from ft_core.wire.data import WorkloadAction, WorkloadControlRequest
from ft_core.wire.env import (
    FT_LAUNCHER_IPC_SOCKET_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
    FT_WARM_TEMPLATE_SOCKET_ENV_VAR,
)
from launcher.warm import trampoline
from tests.other_user import Stranger

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a stranger as another uid")

SECRET = "ftt-secret-token-5f0c1e"


@pytest.fixture
def open_dir() -> Iterator[str]:
    """A directory where the stranger can create its sockets (as after a swapped run directory)."""
    path = tempfile.mkdtemp(prefix="ftt-open-", dir="/tmp")
    os.chmod(path, 0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def nothing_reached(stranger: Stranger) -> None:
    """The stranger saw our client connect (so it was tested) and received not one byte or fd."""
    stranger.wait("got")
    got = stranger.received()
    assert got and all(line["bytes"] == 0 and line["fds"] == 0 for line in got), got


def test_a_rank_refuses_a_fake_monitor_of_another_user(open_dir, monkeypatch):
    path = os.path.join(open_dir, "rank_0.sock")
    # A fake monitor that watches nothing: a valid init_ok with null timeouts and a real slot.
    watches_nothing = FaultToleranceConfig(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None)
    init_ok = protocol.encode({"type": protocol.MSG_INIT_OK, "config": watches_nothing.sent_to(Role.RANK),
                               "sections": []})
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
    with Stranger.serve([path], reply=init_ok, slot=True) as stranger:
        client = RankMonitorClient()
        try:
            with pytest.raises(RankMonitorClientError, match=r"served by pid \d+ of uid 65534, not by this user"):
                client.init_workload_monitoring()
        finally:
            client.shutdown_workload_monitoring()
        assert not client.is_initialized
        nothing_reached(stranger)


def test_a_rank_refuses_a_fake_launcher_control_socket(open_dir, monkeypatch):
    path = os.path.join(open_dir, "launcher.sock")
    monkeypatch.setenv(FT_LAUNCHER_IPC_SOCKET_ENV_VAR, path)
    with Stranger.serve([path], reply=protocol.encode({"type": protocol.MSG_OK})) as stranger:
        request = WorkloadControlRequest(WorkloadAction.ShutdownWorkload, SECRET)
        with pytest.raises(RankMonitorClientError, match="launcher control socket .* uid 65534"):
            RankMonitorClient().send_workload_control_request(request)
        nothing_reached(stranger)


def test_the_launcher_refuses_a_fake_monitor(open_dir):
    path = os.path.join(open_dir, "rank_0.sock")
    with Stranger.serve([path], reply=protocol.encode({"type": protocol.MSG_OK})) as stranger:
        with pytest.raises(ConnectionError, match="rank monitor socket .* uid 65534"):
            MonitorLink(path)
        nothing_reached(stranger)


def test_a_trampoline_sends_nothing_to_a_fake_warm_template_and_starts_cold(open_dir):
    path = os.path.join(open_dir, "warm.sock")
    env = {"PATH": os.environ.get("PATH", ""), FT_WARM_TEMPLATE_SOCKET_ENV_VAR: path, "FTT_SECRET": SECRET}
    with Stranger.serve([path]) as stranger:
        out = subprocess.run(
            [sys.executable, "-I", "-S", trampoline.__file__, "-c",
             "import os; print(os.environ['FTT_SECRET'], os.environ.get('FT_WARM_TEMPLATE_SOCKET'))"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        nothing_reached(stranger)
        assert SECRET not in str(stranger.lines)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [SECRET, "None"]  # the cold command ran, without the template variable
    lines = [line for line in out.stderr.splitlines() if "warm template" in line]
    assert len(lines) == 1 and "uid 65534" in lines[0] and "starting the worker cold" in lines[0], out.stderr


def test_connect_unix_checks_the_servers_uid_before_returning(open_dir):
    path = os.path.join(open_dir, "x.sock")
    before = set(os.listdir("/proc/self/fd"))
    with Stranger.serve([path]) as stranger:
        with pytest.raises(protocol.ForeignServerError, match="test server socket"):
            protocol.connect_unix(path, 5, "test server")
        nothing_reached(stranger)
    assert set(os.listdir("/proc/self/fd")) == before  # the refused socket is closed
