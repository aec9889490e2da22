"""scripts/autoresume.sh under a real SLURM: sbatch, srun, scontrol requeue, signals.

Jobs are submitted the way docs/autoresume.md says (``--requeue --open-mode=append``), with the
script itself as the batch script, so the per-node task reaches srun without a shared copy of
the script. The warning signal is sent with ``scancel --batch --signal=USR1``, which takes the
same path as ``--signal=B:USR1@N`` at the time limit without waiting for one (minutes).
Every job also has ``--time=5`` so that SLURM itself bounds a job that goes wrong.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from tests.slurm.conftest import JOB_TIMEOUT_S, TERMINAL_STATES, SlurmRun
from tests.workers.autoresume_common import read_history, wait_for, worker_runs

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(240)]


def decisions(run: SlurmRun) -> list[str]:
    return [row.decision.split(":")[0] for row in read_history(run.run_dir)]


def nodes_of_attempts(out: str, attempts: int) -> list[str]:
    """The node each of the first ``attempts`` attempts ran on, from the job's log (1-node jobs)."""
    return [re.search(rf"attempt {n}: launchers exited (\S+):", out).group(1) for n in range(1, attempts + 1)]


def test_fails_twice_then_finishes_through_requeues(slurm_run: SlurmRun) -> None:
    # The same failure on two nodes would be a repeating bug (--max-repeats); here it stands for
    # two bad nodes, each excluded after its first failure.
    job_id = slurm_run.submit("--max-failures", "3", "--max-repeats", "0", "--node-failures-to-exclude", "1",
                              behaviour=["fail-first", "2"])
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id, tail=None)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 2), out[-6000:]
    history = read_history(slurm_run.run_dir)
    assert [row.attempt for row in history] == [1, 2, 3]
    assert {row.job_id for row in history} == {job_id}
    assert [row.exit_code for row in history] == ["1", "1", "0"]
    assert [row.failures for row in history] == [1, 2, 0]
    assert decisions(slurm_run) == ["continue", "continue", "finished"], ([r.decision for r in history], out[-6000:])
    # The crashed rank's node is kept out of the next allocation; after attempt 2 failed on the
    # other node, excluding both would leave no node for the job: the list is dropped.
    ran_on = nodes_of_attempts(out, 3)
    assert ran_on[1] != ran_on[0], ran_on
    assert history[0].decision.endswith(f"job {job_id} requeued excluding {ran_on[0]}"), history[0].decision
    assert f"attempt 1: node {ran_on[0]} caused a failure: root cause of the failure" in out, out[-6000:]
    assert history[1].decision.endswith(f"job {job_id} requeued excluding no node"), history[1].decision
    assert "node(s) would no longer fit in the 2 of the partition; list dropped" in out, out[-6000:]
    assert "ExcNodeList=(null)" in slurm_run.slurm("scontrol", "show", "job", "-o", job_id)
    assert [row.flag for row in history] == ["no", "no", "yes"]
    assert slurm_run.flag.exists()
    assert worker_runs(slurm_run.state_dir) == 3
    # --open-mode=append: the one log file holds all three attempts.
    assert [f"attempt {n} starts" in out for n in (1, 2, 3)] == [True, True, True], out[-6000:]


def test_a_requeue_signalled_before_scontrol_returns_is_a_requeue(slurm_run: SlurmRun) -> None:
    # Once slurmctld requeued the job it signals every process of the step, scontrol included.
    # On a busy node that signal once beat scontrol's exit 0 and the script logged "scontrol
    # requeue failed". A scontrol that lingers after a successful requeue makes it certain.
    shim_dir = slurm_run.tmp_path / "slow-scontrol"
    shim_dir.mkdir()
    shim = shim_dir / "scontrol"
    shim.write_text(f"""#!/bin/bash
{shutil.which("scontrol")} "$@"; rc=$?
if [ "$1" = requeue ] && [ "$rc" = 0 ]; then sleep 20; fi
exit "$rc"
""")
    shim.chmod(0o755)
    job_id = slurm_run.submit("--max-failures", "3", behaviour=["fail-first", "1"],
                              env={"PATH": f"{shim_dir}:{os.environ['PATH']}"})
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id, tail=None)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), out[-6000:]
    history = read_history(slurm_run.run_dir)
    assert decisions(slurm_run) == ["continue", "finished"], ([r.decision for r in history], out[-6000:])
    assert "requeued" in history[0].decision
    assert "was stopped by SLURM's signal to the requeued job" in out


def test_exclude_this_node_requeues_the_job_on_another_node(slurm_run: SlurmRun) -> None:
    # A rank asks ExcludeThisNode: ft_launcher exits 65, the job is requeued without that node
    # (SLURM's ExcNodeList), and the next attempt runs on the other node.
    job_id = slurm_run.submit("--max-failures", "3", behaviour=["exclude-first", "1"])
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id, tail=None)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), out[-6000:]
    history = read_history(slurm_run.run_dir)
    assert [row.exit_code for row in history] == ["65", "0"]
    ran_on = nodes_of_attempts(out, 2)
    assert ran_on[1] != ran_on[0], ran_on
    assert f"attempt 1: node {ran_on[0]} caused a failure: ExcludeThisNode" in out, out[-6000:]
    assert "ExcludeThisNode" in history[0].decision, history[0].decision
    assert history[0].decision.endswith(f"job {job_id} requeued excluding {ran_on[0]}"), history[0].decision
    assert f"ExcNodeList={ran_on[0]}" in slurm_run.slurm("scontrol", "show", "job", "-o", job_id)


def test_always_failing_job_stops_after_the_maximum(slurm_run: SlurmRun) -> None:
    job_id = slurm_run.submit("--max-failures", "2", "--max-repeats", "0", behaviour=["always-fail"])
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
