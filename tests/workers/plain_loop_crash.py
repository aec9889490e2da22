"""A plain training loop on ft_core.client.integration WITHOUT torch's ``@record``, failing by plan.

``python plain_loop_crash.py '<json config>'`` under ft_launcher (gloo on CPU, 2 ranks; each step
all-reduces a tensor). Config keys:

    ckpt_dir: the integration's checkpoint directory (its timeouts file); required
    steps: steps of a complete run (default 40)
    rank: the rank that fails (default 1)
    faults: one entry per cycle (cycle N uses faults[N]; none left: the run completes), each
        {"step": S, "raise": "ValueError", "message": "..."}: raise that built-in exception at
        step S; its message may hold {random} (a random number), {tmpdir} (a fresh
        tempfile.mkdtemp() directory), {uuid} (a fresh uuid4) and {time} (now, ISO 8601), as
        real errors carry incidental text that differs every run;
        {"step": S, "kill": "SIGKILL"}: the rank is killed by that signal at step S, as the OOM
        killer or an operator kills it from outside (it sends it to itself: the launcher sees
        the same death).

No ``@record`` anywhere: what the launcher learns about the exception comes from the client's
own recording.
"""

from __future__ import annotations

import builtins
import datetime
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist

import ft_core.client.integration as ft_integration


def fault_message(template: str) -> str:
    return template.format(random=random.randrange(10**6), tmpdir=tempfile.mkdtemp(), uuid=uuid.uuid4(),
                           time=datetime.datetime.now().isoformat(timespec="seconds"))


def main() -> int:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    faults = cfg.get("faults", [])
    fault = faults[cycle] if cycle < len(faults) and rank == cfg.get("rank", 1) else None
    ft_integration.setup(cfg["ckpt_dir"])
    value = torch.ones(4)
    for step in range(int(cfg.get("steps", 40))):
        ft_integration.on_training_step_start(step)
        if fault is not None and step == fault["step"]:
            if "kill" in fault:
                os.kill(os.getpid(), signal.Signals[fault["kill"]])
                signal.pause()  # not reached for SIGKILL: the signal ends the process
            raise getattr(builtins, fault["raise"])(fault_message(fault.get("message", "")))
        dist.all_reduce(value)
        time.sleep(0.01)
        ft_integration.on_training_step_end()
    ft_integration.shutdown()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
