"""Worker of tests/faults/test_impersonation.py: ``impersonation_worker.py OUT_DIR TRIGGER``.

Connects to its monitor and writes ``cycle<C>_rank<R>.json`` (pid, sockets) in ``OUT_DIR``. In
cycle 0 it sends heartbeats until ``TRIGGER`` exists (the test sets its trap first); then rank 0
exits 1, so the launcher restarts the workers (warm), and the others keep going until stopped.
In later cycles it disconnects and exits 0.
"""

import json
import os
import sys
import time

from ft_core import RankMonitorClient
from ft_core.wire.atomic import atomic_write_text
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

out_dir, trigger = sys.argv[1], sys.argv[2]
cycle, rank = os.environ["FT_LAUNCHER_CYCLE"], os.environ["RANK"]
client = RankMonitorClient()
client.init_workload_monitoring()
atomic_write_text(os.path.join(out_dir, f"cycle{cycle}_rank{rank}.json"), json.dumps({
    "pid": os.getpid(), "cycle": int(cycle), "rank": int(rank),
    "monitor_socket": os.environ[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR],
    "control_socket": os.environ[FT_LAUNCHER_IPC_SOCKET_ENV_VAR],
}))
if cycle == "0":
    deadline = time.monotonic() + 120
    while not os.path.exists(trigger):
        if time.monotonic() > deadline:
            sys.exit(3)
        client.send_heartbeat()
        time.sleep(0.05)
    if rank == "0":
        sys.exit(1)
    while True:
        client.send_heartbeat()
        time.sleep(0.05)
client.shutdown_workload_monitoring()
