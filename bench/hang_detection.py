"""Hang detection latency past the timeout, with the default configuration otherwise.

A real rank monitor watches a real rank that sends heartbeats and then stops. Latency is the
moment the parent sees the rank die minus (last heartbeat + timeout), so it includes the
monitor's wake-up, the signal and process exit. Run: ``python bench/hang_detection.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import emit, summarize  # noqa: E402
from ft_core import FaultToleranceConfig, RankMonitorServer  # noqa: E402
from ft_core.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR  # noqa: E402

RANK = textwrap.dedent("""
    import sys, time
    from ft_core import RankMonitorClient
    c = RankMonitorClient(); c.init_workload_monitoring()
    for _ in range(20):
        c.send_heartbeat(); time.sleep(0.02)
    c.send_heartbeat()
    print(time.monotonic(), flush=True)
    time.sleep(3600)
""")


def one_run(timeout: float) -> float:
    run_dir = tempfile.mkdtemp(prefix="ftb-")
    path = os.path.join(run_dir, "m.sock")
    # Defaults except the heartbeat timeout (the default 45 min would make a long benchmark).
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=timeout)
    monitor = RankMonitorServer.run_in_subprocess(cfg, path)
    try:
        rank = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR: path},
                                start_new_session=True)
        last_hb = float(rank.stdout.readline())
        rank.wait(timeout=timeout + 30)
        died = time.monotonic()
        rank.stdout.close()
        return died - (last_hb + timeout)
    finally:
        monitor.terminate()
        monitor.join(10)
        os.rmdir(run_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latencies = [one_run(args.timeout) for _ in range(args.runs)]
    emit({"hang_detection_latency_s": summarize(latencies, 4), "timeout_s": args.timeout}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
