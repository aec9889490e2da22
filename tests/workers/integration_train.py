"""A 2-rank training loop driven by ft_core.client.integration, configured by JSON, for tests.

``python integration_train.py '<json config>'`` under ft_launcher (gloo on CPU). Each step
all-reduces a tensor, so ranks wait for each other as in DDP.

Config keys:
    ckpt_dir: checkpoint directory (the timeouts file goes there too); required
    report_dir: where report_rank<R>_cycle<C>.jsonl files go; required
    steps: the run is complete after this step (default 20)
    ckpt_every: save a checkpoint every N steps (default 5)
    eval_every, eval_steps: evaluate every N steps with M eval steps (default: no evaluation)
    step_sleep: seconds per step (default 0.02)
    calculate: calculate_timeouts (default false)
    hang: {"where": "setup"|"step"|"checkpointing"|"between", "rank": R, "cycle": C, "step": S}
          -> sleep 600 s there (in "setup": before the first step)
    graceful_stop: passed to setup(graceful_stop=...); on should_stop() the loop saves and leaves
    signal_self: {"rank": R, "step": S, "signal": "SIGUSR1"} -> that rank signals itself at step S
    report_steps: report every step ("step")

Reports (one JSON object per line): "started" (start step, open sections, timeouts),
"checkpoint" (step, timeouts after the save), "hanging", "step", "stopped" (the step the graceful
stop came after, the signal), "end" (step, timeouts after shutdown's final update, train_iters).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import ft_core.client.integration as ft_integration
from ft_core.wire.atomic import atomic_write_text

HANG_SECONDS = 600.0


def main() -> int:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    ckpt_dir = Path(cfg["ckpt_dir"])
    ckpt_path = ckpt_dir / "checkpoint.json"
    report_path = Path(cfg["report_dir"]) / f"report_rank{rank}_cycle{cycle}.jsonl"
    hang = cfg.get("hang") or {}
    hang_here = hang.get("rank", rank) == rank and hang.get("cycle", cycle) == cycle

    def report(op: str, client: Any = None, **fields: Any) -> None:
        client = client or ft_integration.get_rank_monitor_client()
        fields["sections"] = client.section_timeouts.to_dict() if client else None
        with open(report_path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps({"op": op, "rank": rank, "cycle": cycle, **fields}) + "\n")

    def maybe_hang(where: str, step: int = -1) -> None:
        if hang_here and hang.get("where") == where and hang.get("step", step) == step:
            report("hanging", where=where, step=step)
            time.sleep(HANG_SECONDS)

    ft_integration.setup(ckpt_dir, calculate_timeouts=bool(cfg.get("calculate", False)),
                         graceful_stop=cfg.get("graceful_stop"))
    signal_self = cfg.get("signal_self") or {}
    start = 0
    if ckpt_path.exists():
        start = json.loads(ckpt_path.read_text())["step"]
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
    client = ft_integration.get_rank_monitor_client()
    report("started", step=start, open=list(client.open_sections))
    maybe_hang("setup")

    value = torch.ones(4)
    step_sleep = float(cfg.get("step_sleep", 0.02))
    step = start
    def save(step: int) -> None:
        ft_integration.on_checkpointing_start()
        maybe_hang("checkpointing", step)
        if rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(ckpt_path, json.dumps({"step": step}))
        dist.barrier()
        ft_integration.on_checkpointing_end(is_async_finalization=False)
        report("checkpoint", step=step)

    for step in range(start + 1, int(cfg.get("steps", 20)) + 1):
        maybe_hang("between", step)
        ft_integration.on_training_step_start(step)
        if signal_self.get("rank") == rank and signal_self.get("step") == step:
            os.kill(os.getpid(), signal.Signals[signal_self.get("signal", "SIGUSR1")])
        maybe_hang("step", step)
        dist.all_reduce(value)
        value /= dist.get_world_size()
        time.sleep(step_sleep)
        ft_integration.on_training_step_end()
        if cfg.get("report_steps"):
            report("step", step=step)
        if ft_integration.should_stop():  # the same step on every rank
            save(step)
            stop = ft_integration.get_integration().graceful_stop
            report("stopped", step=step, signal=stop.stop_signal.name, received=getattr(stop.received, "name", None),
                   deliveries=stop.deliveries, checks=stop.checks)
            break
        eval_every = int(cfg.get("eval_every", 0))
        if eval_every and step % eval_every == 0:
            for _ in range(int(cfg.get("eval_steps", 2))):
                ft_integration.on_eval_step_start()
                time.sleep(step_sleep / 2)
                ft_integration.on_eval_step_end()
        if step % int(cfg.get("ckpt_every", 5)) == 0:
            save(step)
    train_iters = ft_integration.get_integration().train_iters
    ft_integration.shutdown()  # the final timeouts update
    report("end", client, step=step, train_iters=train_iters, initialized=ft_integration.is_initialized())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
