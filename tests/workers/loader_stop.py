"""A 2-rank run whose batches come from a DataLoader with worker processes, for graceful-stop tests.

``python loader_stop.py '<json config>'`` under ft_launcher (gloo on CPU). Config keys:
    front: "lightning" (FaultToleranceCallback) or "integration" (ft_core.integration); required
    root: report files (report_rank<R>_cycle0.jsonl) and checkpoints go here; required
    loader_workers: the DataLoader's num_workers (default 2)
    start_method: the loaders' multiprocessing start method, "fork" (default) or "spawn"
    step_sleep: seconds per training step (default 0.02)

Reports (JSON lines): "loader" (from each loader worker as it starts: its pid), "step",
"stopped" (the stop step, after the stop checkpoint), "exception" (what ended the run otherwise).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

RANK = int(os.environ.get("RANK", "0"))


def report(root: str, op: str, **fields: Any) -> None:
    with open(Path(root) / f"report_rank{RANK}_cycle0.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps({"op": op, "rank": RANK, "pid": os.getpid(), **fields}) + "\n")


class Numbers(Dataset):
    """Endless enough: 100 000 small samples, each produced in a loader worker."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((32,), float(index % 7))


def started_loader_worker(root: str, worker_id: int) -> None:
    report(root, "loader", worker=worker_id, parent=os.getppid())


def loader(cfg: dict[str, Any]) -> DataLoader:
    workers = int(cfg.get("loader_workers", 2))
    context = multiprocessing.get_context(cfg.get("start_method", "fork")) if workers else None
    return DataLoader(Numbers(), batch_size=2, num_workers=workers, multiprocessing_context=context,
                      worker_init_fn=functools.partial(started_loader_worker, cfg["root"]))


def run_integration(cfg: dict[str, Any]) -> None:
    import ft_core.client.integration as ft_integration
    from ft_core.wire.atomic import atomic_write_text

    root = Path(cfg["root"])
    ft_integration.setup(root / "ckpt", graceful_stop=True)
    value = torch.ones(4)
    batches = iter(loader(cfg))
    for step, batch in enumerate(batches, start=1):
        ft_integration.on_training_step_start(step)
        value += batch.sum() * 0
        dist.all_reduce(value)
        time.sleep(float(cfg.get("step_sleep", 0.02)))
        ft_integration.on_training_step_end()
        report(cfg["root"], "step", step=step)
        if ft_integration.should_stop():  # the same step on every rank
            ft_integration.on_checkpointing_start()
            if RANK == 0:
                (root / "ckpt").mkdir(parents=True, exist_ok=True)
                atomic_write_text(root / "ckpt" / "checkpoint.json", json.dumps({"step": step}))
            dist.barrier()
            ft_integration.on_checkpointing_end(is_async_finalization=False)
            stop = ft_integration.get_integration().graceful_stop
            report(cfg["root"], "stopped", step=step, signal=stop.stop_signal.name)
            break
    ft_integration.shutdown()


def run_lightning(cfg: dict[str, Any]) -> None:
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    from ptl_resiliency import FaultToleranceCallback

    class Model(BoringModel):
        def train_dataloader(self) -> DataLoader:
            return loader(cfg)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(float(cfg.get("step_sleep", 0.02)))
            return super().training_step(batch, batch_idx)

    class Report(Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            report(cfg["root"], "step", step=trainer.global_step)

        def on_save_checkpoint(self, trainer: Any, *args: Any) -> None:
            report(cfg["root"], "save", step=trainer.global_step)

    ckpt_dir = os.path.join(cfg["root"], "ckpt")
    trainer = Trainer(
        default_root_dir=cfg["root"], accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=1, logger=False, enable_progress_bar=False, enable_model_summary=False, max_steps=100_000,
        callbacks=[FaultToleranceCallback(autoresume=True, calculate_timeouts=False, graceful_stop=True), Report(),
                   ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=100_000, save_last=True)],
    )
    try:
        trainer.fit(Model())
    except BaseException as exc:
        if type(exc).__name__ != "GracefulStopExit":
            raise
        report(cfg["root"], "stopped", step=trainer.global_step, signal=str(exc))
        return


def main() -> int:
    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    if cfg["front"] == "integration":
        dist.init_process_group("gloo")
    try:
        (run_lightning if cfg["front"] == "lightning" else run_integration)(cfg)
    except BaseException as exc:
        report(cfg["root"], "exception", exc=repr(exc)[:2000])
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()  # a gloo group alive at exit can abort the interpreter
    return 0


if __name__ == "__main__":
    sys.exit(main())
