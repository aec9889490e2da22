"""Worker of bench/restart_latency.py: records when it started and when its group was ready.

``BENCH_CLIENT`` picks the fault tolerance client it connects (``ours``, ``nvrx``, ``none``).
"""

import time

STARTED = time.time()  # first statement: "replacement process started"

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

out = os.environ["BENCH_OUT"]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def write(name, value):
    with open(os.path.join(out, f"{name}_a{attempt}_r{rank}"), "w") as stream:
        json.dump(value, stream)


write("started", STARTED)
if os.environ.get("BENCH_CLIENT") == "ours":
    from ft_core import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
elif os.environ.get("BENCH_CLIENT") == "nvrx":  # NVRx's client (it imports torch itself)
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
write("ready", time.time())
if attempt == 0 and os.environ.get("BENCH_FIRST_WAIT") == "1" and rank == 1:
    template = os.path.join(os.path.dirname(os.environ["FT_RANK_MONITOR_IPC_SOCKET"]), "warm.sock")
    deadline = time.time() + 60
    while not os.path.exists(template) and time.time() < deadline:
        time.sleep(0.05)
planned_crashes_done = len([n for n in os.listdir(out) if n.startswith("crash_")])
if planned_crashes_done < int(os.environ.get("BENCH_CRASHES", "1")) and rank == 1:
    write("crash", time.time())
    os._exit(1)
dist.all_reduce(t)  # rank 0 would block here until the crash is noticed
dist.destroy_process_group()
sys.exit(0)
