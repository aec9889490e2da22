"""Training job of bench/goodput_realistic.py: a 2-rank DDP loop with a 210 MB state and planned faults.

Started by ``scripts/autoresume.sh`` through a launcher (ours or NVRx's ``ft_launcher``), one
process per rank. The model is an embedding table of 409 600 x 64 floats with sparse gradients and
a small head, trained with Adagrad (its ``sum`` state is as large as the table): 105 MB of
parameters and 105 MB of optimizer state, the size of a small recommender's table, while a step
stays cheap on CPU (only the rows of the batch are touched and all-reduced, gloo). ``--step-time``
seconds of sleep per step stand in for the rest of a real model's compute.

Checkpoints are real: rank 0 writes the whole state with ``torch.save`` every
``--checkpoint-every`` steps (the other rank waits for it in the next all-reduce, as in a real job),
and every process resumes from it. With ``--jit`` (ours) the loop also registers its state for
just-in-time saves (``ft_core.integration.track_state``) and resumes from the survivors' state when
the launcher hands one over (``load_jit_state``); it tells its monitor where it resumed from
(``RankMonitorClient.report_resumed``), so ``ft_report`` can show each failure's cost. Both tools
send a heartbeat per step through their ``RankMonitorClient``.

Faults are planned by the bench (``--faults``, a JSON list of ``{"step": S, "kind": "hang"|"kill"|"node"}``):
rank ``--fault-rank`` (``-1``: any rank, for a job whose faults are given to one node's launcher
only) makes fault k at the start of loop step S (S steps completed), once in the whole run: it
records ``RUN_DIR/bench/fault_<k>.json`` (atomically), then stops itself with ``SIGSTOP`` (a hang:
only a monitor notices; a node loss: ``bench/goodput_node_loss.py`` sees the record and kills the
node's launcher and workers together) or ``SIGKILL``.

Rank 0 appends to ``RUN_DIR/bench/progress.log`` (``os.write``, ``O_APPEND``: nothing is lost to a
kill): ``start <pid> <time>`` first, ``resume <pid> <step> <source> <time>`` when its state is loaded
and the loop starts, ``step <pid> <completed step> <time>`` after each step, ``ckpt <pid> <step>
<seconds> <time>`` after each checkpoint, ``end <pid> <step> <time>``.
"""

import time

STARTED = time.time()  # first statement: when this process (a replacement, after a fault) began

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import ProgressRecorder  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
ROWS, DIM, BATCH = 409_600, 64, 512


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--impl", choices=("ours", "nvrx"), required=True)
    parser.add_argument("--jit", action="store_true", help="ours: save/restore just-in-time state")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--step-time", type=float, default=0.02, help="seconds each step sleeps")
    parser.add_argument("--rows", type=int, default=ROWS, help="embedding rows (state = rows x 64 x 8 bytes)")
    parser.add_argument("--faults", default="[]", help='JSON: [{"step": S, "kind": "hang"|"kill"}, ...]')
    parser.add_argument("--fault-rank", type=int, default=1, help="-1: whichever rank this process is")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    bench_dir = args.run_dir / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    recorder = ProgressRecorder(bench_dir / "progress.log", RANK)
    recorder.line("start", os.getpid(), f"{STARTED:.6f}")
    faults = json.loads(args.faults)

    import warnings

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench import _impl

    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    recorder.line("phase", os.getpid(), "imported", f"{time.time():.6f}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    recorder.line("phase", os.getpid(), "process_group", f"{time.time():.6f}")
    client = _impl.core(args.impl).RankMonitorClient()
    client.init_workload_monitoring()
    recorder.line("phase", os.getpid(), "monitored", f"{time.time():.6f}")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(args.rows, DIM, sparse=True)
            self.head = torch.nn.Linear(DIM, 1)

        def forward(self, index: torch.Tensor) -> torch.Tensor:
            return self.head(self.table(index)).squeeze(-1)

    torch.manual_seed(0)
    model = DistributedDataParallel(Model())
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.01)
    recorder.line("phase", os.getpid(), "model", f"{time.time():.6f}")
    checkpoint = args.run_dir / "checkpoint.pt"
    checkpoint_step = args.run_dir / "checkpoint.step"  # read without loading 210 MB
    start, source = 0, "scratch"
    saved_step = int(checkpoint_step.read_text()) if checkpoint_step.exists() else 0
    if args.jit:
        from ft_core import integration

        integration.track_state(model, optimizer)
        restored = integration.load_jit_state(model, optimizer, newer_than=saved_step)
        if restored is not None:
            start, source = restored, "jit"
    if source == "scratch" and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, source = state["step"], "checkpoint"
    if hasattr(client, "report_resumed"):  # ours: ft_report shows each failure's cost
        client.report_resumed(start, source)
    recorder.line("resume", os.getpid(), start, source, f"{time.time():.6f}")

    for step in range(start, args.max_steps):
        if args.fault_rank < 0 or RANK == args.fault_rank:
            for number, fault in enumerate(faults):
                record = bench_dir / f"fault_{number}.json"
                if fault["step"] == step and not record.exists():
                    data = {"fault": number, "kind": fault["kind"], "rank": RANK, "pid": os.getpid(), "step": step,
                            "time": time.time()}
                    (bench_dir / f".fault_{number}.tmp").write_text(json.dumps(data))
                    os.replace(bench_dir / f".fault_{number}.tmp", record)
                    # a node loss: stopped here until the bench kills this node's launcher and workers
                    os.kill(os.getpid(), signal.SIGKILL if fault["kind"] == "kill" else signal.SIGSTOP)
        if hasattr(client, "set_step"):
            client.set_step(step)
        generator = torch.Generator().manual_seed(step * 2 + RANK)  # the batch depends on the step only
        index = torch.randint(0, args.rows, (BATCH,), generator=generator)
        time.sleep(args.step_time)  # stands in for a real model's compute
        loss = (model(index) - 1.0).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        client.send_heartbeat()
        recorder.line("step", os.getpid(), step + 1, f"{time.time():.6f}")
        if RANK == 0 and (step + 1) % args.checkpoint_every == 0:
            began = time.time()
            state: dict[str, Any] = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                     "step": step + 1}
            torch.save(state, str(checkpoint) + ".tmp")
            os.replace(str(checkpoint) + ".tmp", checkpoint)
            checkpoint_step.write_text(str(step + 1))
            recorder.line("ckpt", os.getpid(), step + 1, f"{time.time() - began:.3f}", f"{time.time():.6f}")
    recorder.line("end", os.getpid(), args.max_steps, f"{time.time():.6f}")
    dist.barrier()
    if RANK == 0:
        Path(os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE") or args.run_dir / "finished.flag").write_text("finished\n")
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
