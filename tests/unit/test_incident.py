"""Reports a monitor sent about an earlier cycle's worker never fail the current cycle."""

from __future__ import annotations

import pytest

from ft_core.wire.messages import MonitorLost, RankEscalatedMessage, RankHang
from launcher.decision.incident import about_an_earlier_worker


def hang(pid: int) -> RankHang:
    return RankHang(pid=pid, kind="heartbeat", elapsed=2.0, timeout=2.0, cause="hang: no heartbeat",
                    signal="SIGKILL", detected_at=1.0)


@pytest.mark.parametrize("event, worker_pid, earlier", [
    (hang(101), 101, False),   # the current worker
    (hang(100), 101, True),    # the previous cycle's worker, read after the restart
    (RankEscalatedMessage(pid=100), 101, True),
    (MonitorLost(exit_code=1), 101, False),  # names no worker: taken as current
    (hang(100), None, False),  # no worker known for the rank
])
def test_a_report_about_another_pid_than_the_current_worker_is_about_an_earlier_worker(event, worker_pid, earlier):
    assert about_an_earlier_worker(event, worker_pid) is earlier
