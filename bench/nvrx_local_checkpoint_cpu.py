"""Does NVRx 0.4.1's local checkpointing run on CPU (gloo)? One line per attempt, on 2 ranks.

Run with the interpreter of the venv that has NVRx (``make bench-peer`` builds ``.venv-peer``):
``.venv-peer/bin/python bench/nvrx_local_checkpoint_cpu.py [--json]``. It starts itself twice (ranks 0
and 1, gloo on 127.0.0.1) and each rank tries, on a CPU state dict of a small model and its optimizer,
what the reference's ``checkpointing.local`` documents for a training loop:

1. ``basic_state_dict``: wrap the state in ``BasicTensorAwareStateDict`` (the reference's own wrapper,
   what ``ptl_resiliency.LocalCheckpointCallback``'s users return from ``to_tensor_aware_state_dict``);
2. ``save_sync``: ``LocalCheckpointManager.save(..., is_async=False)`` without replication, with a
   wrapper that accepts CPU tensors (a subclass of ``TensorAwareStateDict`` written here), then
   ``find_latest`` and ``load``;
3. ``save_async``: the same save with ``is_async=True`` (what a cheap periodic save needs);
4. ``save_replicated``: the synchronous save with ``CliqueReplicationStrategy`` (each rank's copy
   kept by its peer: what survives a lost node).

Each attempt reports ``ok`` or the exception's type and message (the exact error). Rank 0 prints the
results; nothing outside a temporary directory is written.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

try:  # the reference's interface; at module level so that its checkpoints can pickle the class
    from nvidia_resiliency_ext.checkpointing.local.base_state_dict import TensorAwareStateDict as _TensorAwareStateDict
except ImportError:  # not installed: main() says so
    _TensorAwareStateDict = object  # type: ignore[assignment,misc]


def _torch() -> Any:
    import torch

    return torch


class CpuStateDict(_TensorAwareStateDict):
    """A flat CPU state: the interface's methods over a list of tensors (no CUDA anywhere)."""

    def __init__(self, tensors: list[Any]) -> None:
        self._tensors: list[Any] | None = tensors
        self._meta = [(t.shape, t.dtype) for t in tensors]

    def pop_tensors(self) -> list[Any]:
        popped, self._tensors = self._tensors, None
        return popped

    @property
    def tensors(self) -> list[Any]:
        return list(self._tensors or [])

    @property
    def is_hollow(self) -> bool:
        return self._tensors is None

    def insert_tensors(self, tensor_data: Any) -> None:
        self._tensors = list(tensor_data)

    def init_tensors(self) -> None:
        self._tensors = [_torch().empty(shape, dtype=dtype) for shape, dtype in self._meta]

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        pass  # already on the CPU

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        pass

    def values(self) -> Any:
        return {"tensors": self._tensors}.values()



def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _attempt(name: str, action: Callable[[], Any]) -> dict[str, Any]:
    try:
        detail = action()
        return {"attempt": name, "ok": True, "detail": detail}
    except Exception as error:  # noqa: BLE001 - the point is to record whatever the reference raises
        frames = traceback.extract_tb(error.__traceback__)
        ours = [f for f in frames if "nvidia_resiliency_ext" in f.filename] or frames  # the reference's own line
        where = f"{ours[-1].filename.split('site-packages/')[-1]}:{ours[-1].lineno}"
        return {"attempt": name, "ok": False, "error": f"{type(error).__name__}: {error}".strip(), "where": where}


def rank_main(rank: int, root: str) -> list[dict[str, Any]]:
    """One rank's attempts (the process group is already initialised)."""
    import torch
    import torch.distributed as dist
    from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
    from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
    from nvidia_resiliency_ext.checkpointing.local.replication.strategies import CliqueReplicationStrategy

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()

    def state() -> dict[str, Any]:
        return {"model": {k: v.clone() for k, v in model.state_dict().items()},
                "weight": [p.detach().clone() for p in model.parameters()]}

    def flat() -> CpuStateDict:
        return CpuStateDict([t.detach().clone() for t in model.state_dict().values()])

    def save_and_load(directory: str, strategy: Any = None, is_async: bool = False) -> str:
        manager = LocalCheckpointManager(os.path.join(root, directory), repl_strategy=strategy)
        request = manager.save(flat(), 100, is_async=is_async)
        if request is not None:  # an AsyncRequest: run its save here, then its finalize functions
            request.async_fn(*request.async_fn_args)
            for finalize in request.finalize_fns:
                finalize()
        latest = manager.find_latest()
        loaded, _ = manager.load()
        files = sorted(os.listdir(manager.local_ckpt_dir)) if os.path.isdir(manager.local_ckpt_dir) else []
        return f"find_latest={latest}, loaded {len(loaded.tensors)} tensors; rank {rank}'s directory: {files}"

    group = dist.new_group([0, 1], backend="gloo")
    return [
        _attempt("basic_state_dict", lambda: type(BasicTensorAwareStateDict(state())).__name__),
        _attempt("save_sync", lambda: save_and_load("sync")),
        _attempt("save_async", lambda: save_and_load("async", is_async=True)),
        _attempt("save_replicated", lambda: save_and_load("replicated", CliqueReplicationStrategy(group))),
    ]


def worker(rank: int, port: int, root: str) -> int:
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2",
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = rank_main(rank, root)
    if rank == 0:
        print(json.dumps(results))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the text lines")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=120.0, help="bound on the two ranks, seconds")
    args = parser.parse_args(argv)
    if args.rank is not None:
        return worker(args.rank, args.port, args.root)
    try:
        import nvidia_resiliency_ext.checkpointing.local  # noqa: F401
    except ImportError as error:
        print(f"nvrx_local_checkpoint_cpu: NVRx is not installed for {sys.executable} ({error}); run it with "
              "the venv of `make bench-peer` (.venv-peer/bin/python)", file=sys.stderr)
        return 2
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="nvrx-local-cpu-") as root:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--port", str(port),
                                   "--root", root], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in (0, 1)]
        outs = []
        for proc in procs:
            try:
                outs.append(proc.communicate(timeout=args.timeout))
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                print(f"nvrx_local_checkpoint_cpu: the ranks did not finish in {args.timeout:g} s", file=sys.stderr)
                return 1
    if procs[0].returncode != 0:
        print(outs[0][1][-3000:], file=sys.stderr)
        return 1
    results = json.loads(outs[0][0].strip().splitlines()[-1])
    if args.json:
        print(json.dumps({"results": results}))
    else:
        for result in results:
            print(f"{result['attempt']}: " + ("ok (" + str(result["detail"]) + ")" if result["ok"]
                                               else f"{result['error']} (at {result['where']})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
