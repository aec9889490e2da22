"""Reports what a warm-started worker sees, to check it looks like a fresh interpreter."""

import json
import os
import random
import sys

import warm_probe_state  # a module next to this script: fresh import state per process

from ft_core.wire.atomic import atomic_write_text

warm_probe_state.imports.append(os.getpid())
rank = int(os.environ["RANK"])
cycle = int(os.environ["FT_LAUNCHER_CYCLE"])
print(f"probe rank {rank} cycle {cycle} stdout", flush=True)
print(f"probe rank {rank} cycle {cycle} stderr", file=sys.stderr, flush=True)
atomic_write_text(os.path.join(sys.argv[1], f"probe_c{cycle}_r{rank}.json"), json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "imports": list(warm_probe_state.imports),
    "random": random.random(),
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "sid": os.getsid(0),
    "env_rank": os.environ["RANK"],
    "local_rank": os.environ["LOCAL_RANK"],
    "socket": os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"),
    "torch_loaded_at_start": "torch" in sys.modules,
    "niceness": os.getpriority(os.PRIO_PROCESS, 0),
}))
if cycle == 0 and len(sys.argv) > 4 and sys.argv[4] == "wait-template":
    # Give the launcher's template time to finish importing torch, so later cycles are warm.
    import time

    template = os.path.join(os.path.dirname(os.environ["FT_RANK_MONITOR_IPC_SOCKET"]), "warm.sock")
    deadline = time.monotonic() + 90
    while not os.path.exists(template) and time.monotonic() < deadline:
        time.sleep(0.05)
if cycle < int(sys.argv[2]) and rank == 1:
    sys.exit(int(sys.argv[3]))
