"""A small gloo training job for the multi-node cluster tests (tests/cluster).

One process per rank under ``ft_launcher``: a tiny model trained with DDP on CPU (gloo),
a heartbeat per step, a checkpoint every ``--save-every`` steps to a directory all nodes share,
resume from the newest checkpoint at start. It writes a timeline the tests read, one JSON line
per event in ``<run-dir>/timeline/<node>.jsonl`` (all "nodes" share this machine's clock):

- ``pg_ready``: the process group is up and the first collective went through (after a restart:
  "back in the process group"), with the step it resumes from;
- ``saved``: a checkpoint was written (rank 0);
- ``stopped``: a stop signal (SIGUSR1 or SIGTERM: a time limit's warning, a preemption) made every
  rank agree on a step (``ft_core.client.graceful_stop``, the coordinated graceful stop), save and stop;
- ``done``: the last step ran; rank 0 then creates the finished flag of ``autoresume.sh``.

Faults it can play (the node faults are injected from outside, by the tests):
``--hang-node NODE --hang-step S``: the rank of NODE stops making progress at step S, in the
first cycle of the first attempt only. ``--fail-on-attempt A``: rank 0 exits 1 at step 10 in
autoresume attempt A. ``--crash-marker PATH``: a rank whose node finds the file PATH (``{node}``
replaced by its name: a marker in that node's view only) raises at ``--crash-step`` in every cycle
and attempt, a bad node. ``--crash-node NODE``: the rank of NODE exits at once (``os._exit(1)``:
no exception path, so its node saves no just-in-time state) before the forward of loop index
``--crash-step``, i.e. with that many optimizer steps completed, in the first cycle of the first
attempt only.

Just-in-time state (``--jit-state``): the loop registers its model and optimizer
(``ft_core.client.plain_state.track_state``) and, after a restart, loads the state the launchers
agreed on when it is newer than the periodic checkpoint (``load_jit_state``). It then reports where
it resumed from (``RankMonitorClient.report_resumed``: the ``resumed`` records ``ft_report``'s
failure costs use), and ``pg_ready`` carries that ``source``, the hash of its parameters and, with
``--state-mb`` MB of extra state (a known tensor saved with the state), whether it came back intact.
A deterministic replace (``--replace-node NODE --replace-step S --replace-go PATH``): started from
scratch, every rank waits at step S (heartbeats going on, ``holding``) until PATH exists, then the
rank of NODE asks its launcher to replace its node (``ExcludeThisNode`` only if a spare can take
its place: the straggler detector's replace request) and waits to be killed.

Straggler detection (off by default): ``--straggler-interval S`` runs
``ft_core.integration.straggler_detection`` with ``action="replace"`` (reports every S seconds, a node
flagged in ``--straggler-replace-after`` reports in a row leaves at the next checkpoint).
``--compute-iters N`` gives the forward real CPU work (N matmuls of 128x128, one thread), so that
a CPU cap on a node (``fault.sh cpuslow``) slows its rank's compute; without it the step is a sleep.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from ft_core import RankMonitorClient, WorkloadAction, WorkloadControlRequest
from ft_core.client import plain_state
from ft_core.client.collectives import TorchDistributedCollectives
from ft_core.client.graceful_stop import GracefulStop, GracefulStopConfig
from ft_core.wire.atomic import atomic_write_bytes, atomic_write_text

NODE = os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, required=True, help="shared: checkpoints and the timeline")
    p.add_argument("--steps", type=int, default=200, help="training is complete after this many steps")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of 'compute' per step")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--hang-node", help="the node whose rank hangs (first cycle, first attempt)")
    p.add_argument("--hang-step", type=int, default=20)
    p.add_argument("--fail-on-attempt", help="rank 0 exits 1 at step 10 in this autoresume attempt")
    p.add_argument("--crash-marker", help="a rank whose node has this file ({node}: the node's name) raises at "
                                          "--crash-step in every cycle and attempt")
    p.add_argument("--crash-step", type=int, default=15)
    p.add_argument("--crash-node", help="the node whose rank exits (os._exit) at --crash-step (first cycle, "
                                        "first attempt)")
    p.add_argument("--jit-state", action="store_true",
                   help="track the model and optimizer for just-in-time state and resume from it")
    p.add_argument("--payload", type=int, default=1024,
                   help="floats all-reduced per step on top of the gradients (link load)")
    p.add_argument("--compute-iters", type=int, default=0,
                   help="128x128 matmuls in each forward: CPU work a CPU cap slows (0: none)")
    p.add_argument("--straggler-interval", type=float, default=0.0,
                   help="seconds between straggler reports, with action replace (0: no straggler detection)")
    p.add_argument("--straggler-replace-after", type=int, default=3,
                   help="reports in a row a node must be flagged in before it leaves")
    p.add_argument("--state-mb", type=float, default=0.0,
                   help="with --jit-state: MB of extra state saved with it (a known tensor, checked when loaded)")
    p.add_argument("--replace-node", help="the node whose rank asks to be replaced (started from scratch)")
    p.add_argument("--replace-step", type=int, default=30)
    p.add_argument("--replace-go", help="every rank waits at --replace-step until this file exists (300 s at most)")
    return p.parse_args()


HOLD_BOUND_S = 300.0  # a rank waits this long at most for the test's go, or to be killed


def params_hash(model: nn.Module) -> str:
    """The parameters' bytes, hashed: the same on every rank of a DDP job, at the same step."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def hold_for_replace(args: argparse.Namespace, client: RankMonitorClient, timeline: Timeline, step: int,
                     model: nn.Module) -> None:
    """Wait (heartbeats going on) until the test's go file exists; then the rank of
    ``--replace-node`` asks to be replaced and waits for its launcher to kill it."""
    timeline.write("holding", step=step, hash=params_hash(model))
    deadline = time.monotonic() + HOLD_BOUND_S
    while not os.path.exists(args.replace_go):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no go file {args.replace_go} within {HOLD_BOUND_S:.0f} s")
        client.send_heartbeat()
        time.sleep(0.2)
    if NODE != args.replace_node:
        return  # on into the step: its collective fails once the replaced node's rank is killed
    timeline.write("replace_requested", step=step)
    client.send_workload_control_request(WorkloadControlRequest(
        WorkloadAction.ExcludeThisNode, f"test: replace {NODE} at step {step}", only_if_replaceable=True))
    time.sleep(HOLD_BOUND_S)  # its launcher SIGKILLs it at once
    raise RuntimeError(f"still running {HOLD_BOUND_S:.0f} s after asking to replace {NODE}")


class Net(nn.Module):
    """The tiny model, with ``compute_iters`` matmuls of fixed work in its forward (the compute
    straggler detection times; the matmuls carry no gradient, so the backward stays tiny)."""

    def __init__(self, compute_iters: int) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)
        self.compute_iters = compute_iters
        self.work = torch.randn(128, 128) / 128 ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_iters:
            with torch.no_grad():
                y = self.work
                for _ in range(self.compute_iters):
                    y = torch.tanh(y @ self.work)
        return self.linear(x)


class Timeline:
    def __init__(self, run_dir: Path, rank: int, cycle: int, attempt: str):
        self.path = run_dir / "timeline" / f"{NODE}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.base = {"node": NODE, "rank": rank, "cycle": cycle, "attempt": attempt, "pid": os.getpid()}

    def write(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": time.time(), **self.base, **fields}) + "\n"
        with open(self.path, "a") as f:  # one short O_APPEND write per line
            f.write(line)


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, dict | None]:
    pointer = ckpt_dir / "latest"
    if not pointer.exists():
        return 0, None
    name = pointer.read_text().strip()
    state = torch.load(ckpt_dir / name, weights_only=True)
    return int(state["step"]), state


@record  # the traceback goes to the error file, where the launcher takes the failure's fingerprint from
def main() -> int:
    args = parse_args()
    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("FT_LAUNCHER_CYCLE", "0"))
    attempt = os.environ.get("AUTORESUME_ATTEMPT", "1")
    timeline = Timeline(args.run_dir, rank, cycle, attempt)
    stopper = GracefulStop(GracefulStopConfig(check_interval=0.5))
    stopper.install()

    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo")
    collectives = TorchDistributedCollectives()
    torch.manual_seed(0)
    if args.compute_iters:
        torch.set_num_threads(1)  # fixed work on one core: a cap on the node slows it, not the thread count
    model = DistributedDataParallel(Net(args.compute_iters))
    stragglers = None
    if args.straggler_interval > 0:
        import logging

        import ft_core.integration as ft_integration

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # the report lines

        # Relative score only: every node shares this machine's cores, so each rank's own speed
        # moves with the load (the individual score's business), the ratio to the others does not.
        # min_samples 5: a report of a few seconds still gets a score when the steps are slow.
        stragglers = ft_integration.straggler_detection(
            report_time_interval=args.straggler_interval, individual_threshold=None, action="replace",
            replace_after=args.straggler_replace_after, node_name=NODE, num_to_print=3, min_samples=5)
        stragglers.instrument(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt_dir = args.run_dir / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    start, state = latest_checkpoint(ckpt_dir)
    source = "scratch"
    if state is not None:
        model.module.linear.load_state_dict(state["model"])
        source = "checkpoint"
    extra_ok = None
    if args.jit_state:
        # known content: a restored copy that differs (a transfer gone wrong) shows in pg_ready
        blob = torch.arange(int(args.state_mb * 2 ** 18), dtype=torch.float32)

        def check_extra(extra: dict) -> None:
            nonlocal extra_ok
            extra_ok = bool(torch.equal(extra["blob"], blob))

        # no checkpoint_dir: the state stays node-local
        plain_state.track_state(model, optimizer, extra=(lambda: {"blob": blob}) if args.state_mb else None)
        resumed = plain_state.load_jit_state(model, optimizer, newer_than=start, load_extra=check_extra)
        if resumed is not None:
            start, source = resumed, "jit"
        client.report_resumed(start, source)
    flag = torch.zeros(1 + args.payload)
    dist.all_reduce(flag)
    timeline.write("pg_ready", step=start, world_size=dist.get_world_size(), source=source,
                   hash=params_hash(model.module), extra_ok=extra_ok)

    def save(step: int) -> None:
        if rank != 0:
            return
        name = f"step_{step:06d}.pt"
        import io
        buf = io.BytesIO()
        torch.save({"step": step, "model": model.module.linear.state_dict()}, buf)
        atomic_write_bytes(str(ckpt_dir / name), buf.getvalue())
        atomic_write_text(str(ckpt_dir / "latest"), name)
        timeline.write("saved", step=step)

    hang = args.hang_node == NODE and cycle == 0 and attempt == "1"
    crash = args.crash_node == NODE and cycle == 0 and attempt == "1"
    # the job's first start only: not a spare's first cycle, which resumes at the step held
    replace_here = bool(args.replace_go) and source == "scratch" and attempt == "1"
    bad_node = bool(args.crash_marker) and os.path.exists(args.crash_marker.replace("{node}", NODE))
    step = start
    while step < args.steps:
        client.set_step(step)
        if crash and step == args.crash_step:  # `step` optimizer steps completed, the next one not begun
            timeline.write("crash", step=step)
            os._exit(1)
        if replace_here and step == args.replace_step:
            hold_for_replace(args, client, timeline, step, model.module)
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.fail_on_attempt == attempt and rank == 0 and step == 10:
            timeline.write("fail", step=step)
            return 1
        if bad_node and step == args.crash_step:
            timeline.write("crash", step=step)
            raise RuntimeError(f"checksum mismatch in step {step}")
        if hang and step == args.hang_step:  # the others wait for it in the all_reduce below
            timeline.write("hang", step=step)
            time.sleep(3600)
        dist.all_reduce(flag)  # the link load
        step += 1
        client.send_heartbeat()
        if stopper.step_ended(collectives):
            save(step)
            timeline.write("stopped", step=step, why=stopper.describe_stop())
            dist.barrier()
            dist.destroy_process_group()
            client.shutdown_workload_monitoring()
            return 0
        if stragglers is not None:
            outcome = stragglers.on_training_step_end()  # every rank; a collective at report steps
            if outcome is not None and rank == 0:
                timeline.write("straggler_report", step=step, nodes=sorted(outcome.nodes),
                               replace=sorted(outcome.replace_nodes))
        if step % args.save_every == 0:
            save(step)
            if stragglers is not None:
                stragglers.on_checkpoint_saved()  # a node to be replaced leaves here (its launcher SIGKILLs it)
        time.sleep(args.step_time)
    save(step)
    timeline.write("done", step=step)
    dist.barrier()
    flag_file = os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE")
    if rank == 0 and flag_file:
        atomic_write_text(flag_file, f"finished at step {step}\n")
    dist.destroy_process_group()
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
