"""A plain torch FSDP2 run (``fully_shard`` on CPU, gloo) with local checkpoints, for
tests/integration/test_local_checkpoints_fsdp.py.

``python local_ckpt_fsdp.py '<json config>'`` under ft_launcher. Every rank holds a shard of the
parameters and of the optimizer state (DTensors) and saves only that shard through
``LocalCheckpointManager`` (``BasicTensorAwareStateDict`` over torch's sharded state dicts);
``LazyCliqueReplicationStrategy`` keeps a replica on the same local rank of the other node. The
node-local root comes from ``LOCAL_CKPT_ROOT``, the node's name from ``TEST_NODE``. Config keys:
    root: shared directory for the reports
    every: a local save every that many steps; max_steps
    die: {"node": name, "after": S} -> after step S (every rank waits for its pending save, then a
         barrier) the ranks of that node SIGKILL themselves
Reports (JSON lines) in <root>/report_<rank>.jsonl: "saved" (iteration and the fingerprint of the
shard saved), "start" (the step resumed at, the fingerprint of the shard the model and optimizer
hold after the restore, the manager's last_load), "end".
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ft_core.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
from ft_core.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
from ft_core.checkpointing.local.replication.strategies import LazyCliqueReplicationStrategy
from tests.workers.shard_fingerprint import fingerprint

CFG = json.loads(sys.argv[1])
ROOT = CFG["root"]
RANK = int(os.environ["RANK"])
NODE = os.environ["TEST_NODE"]


def report(kind: str, **fields) -> None:
    with open(os.path.join(ROOT, f"report_{RANK}.jsonl"), "a") as stream:
        stream.write(json.dumps({"kind": kind, "rank": RANK, "node": NODE, **fields}) + "\n")


def build(mesh):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def sharded_state(model, optimizer, step: int) -> dict:
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer), "step": step}


def main() -> None:
    dist.init_process_group("gloo")
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, optimizer = build(mesh)
    manager = LocalCheckpointManager(root_local_ckpt_dir=os.environ["LOCAL_CKPT_ROOT"], session_id="job",
                                     repl_strategy=LazyCliqueReplicationStrategy(replication_jump=local_world,
                                                                                 replication_factor=2))
    step = 0
    if manager.find_latest() >= 0:
        loaded, _ = manager.load()
        state = loaded.to_state_dict()
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
        step = state["step"]
    report("start", step=step, fingerprint=fingerprint(sharded_state(model, optimizer, step)),
           load=manager.last_load)
    while step < CFG["max_steps"]:
        generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())  # the same data on a resume
        loss = model(torch.randn(8, 32, generator=generator)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step % CFG["every"] == 0:
            state = sharded_state(model, optimizer, step)
            report("saved", iteration=step, fingerprint=fingerprint(state))
            manager.save(BasicTensorAwareStateDict(state), step, is_async=True)
        die = CFG.get("die")
        if die and step == die["after"]:
            manager.wait_for_pending()
            dist.barrier()
            if NODE == die["node"]:
                report("dying", step=step)
                os.kill(os.getpid(), signal.SIGKILL)
    manager.wait_for_pending()
    report("end", step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
