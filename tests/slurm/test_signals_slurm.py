"""Signals as SLURM really delivers them: ``scancel -s SIG JOB`` (no ``--batch``) has the step
daemon signal every process of the job step, here ``ft_launcher`` with its sentinel, monitors,
warm template, stand-ins and workers. After a warm restart, each worker's handler must run once
per signal (``tests/workers/signal_worker.py`` counts), every helper must survive SIGUSR1 and
SIGUSR2, and a job-wide SIGTERM must give the workers their full ``--term-timeout`` and end the
launcher with exit 0.
"""

from __future__ import annotations

import collections
import json
import shlex
from pathlib import Path

import pytest

from tests.slurm.conftest import JOB_TIMEOUT_S, TERMINAL_STATES, SlurmRun
from tests.workers.autoresume_common import FT_LAUNCHER, read_history, wait_for, worker_runs

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(240)]

SIGNAL_WORKER = Path(__file__).resolve().parents[1] / "workers" / "signal_worker.py"


def handled(directory: Path, cycle: int, rank: int) -> list[str]:
    path = directory / f"cycle{cycle}_rank{rank}.signals"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def events(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == kind]


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X")


def test_scancel_signals_reach_each_warm_worker_once_and_spare_every_helper(slurm_run: SlurmRun) -> None:
    work = slurm_run.tmp_path / "work"
    work.mkdir()
    event_log = slurm_run.tmp_path / "events.jsonl"
    launcher = [str(FT_LAUNCHER), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                "--monitor-interval", "0.05", "--warm-preload=", "--term-timeout", "20", "--ft-event-log",
                str(event_log), str(SIGNAL_WORKER), "--dir", str(work), "--crash-ranks", "0,1", "--stop-delay", "2"]
    job_id = slurm_run.sbatch("--wrap", "exec srun --ntasks=1 " + shlex.join(launcher))

    def until(condition, what: str) -> None:
        wait_for(lambda: condition() or slurm_run.job(job_id).state in TERMINAL_STATES, JOB_TIMEOUT_S, what)
        assert condition(), f"{what}: the job ended\n{slurm_run.output(job_id)}"

    until(lambda: all((work / f"cycle0_rank{r}.json").exists() for r in (0, 1))
          and list(slurm_run.private_tmp.glob("ft-*/warm.sock")), "cycle 0 and the warm template")
    (work / "crash").write_text("")  # both ranks exit 1: the restart forks cycle 1 from the template
    until(lambda: all((work / f"cycle1_rank{r}.json").exists() for r in (0, 1)), "cycle 1")

    for sig in ("USR1", "USR2"):
        slurm_run.slurm("scancel", f"--signal={sig}", job_id)
        until(lambda sig=sig: all(f"SIG{sig}" in handled(work, 1, r) for r in (0, 1)), f"SIG{sig} in both workers")
    helpers = {"sentinel": events(event_log, "launcher_start")[0]["sentinel_pid"],
               "warm template": events(event_log, "warm_template_started")[0]["pid"],
               **{f"monitor {i}": pid
                  for i, pid in enumerate(events(event_log, "monitors_started")[0]["monitor_pids"])},
               **{f"stand-in {r}": pid for r, pid in events(event_log, "cycle_start")[1]["stand_in_pids"].items()}}
    survived = {name: alive(pid) for name, pid in helpers.items()}
    slurm_run.slurm("scancel", "--signal=TERM", job_id)
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id)

    assert all(survived.values()), (survived, out)
    assert events(event_log, "cycle_start")[1]["warm_start"] is True
    for rank in (0, 1):
        assert collections.Counter(handled(work, 1, rank)) == {"SIGUSR1": 1, "SIGUSR2": 1, "SIGTERM": 1}, (
            rank, handled(work, 1, rank), out)
        assert (work / f"cycle1_rank{rank}.stopped").exists(), "the 2 s SIGTERM handler was cut short"
    received = events(event_log, "signal_received")
    assert [(r["signal"], r["job_wide"]) for r in received] == [("SIGUSR1", True), ("SIGUSR2", True)], received
    assert not events(event_log, "signal_forwarded")  # the workers had their own copies
    assert [(r["outcome"], r["exit_code"]) for r in events(event_log, "result")] == [("signal SIGTERM", 0)]
    assert (job.state, job.exit_code) == ("COMPLETED", 0), out


def test_a_stop_signal_to_the_job_steps_stops_the_autoresume_loop(slurm_run: SlurmRun) -> None:
    # scancel -s TERM without --batch: the batch shell does not see it, the job steps do. The
    # ranks checkpoint and exit 0 (ft_launcher exits 0); the node task reports the signal, so the
    # loop stops (a stop, not a clean ending to continue from) and the job is not requeued.
    job_id = slurm_run.submit(behaviour=["slow-stop"])
    ready = slurm_run.state_dir / "ready-0-1"
    wait_for(lambda: ready.exists() or slurm_run.job(job_id).state in TERMINAL_STATES, JOB_TIMEOUT_S,
             "the worker to start")
    assert ready.exists(), slurm_run.output(job_id)
    slurm_run.slurm("scancel", "--signal=TERM", job_id)
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id)

    history = read_history(slurm_run.run_dir)
    assert [(row.exit_code, row.decision) for row in history] == [
        ("0", "stop: terminated by SIGTERM (ft_launcher exit 0: the ranks stopped in time)")], out
    assert (slurm_run.state_dir / "stopped-0-1").exists(), out
    assert (job.restarts, job.exit_code) == (0, 128 + 15), out
    assert worker_runs(slurm_run.state_dir) == 1
