"""Memory of a rank monitor and of ft_launcher, and monitor CPU at 10 heartbeats/s.

Run: ``python bench/monitor_footprint.py [--seconds S]``. Memory is read from
``/proc/<pid>/smaps_rollup`` (RSS, PSS, USS); CPU is the monitor's user+system time while a rank
sends 10 heartbeats per second, scaled to one minute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import emit, proc_cpu_seconds, proc_memory_kb  # noqa: E402
from ft_core import FaultToleranceConfig, RankMonitorServer  # noqa: E402
from ft_core.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR  # noqa: E402

RANK = textwrap.dedent("""
    import sys, time
    from ft_core import RankMonitorClient
    c = RankMonitorClient(); c.init_workload_monitoring()
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        c.send_heartbeat(); time.sleep(0.1)
    c.shutdown_workload_monitoring()
""")

LAUNCHED = textwrap.dedent("""
    import os, json, time
    from ft_core import RankMonitorClient
    c = RankMonitorClient(); c.init_workload_monitoring()
    print(json.dumps({"worker": os.getpid(), "launcher": os.getppid()}), flush=True)
    time.sleep(float(os.environ["HOLD"]))
""")


def monitor_figures(seconds: float) -> dict:
    run_dir = tempfile.mkdtemp(prefix="ftb-")
    path = os.path.join(run_dir, "m.sock")
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=60, rank_section_timeouts={"step": 60})
    monitor = RankMonitorServer.run_in_subprocess(cfg, path)
    try:
        rank = subprocess.Popen([sys.executable, "-c", RANK, str(seconds)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR: path})
        rank.stdout.readline()
        cpu0, t0 = proc_cpu_seconds(monitor.pid), time.monotonic()
        rank.wait(timeout=seconds + 30)
        cpu1, t1 = proc_cpu_seconds(monitor.pid), time.monotonic()
        memory = proc_memory_kb(monitor.pid)
        rank.stdout.close()
    finally:
        monitor.terminate()
        monitor.join(10)
        os.rmdir(run_dir)
    return {"monitor_memory_kb": memory, "monitor_cpu_s_per_min_at_10hz": round((cpu1 - cpu0) / (t1 - t0) * 60, 4)}


def launcher_figures() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as stream:
            stream.write(LAUNCHED)
        proc = subprocess.Popen([sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", "1", script],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "HOLD": "3"})
        pids = json.loads(proc.stdout.readline())
        memory = proc_memory_kb(pids["launcher"])
        proc.wait(timeout=60)
        proc.stdout.close()
    return {"launcher_memory_kb": memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    emit({**monitor_figures(args.seconds), **launcher_figures()}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
