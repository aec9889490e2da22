"""Training job of bench/soak.py: a 2-rank loop with realistic jitter under calculated timeouts.

Started by ``scripts/autoresume.sh`` through ``ft_launcher`` (one process per rank, gloo on CPU).
The loop uses ``ft_core.client.integration`` (sections ``setup``, ``step``, ``checkpointing`` and the
out-of-section time) with ``calculate_timeouts=True`` and ``graceful_stop=True``, and resumes
from ``RUN_DIR/ckpt/checkpoint.json``. What makes its timing realistic (``--plan``, a JSON file
written by bench/soak.py, holds the parameters and the seed):

- **heavy-tailed step times**: each step sleeps ``step_time`` x a log-normal factor (sigma 0.5)
  and, with probability ``tail_p``, a Pareto-distributed multiple (alpha 1.5, at most 40x);
- **pauses** of 0.5-3 s (a GC pause, a data-loader stall, a busy node), with probability
  ``pause_p`` per step on each rank, inside the step or between steps; the other rank waits for
  the paused one in the next all-reduce, as in DDP;
- a **slow first step** in every run (2-6 s: compilation, allocator warm-up);
- an **evaluation** every ``eval_every`` steps (``eval_steps`` jittered steps);
- **checkpoints of varying length** every ``ckpt_every`` steps (0.2-3 s inside the section);
- a **resume in the middle**: bench/soak.py sends SIGUSR1 to autoresume.sh; the graceful stop
  saves and exits 0, and the next attempt resumes (its setup and out-of-section timeouts are then
  calculated too).

**Real hangs** are planned in ``hangs``: ``{"at": seconds after the job start, "rank": R, "where":
"step" | "checkpointing" | "out_of_section"}``. The first time the rank passes that point after
``at`` it records ``RUN_DIR/bench/hang_<k>.json`` (atomically, with the time) and sleeps until
its monitor kills it; the record keeps it from hanging again after the restart.

The job is complete once ``duration`` seconds passed since the job start (rank 0 decides; the
decision travels in the step's all-reduce, so every rank ends after the same step): a last
checkpoint, rank 0 creates the finished flag, and autoresume.sh ends.

Every rank appends one JSON line per event to ``RUN_DIR/bench/rank<R>.jsonl`` (``os.write`` on an
``O_APPEND`` descriptor, so a killed process loses nothing written): ``start``, ``pause``, ``save``
(with the timeouts in force), ``hang``, ``stop`` (graceful), ``end``.
"""

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HANG_SECONDS = 100_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--plan", type=Path, required=True)
    args = parser.parse_args()
    plan = json.loads(args.plan.read_text())

    import torch
    import torch.distributed as dist

    import ft_core.client.integration as ft
    from ft_core.wire.atomic import atomic_write_text

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    bench = args.run_dir / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    ckpt_dir = args.run_dir / "ckpt"
    ckpt_file = ckpt_dir / "checkpoint.json"
    fd = os.open(bench / f"rank{rank}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(event: str, **fields: object) -> None:
        line = {"event": event, "rank": rank, "pid": os.getpid(), "time": round(time.time(), 4), **fields}
        os.write(fd, (json.dumps(line) + "\n").encode())

    job_start = float(plan["start"])
    hangs = plan.get("hangs", [])

    def maybe_hang(where: str, step: int) -> None:
        now = time.time()
        for index, hang in enumerate(hangs):
            if hang["rank"] != rank or hang["where"] != where or now - job_start < hang["at"]:
                continue
            marker = bench / f"hang_{index}.json"
            if marker.exists():
                continue
            record = {"index": index, "rank": rank, "where": where, "step": step, "started_at": time.time(),
                      "pid": os.getpid()}
            atomic_write_text(marker, json.dumps(record))
            note("hang", **record)
            time.sleep(HANG_SECONDS)  # a real hang: only the monitor ends it

    rng = random.Random(f"{plan['seed']}-{rank}-{STARTED}")
    step_time = float(plan["step_time"])

    def work() -> float:
        """One step's or eval step's compute: heavy-tailed."""
        seconds = step_time * rng.lognormvariate(0.0, 0.5)
        if rng.random() < plan["tail_p"]:
            seconds = step_time * min(rng.paretovariate(1.5), 40.0)
        return seconds

    def maybe_pause(where: str, step: int) -> None:
        if rng.random() < plan["pause_p"]:
            seconds = rng.uniform(0.5, 3.0)
            note("pause", where=where, step=step, seconds=round(seconds, 3))
            time.sleep(seconds)

    ft.setup(ckpt_dir, calculate_timeouts=True, graceful_stop=True)
    start = 0
    if ckpt_file.exists():
        start = json.loads(ckpt_file.read_text())["step"]
        ft.on_checkpoint_loaded(is_local_chkpt=False)
    note("start", step=start, attempt=os.environ.get("AUTORESUME_ATTEMPT"),
         cycle=os.environ.get("FT_LAUNCHER_CYCLE"), started=STARTED)

    longest = [0.0]  # the longest step (start to end, waits for the other rank included) since the last save

    def save(step: int) -> None:
        ft.on_checkpointing_start()
        maybe_hang("checkpointing", step)
        time.sleep(rng.uniform(0.2, 3.0))  # checkpoints of varying length
        if rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(ckpt_file, json.dumps({"step": step}))
        dist.barrier()
        ft.on_checkpointing_end(is_async_finalization=False)
        client = ft.get_rank_monitor_client()
        note("save", step=step, timeouts=client.section_timeouts.to_dict() if client else None,
             longest_step_s=round(longest[0], 3))
        longest[0] = 0.0

    flags = torch.zeros(2)
    step = start
    first = True
    while True:
        step += 1
        maybe_hang("out_of_section", step)
        maybe_pause("between", step)
        step_began = time.monotonic()
        ft.on_training_step_start(step)
        maybe_hang("step", step)
        seconds = work() + (rng.uniform(2.0, 6.0) if first else 0.0)  # the first step compiles
        first = False
        time.sleep(seconds)
        maybe_pause("step", step)
        flags.zero_()
        flags[0] = 1.0 if rank == 0 and time.time() - job_start >= plan["duration"] else 0.0
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        ft.on_training_step_end()
        longest[0] = max(longest[0], time.monotonic() - step_began)
        if ft.should_stop():  # graceful stop (the resume in the middle): save, exit 0, no flag
            save(step)
            note("stop", step=step, signal=ft.get_integration().graceful_stop.describe_stop())
            break
        if step % plan["eval_every"] == 0:
            for _ in range(plan["eval_steps"]):
                ft.on_eval_step_start()
                time.sleep(work())
                dist.all_reduce(flags[1:])
                ft.on_eval_step_end()
        if flags[0] > 0:  # the job's time is up: a last checkpoint, then the finished flag
            save(step)
            if rank == 0 and os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE"):
                atomic_write_text(os.environ["FAULT_TOL_FINISHED_FLAG_FILE"], json.dumps({"step": step}))
            note("end", step=step)
            break
        if step % plan["ckpt_every"] == 0:
            save(step)
    ft.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
