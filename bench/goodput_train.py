"""Training job of bench/goodput.py: 2-rank Lightning DDP on CPU with planned faults.

Started by ``scripts/autoresume.sh`` through a launcher (ours or NVRx's ``ft_launcher``), one
process per rank. Every process resumes from ``RUN_DIR/checkpoints/last.ckpt`` when it exists,
saves it every ``--checkpoint-every`` steps and trains to ``--max-steps``; the fault tolerance
callback of ``--impl`` (``FaultToleranceCallback``: heartbeats, fixed timeouts) sends heartbeats
and, at the end, creates the finished flag that stops autoresume.sh.

Faults are planned here, identically for both implementations: rank ``--fault-rank`` makes a fault
once its process has been training for ``--fault-every`` seconds (counted from the first step
this process completed, so that every tool gets the same amount of training between faults,
however long it took to recover), until ``--max-faults`` faults happened in the whole run. Faults
alternate: even-numbered ones are hangs (the rank stops itself with ``SIGSTOP``, as a rank stuck in
a collective would; only a monitor can notice), odd-numbered ones kills (``SIGKILL``). Before the
signal the rank records the fault in ``RUN_DIR/bench/fault_<k>.json`` (atomically).

Rank 0 appends one line per event to ``RUN_DIR/bench/progress.log`` (``os.write`` on an
``O_APPEND`` descriptor: nothing buffered is lost when the process is killed):
``start <pid> <time>`` as its first statement and ``step <pid> <global step> <time>`` after each
training batch. ``bench/goodput.py`` computes goodput and recovery times from these files.
"""

import time

STARTED = time.time()  # first statement: when this process (a replacement, after a fault) began

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import ProgressRecorder  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--impl", choices=("ours", "nvrx"), required=True)
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.015, help="seconds each step sleeps")
    parser.add_argument("--fault-every", type=float, default=6.0, help="seconds of training between faults")
    parser.add_argument("--max-faults", type=int, default=4)
    parser.add_argument("--fault-rank", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    bench_dir = args.run_dir / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    recorder = ProgressRecorder(bench_dir / "progress.log", RANK)
    recorder.line("start", os.getpid(), f"{STARTED:.6f}")

    import torch
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.plugins.environments import TorchElasticEnvironment

    from bench import _impl

    torch.set_num_threads(1)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)

    class SlowBoringModel(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(args.step_time)  # stands in for a real model's compute
            return super().training_step(batch, batch_idx)

    class FaultsAndProgress(Callback):
        def __init__(self) -> None:
            self.first_step_at: float | None = None

        def on_train_batch_end(self, trainer: Trainer, *_: Any) -> None:
            now = time.time()
            recorder.line("step", os.getpid(), trainer.global_step, f"{now:.6f}")
            if self.first_step_at is None:
                self.first_step_at = now
            if RANK != args.fault_rank or now - self.first_step_at < args.fault_every:
                return
            done = len(list(bench_dir.glob("fault_*.json")))
            if done >= args.max_faults:
                return
            kind = "hang" if done % 2 == 0 else "kill"
            record = {"fault": done, "kind": kind, "rank": RANK, "pid": os.getpid(),
                      "step": trainer.global_step, "time": time.time()}
            tmp = bench_dir / f".fault_{done}.tmp"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, bench_dir / f"fault_{done}.json")
            os.kill(os.getpid(), signal.SIGSTOP if kind == "hang" else signal.SIGKILL)

    checkpoints = args.run_dir / "checkpoints"
    last = checkpoints / "last.ckpt"
    callbacks = _impl.callbacks(args.impl)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=max(1, int(os.environ.get("WORLD_SIZE", "1")) // devices),
        strategy="ddp",
        plugins=[TorchElasticEnvironment()],
        max_steps=args.max_steps,
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=str(args.run_dir),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(dirpath=str(checkpoints), save_last=True, every_n_train_steps=args.checkpoint_every,
                            save_top_k=0),
            callbacks.FaultToleranceCallback(autoresume=True, calculate_timeouts=False, exp_dir=str(args.run_dir)),
            FaultsAndProgress(),
        ],
    )
    trainer.fit(SlowBoringModel(), ckpt_path=str(last) if last.exists() else None)
    recorder.line("end", os.getpid(), trainer.global_step, f"{time.time():.6f}")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # a gloo group alive at exit can abort it (SIGABRT)


if __name__ == "__main__":
    main()
