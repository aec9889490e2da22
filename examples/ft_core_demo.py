"""A one-minute look at ft_core without a launcher: a rank hangs and its monitor stops it.

Run: ``python examples/ft_core_demo.py``. It starts a rank monitor, starts a rank that sends
heartbeats for a second and then hangs, and shows the monitor catching the hang on its
deadline and killing the rank.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

from ft_core import FaultToleranceConfig, RankMonitorServer
from ft_core.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

RANK_CODE = textwrap.dedent("""
    import time
    from ft_core import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()
    for step in range(10):
        time.sleep(0.1)  # a training step
        client.send_heartbeat()
    print("rank: now hanging (no more heartbeats)", flush=True)
    time.sleep(3600)
""")


def main() -> int:
    run_dir = tempfile.mkdtemp(prefix="ft-demo-")
    socket_path = os.path.join(run_dir, "rank0.sock")
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=10, rank_heartbeat_timeout=1.0)
    monitor = RankMonitorServer.run_in_subprocess(cfg, socket_path)
    print(f"monitor pid {monitor.pid} listening on {socket_path}")
    env = {**os.environ, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR: socket_path, "RANK": "0"}
    started = time.monotonic()
    rank = subprocess.Popen([sys.executable, "-c", RANK_CODE], env=env, start_new_session=True)
    try:
        code = rank.wait(timeout=60)
        print(f"rank exited with {code} after {time.monotonic() - started:.2f} s "
              f"(negative = killed by signal {-code})")
        return 0 if code < 0 else 1
    finally:
        if rank.poll() is None:
            rank.kill()
        monitor.terminate()
        monitor.join(10)
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
