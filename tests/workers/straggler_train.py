"""A 4-rank (or any) DDP Lightning run on CPU with StragglerDetectionCallback, for tests and the soak.

``python straggler_train.py '<json config>'`` under ft_launcher/torchrun. Each step's "compute" is
a short sleep in the forward (``fwd_ms``) and one in the backward (``bwd_ms``, inside an autograd
function between the two layers, so it lies before the last gradient bucket): sleeping keeps 4
ranks on a 2-core machine from competing for the CPU, while the callback, which times the wall
clock, sees it as compute.

Config keys: max_steps, max_time, fwd_ms, bwd_ms, slow ({"<rank>": "forward" | "backward"}),
slow_node (every rank whose node_name is this is slow in slow_where), slow_factor (1.3: the slow
phase takes 1.3x its normal measured time), cb (callback kwargs; node_name defaults to the
STRAGGLER_NODE environment variable), ckpt_dir / ckpt_every (ModelCheckpoint, resumes from
last.ckpt), ft (add FaultToleranceCallback(autoresume=True)), jitter (each sleep varies +-20 %, random GC, a
rare 5x step), val_every (a 20-batch evaluation every N steps), no_logging_setup (the script sets up no
logging, as a user's script may not: what the callbacks print on their own), hold_file / hold_at (every
rank waits before step hold_at, default 20, until hold_file exists; at most 120 s).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import sys
import time
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from ptl_resiliency import FaultToleranceCallback, StragglerDetectionCallback


class _Delay(torch.autograd.Function):
    """Identity whose backward sleeps ``seconds`` (a stand-in for the backward's compute)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class Model(LightningModule):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.l1 = torch.nn.Linear(32, 32)
        self.l2 = torch.nn.Linear(32, 2)
        where = cfg.get("slow", {}).get(os.environ.get("RANK", "0"))
        if cfg.get("slow_node") and cfg["slow_node"] == os.environ.get("STRAGGLER_NODE"):
            where = cfg.get("slow_where", "forward")
        factor = float(cfg.get("slow_factor", 1.3))
        self.fwd_s = cfg.get("fwd_ms", 5) / 1000.0
        self.bwd_s = cfg.get("bwd_ms", 5) / 1000.0 * (factor if where == "backward" else 1)
        self.fwd_extra = factor - 1.0 if where == "forward" else 0.0
        self.jitter = bool(cfg.get("jitter"))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        started = time.perf_counter()
        time.sleep(self.fwd_s * (random.uniform(0.8, 1.2) if self.jitter else 1.0))
        if self.jitter:
            if random.random() < 0.02:
                gc.collect()
            if random.random() < 0.01:
                time.sleep(self.fwd_s * 5)  # a rare long step (page fault, preemption)
        hidden = _Delay.apply(torch.relu(self.l1(batch)), self.bwd_s)
        loss = self.l2(hidden).pow(2).mean()
        if self.fwd_extra:
            # 1.3x of this forward's own measured time: the extra 0.3x
            time.sleep((time.perf_counter() - started) * self.fwd_extra)
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # hold_file / hold_at: every rank waits before step hold_at until the file exists (the test
        # readies something first, e.g. a spare node); outside the timed forward, so no score moves
        hold = self.cfg.get("hold_file")
        if hold and self.global_step == int(self.cfg.get("hold_at", 20)):
            deadline = time.monotonic() + 120
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.05)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(self.fwd_s)
        self.l2(torch.relu(self.l1(batch)))

    def val_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(80, 32), batch_size=4)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        data = torch.randn(64, 32)
        return torch.utils.data.DataLoader(data, batch_size=4)


def main(cfg: dict[str, Any]) -> None:
    if not cfg.get("no_logging_setup"):
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format=f"[rank{os.environ.get('RANK', '?')}] %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    kwargs = {"node_name": os.environ.get("STRAGGLER_NODE"), **cfg.get("cb", {})}
    callbacks: list[Any] = [StragglerDetectionCallback(**kwargs)]
    if cfg.get("ft"):
        callbacks.append(FaultToleranceCallback(autoresume=True, calculate_timeouts=False))
    ckpt_path = None
    if cfg.get("ckpt_dir"):
        callbacks.append(ModelCheckpoint(dirpath=cfg["ckpt_dir"], every_n_train_steps=cfg.get("ckpt_every", 50),
                                         save_last=True))
        last = os.path.join(cfg["ckpt_dir"], "last.ckpt")
        ckpt_path = last if os.path.exists(last) else None
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=bool(cfg.get("ckpt_dir")), callbacks=callbacks,
        max_steps=cfg.get("max_steps", 200), max_time=cfg.get("max_time"), num_sanity_val_steps=0,
        max_epochs=-1, val_check_interval=cfg.get("val_every"), limit_val_batches=20 if cfg.get("val_every") else 0,
        check_val_every_n_epoch=None if cfg.get("val_every") else 1,
    )
    started = time.monotonic()
    log = logging.getLogger("straggler_train")
    log.info("fit starts from %s", ckpt_path)
    trainer.fit(Model(cfg), ckpt_path=ckpt_path)
    log.info("fit done: %d steps in %.1f s", trainer.global_step, time.monotonic() - started)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
