"""A 2-rank run with a graceful stop that completes its training, then waits: for signal-after-end tests.

``python finish_then_wait.py '<json config>'`` under ft_launcher (gloo on CPU). Config keys:
    front: "lightning" (FaultToleranceCallback) or "integration" (ft_core.integration); required
    root: report files (report_rank<R>_cycle<C>.jsonl) go here; required
    steps: training steps (default 5)

After training (``fit`` returned, or ``shutdown()``: the graceful stop's handlers are gone) the
rank reports "finished" and waits (at most 60 s) until the file ``root/release`` exists, then
exits 0. Reports (JSON lines): "finished", "released".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
CYCLE = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))


def report(root: str, op: str, **fields: Any) -> None:
    with open(Path(root) / f"report_rank{RANK}_cycle{CYCLE}.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps({"op": op, "rank": RANK, "pid": os.getpid(), **fields}) + "\n")


def run_integration(cfg: dict[str, Any]) -> None:
    import ft_core.client.integration as ft_integration

    dist.init_process_group("gloo")
    ft_integration.setup(Path(cfg["root"]) / "ckpt", graceful_stop=True)
    value = torch.ones(4)
    for step in range(1, int(cfg.get("steps", 5)) + 1):
        ft_integration.on_training_step_start(step)
        dist.all_reduce(value)
        ft_integration.on_training_step_end()
    ft_integration.shutdown()
    dist.destroy_process_group()


def run_lightning(cfg: dict[str, Any]) -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    from ptl_resiliency import FaultToleranceCallback

    trainer = Trainer(
        default_root_dir=cfg["root"], accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, max_steps=int(cfg.get("steps", 5)), limit_val_batches=0,
        callbacks=[FaultToleranceCallback(autoresume=True, calculate_timeouts=False, graceful_stop={
            "checkpoint_path": os.path.join(cfg["root"], "stop.ckpt")})],
    )
    trainer.fit(BoringModel())


def main() -> int:
    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    (run_lightning if cfg["front"] == "lightning" else run_integration)(cfg)
    report(cfg["root"], "finished")
    release = Path(cfg["root"]) / "release"
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    report(cfg["root"], "released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
