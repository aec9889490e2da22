"""Scenario 2's worker: each cycle records the GPU's free memory and process list before it
allocates ``GPU_CHECK_FRACTION`` of the device's memory, then: cycle 0 hangs in a GPU kernel
(heartbeats stop; the monitor kills it while the kernel runs), cycle 1 crashes (exit 1), cycle 2
finishes. One JSON line per cycle goes to ``GPU_CHECK_OUT/samples.jsonl``.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import torch

from ft_core import RankMonitorClient


def compute_apps() -> list[int]:
    """Pids the GPU lists as compute processes (empty without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def main() -> int:
    out = os.environ["GPU_CHECK_OUT"]
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fraction = float(os.environ.get("GPU_CHECK_FRACTION", "0.6"))
    pids_file = os.path.join(out, "pids")
    old = [int(p) for p in open(pids_file).read().split()] if os.path.exists(pids_file) else []
    with open(pids_file, "a") as stream:
        stream.write(f"{os.getpid()}\n")
    torch.cuda.set_device(0)
    free, total = torch.cuda.mem_get_info()  # creates the context: no allocation of ours yet
    sample = {"cycle": cycle, "pid": os.getpid(), "free_mib": free / 2**20, "total_mib": total / 2**20,
              "apps": compute_apps(), "old_pids": old, "alloc_ok": False, "alloc_error": None}
    try:
        block = torch.empty(int(total * fraction), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        sample["alloc_ok"] = True
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        sample["alloc_error"] = str(exc).splitlines()[0][:200]
    with open(os.path.join(out, "samples.jsonl"), "a") as stream:
        stream.write(json.dumps(sample) + "\n")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    for _ in range(5):
        client.send_heartbeat()
        time.sleep(0.05)
    if cycle == 0:
        torch.cuda._sleep(1 << 62)  # a kernel that spins for ages (torch's own test helper)
        torch.cuda.synchronize()  # blocks: no heartbeats; the monitor stops us mid-kernel
    if cycle == 1:
        os._exit(1)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
