"""A Lightning DDP run (CPU, gloo) with local checkpoints, for tests/integration/test_local_checkpoints.py.

``python local_ckpt_train.py '<json config>'`` under ft_launcher. The node-local root comes from
the environment (``LOCAL_CKPT_ROOT``; each test "node" has its own), the node's name from
``TEST_NODE``. Config keys:
    root: shared directory for reports and global checkpoints (<root>/global)
    every: LocalCheckpointCallback(every_n_train_steps=...); max_steps
    global_every: a ModelCheckpoint every that many steps into <root>/global ("step=N.ckpt"); 0: none
    resume: ckpt_path given to fit (a global checkpoint, which may not exist)
    die: {"node": name, "after": S} -> after step S (every rank waits for its pending local save
         first, then a barrier), the ranks of that node SIGKILL themselves
    slow_manifest: {"iteration": S, "seconds": T} -> the manifest write of iteration S writes
         <root>/slow_<rank> first, then sleeps T seconds (a save a job-wide SIGTERM interrupts)
Reports (JSON lines) in <root>/report_<rank>.jsonl: "start" (global step and weight sum at train
start, node), "saved" (iteration and the weight sum the local checkpoint holds).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from ft_core.checkpointing.local import files
from ft_core.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
from ft_core.checkpointing.local.replication.strategies import LazyCliqueReplicationStrategy
from ptl_resiliency.local_checkpoint_callback import HierarchicalCheckpointIO, LocalCheckpointCallback

CFG = json.loads(sys.argv[1])
ROOT = CFG["root"]
RANK = int(os.environ["RANK"])
NODE = os.environ["TEST_NODE"]


def report(kind: str, **fields) -> None:
    with open(os.path.join(ROOT, f"report_{RANK}.jsonl"), "a") as stream:
        stream.write(json.dumps({"kind": kind, "rank": RANK, "node": NODE, **fields}) + "\n")


def weight_sum(state_dict) -> float:
    return round(float(sum(t.double().sum() for t in state_dict.values())), 6)


def global_iteration(path) -> int:
    match = re.search(r"step=(\d+)", str(path))
    return int(match.group(1)) if match and os.path.exists(path) else -1


class Probe(Callback):
    def on_train_start(self, trainer, pl_module):
        report("start", step=trainer.global_step, weights=weight_sum(pl_module.state_dict()),
               load=trainer.strategy.checkpoint_io.local_ckpt_manager.last_load)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        die = CFG.get("die")
        if die and trainer.global_step == die["after"]:
            trainer.strategy.checkpoint_io.local_ckpt_manager.wait_for_pending()
            trainer.strategy.barrier("local-ckpt-test")
            if NODE == die["node"]:
                report("dying", step=trainer.global_step)
                os.kill(os.getpid(), signal.SIGKILL)


def slow_manifests(iteration: int, seconds: float) -> None:
    original = files.atomic_write_text

    def slow(path, text, mode=0o644):
        if f"iter_{iteration:07d}_" in os.path.basename(path):
            with open(os.path.join(ROOT, f"slow_{RANK}"), "w") as stream:
                stream.write(path)
            time.sleep(seconds)
        original(path, text, mode)

    files.atomic_write_text = slow


class ReportingManager(LocalCheckpointManager):
    def save(self, state_dict, iteration, is_async=False):
        report("saved", iteration=iteration, weights=weight_sum(state_dict.to_state_dict()["state_dict"]))
        return super().save(state_dict, iteration, is_async=is_async)


def main() -> None:
    seed_everything(1234)
    if CFG.get("slow_manifest"):
        slow_manifests(CFG["slow_manifest"]["iteration"], CFG["slow_manifest"]["seconds"])
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    manager = ReportingManager(root_local_ckpt_dir=os.environ["LOCAL_CKPT_ROOT"], session_id="job",
                               repl_strategy=LazyCliqueReplicationStrategy(replication_jump=local_world,
                                                                           replication_factor=2))
    io = HierarchicalCheckpointIO.get_partial_wrapper_constructor(
        local_ckpt_manager=manager, get_global_ckpt_iteration_fn=global_iteration)(TorchCheckpointIO())
    callbacks = [Probe(), LocalCheckpointCallback(every_n_train_steps=CFG["every"], train_time_interval=None,
                                                  async_save=True)]
    if CFG.get("global_every"):
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(ROOT, "global"), filename="{step}", save_top_k=-1,
                                         every_n_train_steps=CFG["global_every"]))
    trainer = Trainer(accelerator="cpu", strategy="ddp", devices=local_world,
                      num_nodes=int(os.environ["WORLD_SIZE"]) // local_world, max_steps=CFG["max_steps"],
                      limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=callbacks, plugins=[io], default_root_dir=ROOT)
    trainer.fit(BoringModel(), ckpt_path=CFG.get("resume"))
    report("end", step=trainer.global_step)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
