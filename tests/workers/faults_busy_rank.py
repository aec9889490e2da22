"""A rank that sends heartbeats as fast as it can for a while, then hangs (stdlib + ft_core).

``python faults_busy_rank.py SECONDS``: connects to the monitor named by
FT_RANK_MONITOR_IPC_SOCKET, prints ``{"op": "ready"}``, sends heartbeats in a tight loop for
SECONDS, prints ``{"op": "burst", "count": N, "seconds": S, "end": MONOTONIC}`` and then sleeps
until its monitor stops it.
"""

import json
import sys
import time

from ft_core import RankMonitorClient


def main() -> int:
    duration = float(sys.argv[1])
    client = RankMonitorClient()
    client.init_workload_monitoring()
    print(json.dumps({"op": "ready"}), flush=True)
    beat = client.send_heartbeat
    clock = time.monotonic
    count = 0
    start = clock()
    end = start + duration
    now = start
    while now < end:
        for _ in range(1000):
            beat()
        count += 1000
        now = clock()
    print(json.dumps({"op": "burst", "count": count, "seconds": now - start, "end": now}), flush=True)
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
