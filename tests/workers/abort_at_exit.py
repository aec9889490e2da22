"""A 2-rank run (gloo on CPU, ``ft_core.integration``) whose rank 0 aborts: ``abort_at_exit.py ROOT``.

For tests/integration/test_abort_at_exit.py. Each rank trains 3 steps (an all-reduce each), then
ends its training cleanly (``ft_core.integration.shutdown()``, which tells its monitor); then rank
0 aborts at once (SIGABRT), as a process whose gloo group is still alive at exit can, while rank 1
goes on for a second (writing its last files) and exits 0. With ``--abort-early`` rank 0 aborts
before its training ended instead: a crash like any other.

Reports (JSON lines in ``ROOT/report_rank<R>_cycle<C>.jsonl``): "finished" after the clean end,
"released" when rank 1 is about to exit 0. Core dumps are off (the abort would write one).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
CYCLE = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))


def report(root: Path, op: str) -> None:
    with open(root / f"report_rank{RANK}_cycle{CYCLE}.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps({"op": op, "rank": RANK, "pid": os.getpid()}) + "\n")


def main() -> int:
    import ft_core.integration as ft_integration

    root = Path(sys.argv[1])
    early = "--abort-early" in sys.argv[2:]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ft_integration.setup(root / "ckpt")
    value = torch.ones(4)
    for step in range(1, 4):
        ft_integration.on_training_step_start(step)
        dist.all_reduce(value)
        ft_integration.on_training_step_end()
    if early and RANK == 0:
        os.abort()  # during the training: a failure
    ft_integration.shutdown()
    report(root, "finished")
    if RANK == 0:
        os.abort()  # after the clean end: "finished, then aborted at exit"
    time.sleep(1.0)
    report(root, "released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
