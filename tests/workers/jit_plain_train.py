"""A 2-rank DDP loop (gloo, CPU) with periodic checkpoints and just-in-time state, failing by plan.

``python jit_plain_train.py '<json config>'`` under ft_launcher. Config keys:

    ckpt_dir: periodic checkpoints (rank 0 writes ``ckpt.pt`` every ``ckpt_every`` steps); required
    report_dir: where each rank appends ``report_rank<R>_cycle<C>.jsonl``; required
    steps: completed optimizer steps of a whole run (default 150)
    ckpt_every: default 100
    fault: {"rank": R, "cycle": C, "step": S, "kind": "crash" | "stop" | "raise"}: before the update
        that would complete step S+1 (loop index S), rank R of cycle C exits (os._exit(1)), stops
        itself (SIGSTOP, a hang) or raises ValueError
    width: the model's width (default 32)
    slow_extra: seconds the state's ``extra`` callable sleeps (a save that outlives its bound); it
        first creates ``<report_dir>/saving`` (the test knows a save is in progress)
    shared_copy: track_state gets ``ckpt_dir``: saves are copied to ``<ckpt_dir>/ft_jit_state/``
    corrupt_saved_state: rank 0 flips a byte of the state it saved in its exception path, then exits
        (it ignores SIGTERM, so the launcher's stop cannot come between the save and the flip)
    linger: {"rank": R, "until": PATH, "seconds": S}: after its training ended (monitoring shut down
        as finished), rank R reports ``lingering`` and waits until PATH exists (at most S seconds)
        before it exits: a rank still shutting down when another node's rank is gone

Report lines: {"op": "started", "step": S, "source": "jit"|"ckpt"|"none", "hash": H} and
{"op": "step", "step": S, "hash": H} after every completed step (H: parameters and optimizer state).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ft_core.client.integration as ft_integration


def state_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    for index, state in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            digest.update(f"{index}.{key}".encode())
            digest.update(value.detach().contiguous().numpy().tobytes() if torch.is_tensor(value)
                          else repr(value).encode())
    return digest.hexdigest()[:16]


def main() -> int:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    fault = cfg.get("fault") or {}
    fault_step = fault.get("step") if fault.get("rank") == rank and fault.get("cycle") == cycle else None
    report_path = os.path.join(cfg["report_dir"], f"report_rank{rank}_cycle{cycle}.jsonl")

    def report(**fields: Any) -> None:
        with open(report_path, "a") as stream:
            stream.write(json.dumps(fields) + "\n")

    torch.manual_seed(0)
    width = int(cfg.get("width", 32))
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                                        torch.nn.Linear(width, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ft_integration.setup(cfg["ckpt_dir"])
    def extra() -> dict[str, Any]:
        if cfg.get("slow_extra"):
            open(os.path.join(cfg["report_dir"], "saving"), "w").close()
            time.sleep(float(cfg["slow_extra"]))
        return {"rank": rank}

    ft_integration.track_state(model, optimizer, extra=extra,
                               checkpoint_dir=cfg["ckpt_dir"] if cfg.get("shared_copy") else None)
    if cfg.get("corrupt_saved_state") and rank == 0:
        # The launcher stops a survivor with SIGTERM once its peer failed; that must not end it
        # between its save and the corruption below (CI saw it once): it exits by itself, at once.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        saving_hook = sys.excepthook

        def corrupt_after_save(*args: Any) -> None:
            saving_hook(*args)
            for name in os.listdir(os.environ["FT_JIT_STATE_DIR"]):
                if name.endswith(".pt"):
                    with open(os.path.join(os.environ["FT_JIT_STATE_DIR"], name), "r+b") as stream:
                        stream.seek(100)
                        byte = stream.read(1)
                        stream.seek(100)
                        stream.write(bytes([byte[0] ^ 0xFF]))

        sys.excepthook = corrupt_after_save
    start, source = 0, "none"
    ckpt = os.path.join(cfg["ckpt_dir"], "ckpt.pt")
    if os.path.exists(ckpt):
        saved = torch.load(ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start, source = saved["step"], "ckpt"
        ft_integration.on_checkpoint_loaded(False, step=start)
    resumed = ft_integration.load_jit_state(model, optimizer, newer_than=start)
    if resumed is not None:
        start, source = resumed, "jit"
    report(op="started", step=start, source=source, hash=state_hash(model, optimizer),
           state_dir=os.environ.get("FT_JIT_STATE_DIR"))
    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(start, int(cfg.get("steps", 150))):
        ft_integration.on_training_step_start(step)
        batch = torch.randn(16, width, generator=generator)
        if step == fault_step:
            report(op="fault", step=step, kind=fault["kind"])
            if fault["kind"] == "crash":
                os._exit(1)
            if fault["kind"] == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if fault["kind"] == "raise":
                raise ValueError(f"planned failure at step {step}")
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        ft_integration.on_training_step_end()
        report(op="step", step=step + 1, hash=state_hash(model, optimizer))
        if rank == 0 and (step + 1) % int(cfg.get("ckpt_every", 100)) == 0:
            ft_integration.on_checkpointing_start()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                       ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
            ft_integration.on_checkpointing_end(is_async_finalization=False)
    report(op="end", step=int(cfg.get("steps", 150)))
    ft_integration.shutdown()
    dist.destroy_process_group()
    linger = cfg.get("linger") or {}
    if linger.get("rank") == rank:
        report(op="lingering")
        deadline = time.monotonic() + float(linger.get("seconds", 60))
        while not os.path.exists(linger["until"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
