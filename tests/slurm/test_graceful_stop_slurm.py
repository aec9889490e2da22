"""The coordinated graceful stop under a real SLURM: the walltime warning of ``sbatch
--signal=B:USR1@N`` with a time limit reaches warm-started Lightning workers through
scripts/autoresume.sh and ft_launcher.

One node, 2 ranks (DDP, gloo on CPU), ``FaultToleranceCallback(graceful_stop=True)``. In the first
attempt rank 1 crashes at step 120, so that ft_launcher restarts both ranks from the warm template
(or cold, with ``--no-warm-restarts``);
SLURM's warning comes later (the time limit is 3 minutes, the warning 120 s before it: SLURM sends
it from a periodic check, 50-90 s after the start here) and stops these warm workers. Every rank
saves at the agreed step, the launchers exit 0 without the finished flag, autoresume.sh requeues the
job, and the requeued job resumes at the stop step and finishes (its steps are fast).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import TERMINAL_STATES, SlurmRun
from tests.workers.autoresume_common import FT_LAUNCHER, SCRIPT, read_history, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]

TRAIN_WORKER = Path(__file__).resolve().parents[1] / "workers" / "lightning_train.py"
MAX_STEPS = 2000
CRASH_STEP = 120
LAUNCHER_ARGS = ("--nproc-per-node 2 --max-restarts 2 --monitor-interval 0.1 --term-timeout 20 "
                 "--ft-param-initial_rank_heartbeat_timeout 300 --ft-param-rank_heartbeat_timeout 120")
WAIT_S = 420.0


def reports(root: Path, rank: int, op: str, cycle: int) -> list[dict]:
    path = root / f"report_rank{rank}_cycle{cycle}.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op]


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_walltime_warning_stops_restarted_workers_gracefully_and_the_requeued_job_resumes_at_the_stop_step(
        slurm_run: SlurmRun, warm: bool) -> None:
    root = slurm_run.tmp_path / "train"
    cfg = {"callback": "heartbeats", "root": str(root), "ddp": True, "max_steps": MAX_STEPS,
           "step_sleep": 0.002, "step_sleep_by_attempt": {"1": 0.1},  # attempt 1 outlasts the warning
           "ckpt_every": 50, "resume": True, "report_steps": True,
           "cb": {"autoresume": True, "graceful_stop": True},
           "fail": {"step": CRASH_STEP, "exc": "SystemExit1", "rank": 1, "cycle": 0}}
    slurm_run.state_dir.mkdir(exist_ok=True)
    job_id = slurm_run.sbatch(
        "--requeue", "--time=3", "--signal=B:USR1@120", str(SCRIPT), "--launcher", str(FT_LAUNCHER),
        "--run-dir", str(slurm_run.run_dir),
        "--launcher-args", LAUNCHER_ARGS + ("" if warm else " --no-warm-restarts"),
        "--", str(TRAIN_WORKER), json.dumps(cfg),
        env={"TORCHINDUCTOR_CACHE_DIR": str(slurm_run.tmp_path / "torchinductor-cache")})
    started = time.monotonic()

    def done():
        job = slurm_run.job(job_id)
        history = slurm_run.run_dir / "history.tsv"
        if job.state in TERMINAL_STATES and (
                not history.exists() or not read_history(slurm_run.run_dir)[-1].decision.startswith("continue")):
            return job
        return None

    try:
        job = wait_for(done, WAIT_S, f"job {job_id} to end", interval=0.5)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{slurm_run.output(job_id)}") from None
    out = slurm_run.output(job_id, tail=None)
    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), out[-8000:]
    history = read_history(slurm_run.run_dir)
    assert [row.decision.split(":")[0] for row in history] == ["continue", "finished"], out[-8000:]
    assert "warning signal SIGUSR1, not a failure" in history[0].decision
    assert history[0].exit_code == "0"  # the launcher of attempt 1 exited 0: every rank stopped cleanly

    # Attempt 1, cycle 0: rank 1 crashed at CRASH_STEP; cycle 1 ran warm (forked by the template)
    # or cold, as asked.
    assert "SystemExit(1)" in reports(root, 1, "exception", 0)[0]["exc"]
    restarted = [reports(root, rank, "started", 1)[0] for rank in (0, 1)]
    assert all(("warm template" in r["parent"]) == warm for r in restarted), restarted
    assert all(r["attempt"] == "1" for r in restarted)
    # The warning stopped both warm ranks after the same step; each took part in the save there.
    stops = [reports(root, rank, "exception", 1)[0] for rank in (0, 1)]
    assert all("GracefulStopExit" in s["exc"] and "SIGUSR1" in s["text"] for s in stops), stops
    stop_step = stops[0]["global_step"]
    # Cycle 1 resumed from the last periodic checkpoint (before CRASH_STEP); when SLURM's warning
    # comes is up to its periodic check, so the stop may come before or after CRASH_STEP, but always
    # after the restarted ranks trained some steps.
    assert stops[1]["global_step"] == stop_step and stop_step > restarted[0]["global_step"], (stops, restarted)
    for rank in (0, 1):
        assert reports(root, rank, "save", 1)[-1]["global_step"] == stop_step
        assert max(r["global_step"] for r in reports(root, rank, "step", 1)) <= stop_step
    # The requeued job (attempt 2, a new launcher: cycle 0 again) resumed exactly there: nothing
    # trained in attempt 1 was lost, though the last periodic checkpoint was older.
    resumed = [[r for r in reports(root, rank, "started", 0) if r["attempt"] == "2"][0] for rank in (0, 1)]
    assert [r["global_step"] for r in resumed] == [stop_step, stop_step], resumed
    flag = json.loads((slurm_run.run_dir / "finished.flag").read_text())
    assert flag["global_step"] == MAX_STEPS
    print(f"graceful stop at step {stop_step}; job took {time.monotonic() - started:.0f} s")
