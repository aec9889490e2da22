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
    strategy: "ddp" (the default) or "fsdp2": ModelParallelStrategy, the model's layer sharded with
         fully_shard in configure_model, AdamW (so that the optimizer has a state to shard)
Reports (JSON lines) in <root>/report_<rank>.jsonl: "start" (global step and weight sum at train
start, node), "saved" (iteration and the weight sum the local checkpoint holds); with fsdp2 both
also carry the fingerprint of the rank's shard (tests/workers/shard_fingerprint.py) of the model
and optimizer states: the saved one, and the one the model and optimizer hold at train start.
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
from lightning.pytorch.strategies import ModelParallelStrategy

from ft_core.checkpointing.local import files
from ft_core.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
from ft_core.checkpointing.local.replication.strategies import LazyCliqueReplicationStrategy
from ptl_resiliency.local_checkpoint_callback import HierarchicalCheckpointIO, LocalCheckpointCallback
from tests.workers.shard_fingerprint import fingerprint

CFG = json.loads(sys.argv[1])
ROOT = CFG["root"]
RANK = int(os.environ["RANK"])
NODE = os.environ["TEST_NODE"]
FSDP2 = CFG.get("strategy", "ddp") == "fsdp2"


def report(kind: str, **fields) -> None:
    with open(os.path.join(ROOT, f"report_{RANK}.jsonl"), "a") as stream:
        stream.write(json.dumps({"kind": kind, "rank": RANK, "node": NODE, **fields}) + "\n")


def weight_sum(state_dict) -> float:
    """The sum of the rank's weights (of its shards with fsdp2)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in state_dict.values()]
    return round(float(sum(t.double().sum() for t in local)), 6)


def held_state(trainer) -> dict:
    """The rank's shard of the model and optimizer states as they are now, keyed as Lightning saves them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = trainer.strategy.model
    return {"state_dict": get_model_state_dict(model),
            "optimizer_states": [get_optimizer_state_dict(model, opt) for opt in trainer.optimizers]}


class ShardedBoring(BoringModel):
    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def global_iteration(path) -> int:
    match = re.search(r"step=(\d+)", str(path))
    return int(match.group(1)) if match and os.path.exists(path) else -1


class Probe(Callback):
    def on_train_start(self, trainer, pl_module):
        extra = {"fingerprint": fingerprint(held_state(trainer))} if FSDP2 else {}
        report("start", step=trainer.global_step, weights=weight_sum(pl_module.state_dict()),
               load=trainer.strategy.checkpoint_io.local_ckpt_manager.last_load, **extra)

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
        state = state_dict.to_state_dict()
        extra = {"fingerprint": fingerprint({key: state[key] for key in ("state_dict", "optimizer_states")})} \
            if FSDP2 else {}
        report("saved", iteration=iteration, weights=weight_sum(state["state_dict"]), **extra)
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
    strategy = ModelParallelStrategy(data_parallel_size=int(os.environ["WORLD_SIZE"]), tensor_parallel_size=1,
                                     process_group_backend="gloo") if FSDP2 else "ddp"
    trainer = Trainer(accelerator="cpu", strategy=strategy, devices=local_world,
                      num_nodes=int(os.environ["WORLD_SIZE"]) // local_world, max_steps=CFG["max_steps"],
                      limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=callbacks, plugins=[io], default_root_dir=ROOT)
    trainer.fit(ShardedBoring() if FSDP2 else BoringModel(), ckpt_path=CFG.get("resume"))
    report("end", step=trainer.global_step)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
