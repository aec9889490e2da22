"""A Lightning training run with a fault tolerance callback, configured by JSON, for tests.

``python lightning_train.py '<json config>'`` runs it in a fresh process (for hangs and kills);
tests that only need the run to end import :func:`run` and call it in-process.

Config keys (all optional):
    callback: "heartbeats" | "sections" | "none"
    cb: extra callback kwargs (autoresume, calculate_timeouts, exp_dir, simulated_fault_params)
    policy: "shutdown" -> exc_handling_policy returning ShutdownWorkload for RuntimeError
    root: default_root_dir (also holds checkpoints in <root>/ckpt and the report files)
    max_steps, max_epochs, max_time (seconds), limit_train_batches, limit_val_batches,
    val_check_interval, num_sanity_val_steps
    ckpt_every: ModelCheckpoint(every_n_train_steps=...) ; 0 disables checkpointing
    resume: resume from <root>/ckpt/last.ckpt when it exists
    async_ckpt: wrap the checkpoint IO in Lightning's AsyncCheckpointIO
    ddp: DDP on CPU with gloo over the torchelastic environment (ft_launcher / torchrun)
    fsdp2: Lightning's ModelParallelStrategy instead (CPU, gloo), the layer sharded with FSDP2's
        fully_shard in configure_model: a real sharded job
    step_sleep: seconds each training_step sleeps; step_sleep_by_rank: {"<rank>": seconds} and
        step_sleep_by_attempt: {"<AUTORESUME_ATTEMPT>": seconds} override it
    between_steps_sleep: seconds LightningModule.on_train_batch_end sleeps (out of any section)
    linger: seconds to stay alive after fit returned
    both_callbacks: add both fault tolerance callbacks (a configuration error)
    duplicate_callback: pass the fault tolerance callback instance twice (a configuration error)
    logger: "csv" -> a CSVLogger under <root> (versioned directories), else no logger
    fast_dev_run: Trainer(fast_dev_run=...)
    hang: {"where": "step"|"setup"|"checkpoint"|"epoch_end", "step": N, "save": N,
           "rank": R, "cycle": C} -> sleep 600 s there
    fail: {"step": N, "exc": "RuntimeError"|"SystemExit0"|"SystemExit1"|"KeyboardInterrupt"
           |"ShouldStop"|"Exit1"|"SIGSTOP", "rank": R, "cycle": C} (Exit1: os._exit(1), a crash;
           SIGSTOP: the rank stops itself, a hang)
    adam: Adam instead of BoringModel's SGD (optimizer state worth comparing)
    hash_steps: "step" reports (every batch end) and "started" carry "hash": the parameters' and the
        optimizer state's SHA-256 (the exception report too)
    fail_in_setup: raise ValueError("model setup failed on purpose") in LightningModule.setup
    fault: {"params": SimulatedFaultParams dict, "cycle": C} -> simulated fault (in cycle C only)
    early_stop: log "loss" and add an EarlyStopping that stops at its first check
    record_sections: report the sections open at every training and validation batch start
        (after the fault tolerance callback's hook)
    probe_collectives: at train start, report what the callbacks' strategy collectives return
    report_steps: report every training batch end ("step", global step) and every checkpoint
        dump on every rank ("save", global step)
    signal_self: {"rank": R, "step": N, "signal": "SIGUSR1", "cycle": C} -> that rank signals
        itself in training step N

Reports (JSON lines) go to <root>/report_rank<R>_cycle<C>.jsonl: "started" and "train_end" (the
timeouts the client runs with, state file), "fit_end" (global step), "exception", and with the
options above "batch" (kind, index, open sections) and "collectives".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

from ft_core import WorkloadAction, WorkloadControlRequest
from ptl_resiliency import FaultToleranceCallback, FaultToleranceSectionsCallback

HANG_SECONDS = 600.0


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _cycle() -> int:
    return int(os.environ.get("FT_LAUNCHER_CYCLE", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


def _selected(spec: dict[str, Any] | None) -> bool:
    if not spec:
        return False
    return spec.get("rank", _rank()) == _rank() and spec.get("cycle", _cycle()) == _cycle()


class Reporter:
    def __init__(self, root: str) -> None:
        self.path = Path(root) / f"report_rank{_rank()}_cycle{_cycle()}.jsonl"

    def emit(self, **fields: Any) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps({"rank": _rank(), "cycle": _cycle(), "pid": os.getpid(), **fields}) + "\n")
            stream.flush()


class Model(BoringModel):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg

    def configure_model(self) -> None:
        if self.cfg.get("fsdp2"):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def setup(self, stage: str) -> None:
        if self.cfg.get("fail_in_setup"):
            raise ValueError("model setup failed on purpose")
        hang = self.cfg.get("hang")
        if _selected(hang) and hang["where"] == "setup":
            time.sleep(HANG_SECONDS)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        step = self.trainer.global_step
        signal_self = self.cfg.get("signal_self")
        if _selected(signal_self) and step == signal_self.get("step", 0):
            os.kill(os.getpid(), signal.Signals[signal_self.get("signal", "SIGUSR1")])
        hang = self.cfg.get("hang")
        if _selected(hang) and hang["where"] == "step" and step == hang.get("step", 0):
            time.sleep(HANG_SECONDS)
        fail = self.cfg.get("fail")
        if _selected(fail) and step == fail.get("step", 0):
            kind = fail["exc"]
            if kind == "RuntimeError":
                raise RuntimeError("training step failed on purpose")
            if kind == "SystemExit0":
                sys.exit(0)
            if kind == "SystemExit1":
                sys.exit(1)
            if kind == "KeyboardInterrupt":
                raise KeyboardInterrupt
            if kind == "ShouldStop":
                self.trainer.should_stop = True
            if kind == "Exit1":
                os._exit(1)
            if kind == "SIGSTOP":
                os.kill(os.getpid(), signal.SIGSTOP)
        step_sleep = self.cfg.get("step_sleep_by_rank", {}).get(str(_rank()), self.cfg.get("step_sleep"))
        step_sleep = self.cfg.get("step_sleep_by_attempt", {}).get(os.environ.get("AUTORESUME_ATTEMPT", ""), step_sleep)
        if step_sleep:
            time.sleep(step_sleep)
        output = super().training_step(batch, batch_idx)
        if self.cfg.get("early_stop"):
            self.log("loss", output["loss"])
        return output

    def configure_optimizers(self) -> Any:
        if self.cfg.get("adam"):
            return torch.optim.Adam(self.parameters(), lr=0.01)
        return super().configure_optimizers()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.cfg.get("between_steps_sleep"):
            time.sleep(self.cfg["between_steps_sleep"])  # out of any section

    def on_train_epoch_end(self) -> None:
        hang = self.cfg.get("hang")
        if _selected(hang) and hang["where"] == "epoch_end":
            time.sleep(HANG_SECONDS)


def state_hash(trainer: Trainer) -> str:
    """SHA-256 of the model's parameters and buffers and the optimizers' state, in a fixed order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(trainer.lightning_module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for optimizer in trainer.optimizers:
        for index, state in sorted(optimizer.state_dict()["state"].items()):
            for key, value in sorted(state.items()):
                digest.update(f"{index}.{key}".encode())
                digest.update(torch.as_tensor(value).detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class SlowCheckpointIO(TorchCheckpointIO):
    """Hangs in the N-th save (1-based) when the config says so."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.saves = 0

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.saves += 1
        hang = self.cfg.get("hang")
        if _selected(hang) and hang["where"] == "checkpoint" and self.saves == hang.get("save", 1):
            time.sleep(HANG_SECONDS)
        super().save_checkpoint(*args, **kwargs)


class Report(Callback):
    """Reports what the fault tolerance callback runs with, once training starts."""

    def __init__(self, reporter: Reporter, ft: Any, cfg: dict[str, Any]) -> None:
        self.reporter = reporter
        self.ft = ft
        self.cfg = cfg

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._emit("started", trainer)
        if self.cfg.get("probe_collectives"):
            from ptl_resiliency._collectives import StrategyCollectives

            coll = StrategyCollectives(trainer.strategy)
            rank = coll.rank()
            self.reporter.emit(op="collectives", world_size=coll.world_size(), rank=rank,
                               all_true=coll.all_true([True, rank == 0]), all_max=coll.all_max([rank, -rank]),
                               text=coll.broadcast_text(f"from rank {rank}"),
                               none=coll.broadcast_text(None if rank == 0 else "not rank 0"))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._emit_batch("train", batch_idx)

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._emit_batch("sanity" if trainer.sanity_checking else "validation", batch_idx)

    def _emit_batch(self, kind: str, index: int) -> None:
        if self.cfg.get("record_sections") and self.ft is not None and self.ft.client is not None:
            self.reporter.emit(op="batch", kind=kind, index=index, open=list(self.ft.client.open_sections))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.cfg.get("report_steps"):
            extra = {"hash": state_hash(trainer)} if self.cfg.get("hash_steps") else {}
            self.reporter.emit(op="step", global_step=trainer.global_step, **extra)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.cfg.get("report_steps"):  # every rank builds the checkpoint; rank 0 writes it
            self.reporter.emit(op="save", global_step=trainer.global_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._emit("train_end", trainer)

    def _emit(self, op: str, trainer: Trainer) -> None:
        client = self.ft.client if self.ft is not None else None
        extra = {"hash": state_hash(trainer), "ckpt_path": trainer.ckpt_path} if self.cfg.get("hash_steps") else {}
        try:  # a warm-started worker is a child of the launcher's warm template (launcher/warm/zygote.py)
            parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            parent = ""
        self.reporter.emit(
            op=op,
            parent=parent,
            attempt=os.environ.get("AUTORESUME_ATTEMPT"),
            hb=client.hb_timeouts.to_dict() if client else None,
            sections=client.section_timeouts.to_dict() if client else None,
            state_file=self.ft.state_file_path if self.ft is not None else None,
            global_step=trainer.global_step,
            world_size=trainer.world_size,
            cluster_environment=type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
            sigusr1_handler=repr(signal.getsignal(signal.SIGUSR1)),
            log_dir=trainer.log_dir,
            **extra,
        )


def shutdown_on_runtime_error(exc: BaseException) -> WorkloadControlRequest | None:
    if isinstance(exc, RuntimeError):
        return WorkloadControlRequest(WorkloadAction.ShutdownWorkload, f"unrecoverable: {exc}")
    return None


def build(cfg: dict[str, Any]) -> tuple[Trainer, Model, Any, str | None]:
    """Return (trainer, model, ft_callback, ckpt_path) for ``cfg``."""
    torch.set_num_threads(1)
    root = cfg["root"]
    os.makedirs(root, exist_ok=True)
    reporter = Reporter(root)
    cb_kwargs = dict(cfg.get("cb", {}))
    cb_kwargs.setdefault("autoresume", False)
    cb_kwargs.setdefault("calculate_timeouts", False)
    fault = cfg.get("fault")
    if fault and fault.get("cycle", _cycle()) == _cycle():
        cb_kwargs["simulated_fault_params"] = fault["params"]
    kind = cfg.get("callback", "heartbeats")
    ft: Any = None
    if kind == "heartbeats":
        ft = FaultToleranceCallback(**cb_kwargs)
    elif kind == "sections":
        if cfg.get("policy") == "shutdown":
            cb_kwargs["exc_handling_policy"] = shutdown_on_runtime_error
        ft = FaultToleranceSectionsCallback(**cb_kwargs)
    callbacks: list[Callback] = [] if ft is None else [ft]
    if cfg.get("duplicate_callback"):
        callbacks.append(ft)
    if cfg.get("both_callbacks"):
        callbacks.append(FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False))
    callbacks.append(Report(reporter, ft, cfg))
    ckpt_dir = os.path.join(root, "ckpt")
    ckpt_every = cfg.get("ckpt_every", 0)
    if ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=ckpt_every,
                                         save_last=True, save_top_k=-1))
    if cfg.get("early_stop"):
        # Stops at the first check: any finite loss is below the threshold.
        callbacks.append(EarlyStopping(monitor="loss", stopping_threshold=1e9, check_on_train_epoch_end=True))
    checkpoint_io: Any = SlowCheckpointIO(cfg)
    if cfg.get("async_ckpt"):
        checkpoint_io = AsyncCheckpointIO(checkpoint_io)
    trainer_kwargs: dict[str, Any] = dict(
        default_root_dir=root,
        accelerator="cpu",
        logger=CSVLogger(save_dir=root) if cfg.get("logger") == "csv" else False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(ckpt_every),
        callbacks=callbacks,
        plugins=[checkpoint_io],
        max_steps=cfg.get("max_steps", -1),
        max_epochs=cfg.get("max_epochs"),
        limit_train_batches=cfg.get("limit_train_batches"),
        limit_val_batches=cfg.get("limit_val_batches", 0),
        val_check_interval=cfg.get("val_check_interval"),
        num_sanity_val_steps=cfg.get("num_sanity_val_steps", 0),
    )
    if cfg.get("max_time") is not None:
        trainer_kwargs["max_time"] = {"seconds": cfg["max_time"]}
    if cfg.get("fast_dev_run"):
        trainer_kwargs["fast_dev_run"] = cfg["fast_dev_run"]
    if cfg.get("fsdp2"):
        from lightning.pytorch.strategies import ModelParallelStrategy

        world = int(os.environ["WORLD_SIZE"])
        trainer_kwargs.update(strategy=ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1,
                                                             process_group_backend="gloo"),
                              devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=1)
    elif cfg.get("ddp"):
        trainer_kwargs.update(strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=1)
    else:
        trainer_kwargs.update(devices=1)
    trainer = Trainer(**trainer_kwargs)
    last = os.path.join(ckpt_dir, "last.ckpt")
    ckpt_path = last if cfg.get("resume") and os.path.exists(last) else None
    return trainer, Model(cfg), ft, ckpt_path


def run(cfg: dict[str, Any]) -> Trainer:
    """Build and fit; exceptions propagate after being reported."""
    trainer, model, _ft, ckpt_path = build(cfg)
    reporter = Reporter(cfg["root"])
    try:
        trainer.fit(model, ckpt_path=ckpt_path)
    except BaseException as exc:
        extra = {"hash": state_hash(trainer)} if cfg.get("hash_steps") else {}
        reporter.emit(op="exception", exc=repr(exc), text=str(exc), global_step=trainer.global_step, **extra)
        raise
    reporter.emit(op="fit_end", global_step=trainer.global_step, resumed_from=ckpt_path)
    if cfg.get("linger"):
        time.sleep(cfg["linger"])
    return trainer


def main() -> int:
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [worker pid {os.getpid()}] %(name)s %(levelname)s: %(message)s")
    run(json.loads(sys.argv[1]))
    if torch.distributed.is_initialized():
        # A gloo group still alive at interpreter exit can abort the process (SIGABRT).
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
