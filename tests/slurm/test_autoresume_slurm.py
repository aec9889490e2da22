"""scripts/autoresume.sh under a real SLURM: sbatch, srun, scontrol requeue, signals.

Jobs are submitted the way docs/autoresume.md says (``--requeue --open-mode=append``), with the
script itself as the batch script, so the per-node task reaches srun without a shared copy of
the script. The warning signal is sent with ``scancel --batch --signal=USR1``, which takes the
same path as ``--signal=B:USR1@N`` at the time limit without waiting for one (minutes).
Every job also has ``--time=5`` so that SLURM itself bounds a job that goes wrong.
"""

from __future__ import annotations

import pytest

from tests.slurm.conftest import JOB_TIMEOUT_S, TERMINAL_STATES, SlurmRun
from tests.workers.autoresume_common import read_history, wait_for, worker_runs

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(240)]


def decisions(run: SlurmRun) -> list[str]:
    return [row.decision.split(":")[0] for row in read_history(run.run_dir)]


def test_fails_twice_then_finishes_through_requeues(slurm_run: SlurmRun) -> None:
    job_id = slurm_run.submit("--max-failures", "3", behaviour=["fail-first", "2"])
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id, tail=None)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 2), out[-6000:]
    history = read_history(slurm_run.run_dir)
    assert [row.attempt for row in history] == [1, 2, 3]
    assert {row.job_id for row in history} == {job_id}
    assert [row.exit_code for row in history] == ["1", "1", "0"]
    assert [row.failures for row in history] == [1, 2, 0]
    assert decisions(slurm_run) == ["continue", "continue", "finished"]
    assert all(row.decision.endswith(f"job {job_id} requeued") for row in history[:2])
    assert [row.flag for row in history] == ["no", "no", "yes"]
    assert slurm_run.flag.exists()
    assert worker_runs(slurm_run.state_dir) == 3
    # --open-mode=append: the one log file holds all three attempts.
    assert [f"attempt {n} starts" in out for n in (1, 2, 3)] == [True, True, True], out[-6000:]


def test_always_failing_job_stops_after_the_maximum(slurm_run: SlurmRun) -> None:
    job_id = slurm_run.submit("--max-failures", "2", behaviour=["always-fail"])
    job = slurm_run.wait_done(job_id)

    assert (job.state, job.exit_code, job.restarts) == ("FAILED", 1, 1), slurm_run.output(job_id)
    history = read_history(slurm_run.run_dir)
    assert decisions(slurm_run) == ["continue", "stop"]
    assert [row.failures for row in history] == [1, 2]
    assert "2 consecutive failures, the maximum" in history[-1].decision
    assert not slurm_run.flag.exists()
    assert worker_runs(slurm_run.state_dir) == 2


def test_warning_signal_requeues_without_counting_a_failure(slurm_run: SlurmRun) -> None:
    # --max-failures 1: had the warning ending counted as a failure, the job would stop there.
    job_id = slurm_run.submit("--max-failures", "1", behaviour=["until-usr1"])
    ready = slurm_run.state_dir / "ready-0-1"
    wait_for(lambda: ready.exists() or slurm_run.job(job_id).state in TERMINAL_STATES, JOB_TIMEOUT_S,
             "the worker to wait for SIGUSR1")
    assert ready.exists(), slurm_run.output(job_id)
    # What SLURM does at --signal=B:USR1@N: signal the batch shell only.
    slurm_run.slurm("scancel", "--batch", "--signal=USR1", job_id)
    job = slurm_run.wait_done(job_id)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), slurm_run.output(job_id)
    history = read_history(slurm_run.run_dir)
    assert decisions(slurm_run) == ["continue", "finished"]
    assert "warning signal SIGUSR1, not a failure" in history[0].decision
    assert (history[0].exit_code, history[0].flag) == ("0", "no")
    assert [row.failures for row in history] == [0, 0]
    assert worker_runs(slurm_run.state_dir) == 2


@pytest.mark.parametrize("nodes", [1, 2])
def test_shutdown_workload_request_ends_the_job_without_requeue(slurm_run: SlurmRun, nodes: int) -> None:
    # With two nodes rank 0 asks on the first; both launchers stop and the loop reads 64.
    job_id = slurm_run.submit(behaviour=["shutdown"], nodes=nodes)
    job = slurm_run.wait_done(job_id)

    assert (job.state, job.exit_code, job.restarts) == ("FAILED", 64, 0), slurm_run.output(job_id)
    history = read_history(slurm_run.run_dir)
    assert len(history) == 1
    assert history[0].exit_code == "64"
    assert history[0].decision.startswith("stop: a rank requested ShutdownWorkload")
    assert not slurm_run.flag.exists()
    assert [worker_runs(slurm_run.state_dir, rank) for rank in range(nodes)] == [1] * nodes


def test_two_nodes_warning_reaches_both_and_the_job_resumes(slurm_run: SlurmRun) -> None:
    # One ft_launcher per node (srun), rendezvous on the first node; rank 1 runs on the second.
    job_id = slurm_run.submit("--max-failures", "1", behaviour=["until-usr1"], nodes=2)
    ready = [slurm_run.state_dir / f"ready-{rank}-1" for rank in (0, 1)]
    wait_for(lambda: all(path.exists() for path in ready) or slurm_run.job(job_id).state in TERMINAL_STATES,
             JOB_TIMEOUT_S, "both ranks to wait for SIGUSR1")
    assert all(path.exists() for path in ready), slurm_run.output(job_id)
    slurm_run.slurm("scancel", "--batch", "--signal=USR1", job_id)
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id, tail=None)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), out[-6000:]
    assert decisions(slurm_run) == ["continue", "finished"]
    assert [row.failures for row in read_history(slurm_run.run_dir)] == [0, 0]
    assert [worker_runs(slurm_run.state_dir, rank) for rank in (0, 1)] == [2, 2]
    assert "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:" in out
    assert out.count("launchers exited ptlr1:0 ptlr2:0") == 2, out[-6000:]


def test_job_that_cannot_be_requeued_is_refused_before_training(slurm_run: SlurmRun) -> None:
    # The harness's cluster has JobRequeue=0, like many sites: without --requeue no continuation.
    job_id = slurm_run.submit(behaviour=["finish"], sbatch_args=("--no-requeue",))
    job = slurm_run.wait_done(job_id)

    assert (job.state, job.exit_code) == ("FAILED", 2), slurm_run.output(job_id)
    assert "submit it with sbatch --requeue" in slurm_run.output(job_id)
    assert worker_runs(slurm_run.state_dir) == 0
