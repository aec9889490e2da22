"""examples/slurm/lightning_autoresume.sbatch as written, on two (virtual) SLURM nodes.

Lightning DDP (gloo on CPU), one rank per node, the real FaultToleranceCallback. The warning
signal stops the first attempt after a checkpoint; the requeued job resumes from it and
finishes, and the callback's finished flag ends the loop. Only sizes are overridden (sbatch's
command line beats the file's #SBATCH lines), and --signal so that SLURM's own warning cannot
arrive during the test.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.slurm.conftest import JOB_TIMEOUT_S, TERMINAL_STATES, SlurmRun
from tests.workers.autoresume_common import FT_LAUNCHER, REPO_ROOT, read_history, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = REPO_ROOT / "examples" / "slurm" / "lightning_autoresume.sbatch"
MAX_STEPS = 60


def test_lightning_example_stops_on_the_warning_and_resumes_to_the_end(slurm_run: SlurmRun) -> None:
    run_dir = slurm_run.run_dir
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    job_id = slurm_run.sbatch(
        "--cpus-per-task=1", "--signal=B:USR1@10", str(EXAMPLE), nodes=2,
        env={"PTLR_REPO": str(REPO_ROOT), "RUN_DIR": str(run_dir), "NPROC_PER_NODE": "1",
             "MAX_STEPS": str(MAX_STEPS), "CHECKPOINT_EVERY": "5", "STEP_DELAY": "0.1",
             "FT_LAUNCHER": str(FT_LAUNCHER),
             # torch keeps a compile cache in $TMPDIR/torchinductor_$USER: a cache, not a leak.
             "TORCHINDUCTOR_CACHE_DIR": str(slurm_run.tmp_path / "torchinductor-cache")})
    # A checkpoint means both ranks are training; at 0.1 s a step, 55 steps remain to signal.
    wait_for(lambda: checkpoint.exists() or slurm_run.job(job_id).state in TERMINAL_STATES,
             JOB_TIMEOUT_S, "the first checkpoint")
    assert checkpoint.exists(), slurm_run.output(job_id)
    slurm_run.slurm("scancel", "--batch", "--signal=USR1", job_id)
    job = slurm_run.wait_done(job_id)
    out = slurm_run.output(job_id, tail=None)

    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), out[-8000:]
    history = read_history(run_dir)
    assert [row.decision.split(":")[0] for row in history] == ["continue", "finished"], out[-8000:]
    assert "warning signal SIGUSR1, not a failure" in history[0].decision
    stopped = re.search(r"\[rank 0\] graceful stop: saved \S+ at global step (\d+)", out)
    assert stopped and 0 < int(stopped.group(1)) < MAX_STEPS, out[-8000:]
    assert f"rank 0, attempt 2: resuming from {checkpoint}" in out
    assert "rank 0, attempt 2: resuming from" in out and "rank 1, attempt 2: resuming from" in out
    flag = json.loads((run_dir / "finished.flag").read_text())
    assert flag["global_step"] == MAX_STEPS and flag["reason"] == f"max_steps={MAX_STEPS} reached"
