"""Worker of bench/monitor_footprint.py: heartbeats at a fixed rate, then waits to be measured.

Writes ``ready_r<rank>`` (its pid) to ``BENCH_OUT`` once its client is connected, sends
``BENCH_HZ`` heartbeats per second for ``BENCH_SECONDS``, writes ``done_r<rank>``, then waits
(bounded) for ``BENCH_OUT/release`` so that the processes can be measured while all are alive.
``BENCH_CLIENT`` picks the client: ``ours``, ``nvrx`` or ``none`` (plain torchrun).

With ``BENCH_RESTART_FIRST=1`` the first cycle only makes the launcher restart the group (rank 1
exits with code 1; with ``BENCH_WAIT_TEMPLATE=1``, ours with warm restarts, it first waits until
the warm template is ready), so that the
processes are measured as they are after a restart: for ours, workers forked by the template and
the trampolines that stand in for them.
"""

import json
import os
import time

import torch  # noqa: F401  (a real worker has it; its pages are shared with ours' warm template)

out = os.environ["BENCH_OUT"]
rank = os.environ["RANK"]
if os.environ.get("BENCH_RESTART_FIRST") == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    if rank == "1":
        monitor_socket = os.environ.get("FT_RANK_MONITOR_IPC_SOCKET")
        if os.environ.get("BENCH_WAIT_TEMPLATE") == "1" and monitor_socket:
            template = os.path.join(os.path.dirname(monitor_socket), "warm.sock")
            deadline = time.monotonic() + 120
            while not os.path.exists(template) and time.monotonic() < deadline:
                time.sleep(0.05)
        os._exit(1)
    time.sleep(300)  # rank 0: stopped by the launcher when rank 1 fails
    os._exit(1)
kind = os.environ.get("BENCH_CLIENT", "ours")
if kind == "ours":
    from ft_core import RankMonitorClient
elif kind == "nvrx":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
else:
    RankMonitorClient = None


def write(name: str, value: object) -> None:
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as stream:
        json.dump(value, stream)
    os.replace(tmp, os.path.join(out, name))


client = None
if RankMonitorClient is not None:
    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()
write(f"ready_r{rank}", os.getpid())
period = 1.0 / float(os.environ.get("BENCH_HZ", "10"))
end = time.monotonic() + float(os.environ["BENCH_SECONDS"])
next_beat = time.monotonic()
while time.monotonic() < end:
    if client is not None:
        client.send_heartbeat()
    next_beat += period
    time.sleep(max(0.0, next_beat - time.monotonic()))
write(f"done_r{rank}", os.getpid())
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(out, "release")) and time.monotonic() < deadline:
    if client is not None:
        client.send_heartbeat()
    time.sleep(period)
if client is not None:
    client.shutdown_workload_monitoring()
