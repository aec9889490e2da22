"""autoresume.sh's warning when an sbatch script runs it without ``exec``, under a real SLURM.

SLURM sends ``--signal=B:USR1@T`` and ``scancel --batch`` to the batch shell alone: a batch shell
that runs the script as a child dies of the warning, and the stop checkpoint and requeue are lost.
The script says so in one line at its start; exec'd (it *is* the batch shell) it says nothing.
Both jobs find their finished flag at once, so they stop right after the script's checks.
"""

from __future__ import annotations

import pytest

from tests.slurm.conftest import JOB_TIMEOUT_S, TERMINAL_STATES, SlurmRun
from tests.workers.autoresume_common import FT_LAUNCHER, SCRIPT, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

WARNING = "autoresume.sh: warning: this script is not the batch shell of job "


def submit_batch(run: SlurmRun, name: str, exec_it: bool) -> str:
    """An sbatch script (with the doc's ``--signal=B:USR1@120``) that calls autoresume.sh, with
    or without ``exec``; its run dir already holds the finished flag."""
    run_dir = run.tmp_path / name
    run_dir.mkdir(mode=0o700)
    (run_dir / "finished.flag").write_text("done\n")
    call = (f"bash {SCRIPT} --launcher {FT_LAUNCHER} --run-dir {run_dir} "
            f"--launcher-args '--nproc-per-node 1' -- train.py")
    batch = run.tmp_path / f"{name}.sbatch"
    batch.write_text("#!/bin/bash\n#SBATCH --requeue --signal=B:USR1@120\n"
                     f"{'exec ' if exec_it else ''}{call}\necho batch shell done: $?\n")
    return run.sbatch(str(batch))


def test_warns_when_the_batch_shell_runs_it_without_exec(slurm_run: SlurmRun) -> None:
    child = submit_batch(slurm_run, "child", exec_it=False)
    execd = submit_batch(slurm_run, "execd", exec_it=True)
    for job_id in (child, execd):
        wait_for(lambda job_id=job_id: slurm_run.job(job_id).state in TERMINAL_STATES, JOB_TIMEOUT_S,
                 f"job {job_id} to end")

    out = slurm_run.output(child, tail=None)
    warnings = [line for line in out.splitlines() if WARNING in line]
    assert len(warnings) == 1, out
    assert warnings[0].split(WARNING)[1].startswith(f"{child}: its parent (pid "), warnings[0]
    # The parent SLURM started: the spooled copy of the batch script.
    assert f"job{int(child):05d}/slurm_script) is, and SLURM sends --signal=B:" in warnings[0], warnings[0]
    assert warnings[0].endswith("exec it: exec scripts/autoresume.sh ... (or exec ft_autoresume ...)")
    assert "nothing to run" in out and "batch shell done: 0" in out, out

    out = slurm_run.output(execd, tail=None)
    assert "nothing to run" in out, out
    assert WARNING not in out and "batch shell done" not in out, out
