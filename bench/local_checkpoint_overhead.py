"""Steady-state cost per training step of local checkpoints every N steps (issue 33 item 4).

The goodput bench's configuration: a 2-rank Lightning DDP job (gloo on CPU, BoringModel,
``--step-time`` seconds of sleep per step standing in for a device's compute) under ft_launcher,
the two ranks standing for two nodes (each its own local directory, ``replication_jump=1``, so each
rank keeps the other's replica). ``--hidden`` widens the model for a bigger state.

Runs alternate without and with ``LocalCheckpointCallback(every_n_train_steps=N, async_save=True)``
(ABBA order, ``--pairs`` pairs, so that a drift of the machine's load cancels out). Per run, rank 0
records the wall time of every step after ``--warmup`` steps; the cost per step is the difference
of the mean step times. On a shared machine that difference is mostly noise, so the time the
training thread spends in each save is measured directly too (Lightning's dump of the state, the
copy into memory, any wait for the previous save; the first save, which also creates the
replication groups, left out), divided by N: the steady-state cost per step. Also reported: the
background time of a save (serialize, write, exchange with the peer, write the replica).

Run: ``python bench/local_checkpoint_overhead.py [--every 100] [--steps 600] [--hidden 32] [--json]``.
Goal: at most 5 % of a step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._util import REPO, emit  # noqa: E402


def worker(cfg: dict) -> None:
    """One rank of one run (under ft_launcher)."""
    import torch
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch import Callback, Trainer, seed_everything
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

    from ft_core.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
    from ft_core.checkpointing.local.replication.strategies import LazyCliqueReplicationStrategy
    from ptl_resiliency.local_checkpoint_callback import HierarchicalCheckpointIO, LocalCheckpointCallback

    torch.set_num_threads(1)
    seed_everything(0)
    rank = int(os.environ["RANK"])

    class Model(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            hidden = cfg["hidden"]
            self.layer = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.Linear(hidden, 2))

        def training_step(self, batch, batch_idx):
            time.sleep(cfg["step_time"])
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(RandomDataset(32, 100_000), batch_size=2)

    class Timer(Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, trainer, *args) -> None:
            self.times.append(time.perf_counter())

    timer = Timer()
    callbacks: list = [timer]
    plugins: list = []
    manager = None
    if cfg["local"]:
        manager = LocalCheckpointManager(os.path.join(cfg["dir"], f"node{rank}"), session_id="bench",
                                         repl_strategy=LazyCliqueReplicationStrategy(replication_jump=1))
        plugins.append(HierarchicalCheckpointIO(TorchCheckpointIO(), manager, lambda path: -1))
        local_callback = LocalCheckpointCallback(every_n_train_steps=cfg["every"], async_save=True)
        callbacks.append(local_callback)
        copies: list[float] = []
        writes: list = []
        original = local_callback._save_last_checkpoint

        def timed_save(trainer, monitor_candidates):
            # the training thread's whole part: Lightning's dump of the state, the copy, the hand-off
            started = time.perf_counter()
            original(trainer, monitor_candidates)
            copies.append(time.perf_counter() - started)
            writes.append(manager.last_save)

        local_callback._save_last_checkpoint = timed_save
    trainer = Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=cfg["steps"], limit_val_batches=0,
                      num_sanity_val_steps=0, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=cfg["local"], callbacks=callbacks, plugins=plugins,
                      default_root_dir=cfg["dir"])
    trainer.fit(Model())
    if rank == 0:
        steps = [b - a for a, b in zip(timer.times[cfg["warmup"]:], timer.times[cfg["warmup"] + 1:], strict=False)]
        out = {"step_mean": statistics.fmean(steps), "step_median": statistics.median(steps), "steps": len(steps)}
        if manager is not None:
            manager.wait_for_pending()
            out.update(saves=len(copies), save_call_mean=statistics.fmean(copies[1:] or copies),
                       background_mean=statistics.fmean(s.write_seconds for s in writes),
                       state_bytes=writes[-1].bytes, errors=[s.error for s in writes if s.error])
        Path(cfg["out"]).write_text(json.dumps(out))


def run(args: argparse.Namespace, local: bool, workdir: str, index: int) -> dict:
    out = os.path.join(workdir, f"run{index}.json")
    cfg = {"local": local, "every": args.every, "steps": args.steps, "warmup": args.warmup, "hidden": args.hidden,
           "step_time": args.step_time, "dir": os.path.join(workdir, f"run{index}"), "out": out}
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in [k for k in env if k.startswith(("FT_", "PET_", "TORCHELASTIC_"))]:
        del env[key]
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--nproc-per-node", "2", "--max-restarts", "0",
                             "--ft-event-log", os.path.join(workdir, f"events{index}.jsonl"),
                             __file__, "--worker", json.dumps(cfg)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
        proc.communicate()
        raise SystemExit(f"run {index} did not finish in {args.timeout} s") from None
    if proc.returncode != 0:
        raise SystemExit(f"run {index} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=100, help="N: steps between local checkpoints")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.015, help="seconds each step sleeps (compute)")
    parser.add_argument("--hidden", type=int, default=32, help="width of the model's hidden layer")
    parser.add_argument("--pairs", type=int, default=1, help="ABBA pairs of runs")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    without, with_local = [], []
    with tempfile.TemporaryDirectory(prefix="local-ckpt-bench-") as workdir:
        index = 0
        for _ in range(args.pairs):
            for local in (False, True, True, False):
                (with_local if local else without).append(run(args, local, workdir, index))
                index += 1
    base = statistics.fmean(r["step_mean"] for r in without)
    withl = statistics.fmean(r["step_mean"] for r in with_local)
    result = {
        "every": args.every, "step_time_sleep_s": args.step_time, "hidden": args.hidden,
        "state_bytes": with_local[0]["state_bytes"],
        "step_ms_without": round(base * 1e3, 3), "step_ms_with": round(withl * 1e3, 3),
        "cost_per_step_ms": round((withl - base) * 1e3, 3),
        "cost_per_step_pct": round(100 * (withl - base) / base, 2),
        "save_call_ms": round(statistics.fmean(r["save_call_mean"] for r in with_local) * 1e3, 3),
        "save_call_per_step_pct": round(100 * statistics.fmean(r["save_call_mean"] for r in with_local)
                                        / args.every / base, 3),
        "background_ms": round(statistics.fmean(r["background_mean"] for r in with_local) * 1e3, 3),
        "errors": [e for r in with_local for e in r["errors"]],
        "goal_pct": 5.0,
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
