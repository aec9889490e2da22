"""Scenario 3's worker: touches CUDA at import (as some user scripts do), then trains a small
model on the GPU from a fixed seed and writes the losses; cycle 0 crashes after ``CRASH_STEP``.
Writes ``losses_c<cycle>.json`` (with the device it trained on) into ``GPU_CHECK_OUT``.
"""

import json
import os
import sys
import time

import torch

torch.cuda.init()  # CUDA at import: must work in a worker forked from the warm template
_PROBE = torch.ones(1, device="cuda")

from ft_core import RankMonitorClient  # noqa: E402

STEPS, CRASH_STEP = 60, 30


def main() -> int:
    out = os.environ["GPU_CHECK_OUT"]
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    client = RankMonitorClient()
    client.init_workload_monitoring()
    torch.manual_seed(1234)
    device = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(1024, 256, device=device), torch.randn(1024, 1, device=device)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        client.send_heartbeat()
        if cycle == 0 and step == CRASH_STEP:
            break
    with open(os.path.join(out, f"losses_c{cycle}.json"), "w") as stream:
        json.dump({"device": f"{device.type}:{device.index}", "name": torch.cuda.get_device_name(device),
                   "losses": losses}, stream)
    if cycle == 0:
        # Crash only once the warm template listens, so that the restart is a warm one (as
        # bench/restart_worker.py does); bounded: a template that never comes makes a cold restart,
        # which the check reports.
        template = os.path.join(os.path.dirname(os.environ["FT_RANK_MONITOR_IPC_SOCKET"]), "warm.sock")
        deadline = time.monotonic() + 60
        while not os.path.exists(template) and time.monotonic() < deadline:
            client.send_heartbeat()
            time.sleep(0.1)
        os._exit(1)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
