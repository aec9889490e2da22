"""Reports a monitor sent about an earlier cycle's worker never fail the current cycle."""

from __future__ import annotations

import pytest

from launcher.incident import about_an_earlier_worker


@pytest.mark.parametrize("event, worker_pid, earlier", [
    ({"type": "rank_hang", "pid": 101}, 101, False),   # the current worker
    ({"type": "rank_hang", "pid": 100}, 101, True),    # the previous cycle's worker, read after the restart
    ({"type": "rank_escalated", "pid": 100}, 101, True),
    ({"type": "rank_hang"}, 101, False),               # no pid: taken as current
    ({"type": "rank_hang", "pid": "100"}, 101, False),  # not a pid
    ({"type": "rank_hang", "pid": True}, 1, False),
    ({"type": "rank_hang", "pid": 100}, None, False),  # no worker known for the rank
])
def test_a_report_about_another_pid_than_the_current_worker_is_about_an_earlier_worker(event, worker_pid, earlier):
    assert about_an_earlier_worker(event, worker_pid) is earlier
