"""A restarted rank tells its monitor where it resumed from; the monitor relays it to the launcher.

``ft_report`` sets the relayed step against the step the failure happened at (the steps redone).
"""

from __future__ import annotations

from ft_core import FaultToleranceConfig
from ft_core.monitor.link import MonitorLink
from tests.monitor_events import received, wait_event


def test_report_resumed_reaches_the_launcher_once_even_when_called_before_init(start_monitor, spawn_rank):
    handle, path = start_monitor(FaultToleranceConfig(initial_rank_heartbeat_timeout=60, rank_heartbeat_timeout=60))
    link = MonitorLink(path)
    try:
        rank = spawn_rank([
            ["try", "report_resumed", 136, "jit"],  # before init: sent at init
            ["init"],
            ["try", "report_resumed", -1, "jit"],
            ["try", "report_resumed", 5, "yesterday"],
            ["try", "report_resumed", True, "jit"],
            ["shutdown"],
        ], path, {"RANK": "3", "LOCAL_RANK": "0"})
        assert rank.next_event("try")["error"] is None
        assert "'step' must be an int" in rank.next_event("try")["error"]
        assert "'source' must be one of jit, jit_shared, checkpoint, scratch" in rank.next_event("try")["error"]
        assert "'step' must be an int" in rank.next_event("try")["error"]
        assert rank.wait(30) == 0
        resumed = wait_event(link, "rank_resumed")
        assert (resumed["step"], resumed["source"], resumed["rank"], resumed["local_rank"]) == (136, "jit", 3, 0)
        assert received(link, "rank_resumed") == []
    finally:
        link.close()
