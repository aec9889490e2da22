"""Fixtures for tests that need a real SLURM cluster (``make test-slurm`` starts one).

Without a cluster every test here is skipped with the reason. The cluster is found through
``SLURM_CONF`` if set, else through the harness's default place
(``$PTLR_SLURM_DIR/etc/slurm.conf``, see tests/slurm/cluster/start.sh), else through SLURM's
own default configuration.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.workers.autoresume_common import (
    FT_LAUNCHER,
    SCRIPT,
    WORKER,
    AutoresumeRun,
    assert_no_leftovers,
    read_history,
    wait_for,
)

PROBE_TIMEOUT_S = 15
JOB_TIMEOUT_S = 180.0
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
LAUNCHER_ARGS = "--nproc-per-node 1 --max-restarts 0 --monitor-interval 0.1"


@cache
def _cluster() -> tuple[dict[str, str] | None, str]:
    """(environment for SLURM commands, "") when a controller answers, else (None, why not)."""
    if shutil.which("scontrol") is None or shutil.which("sbatch") is None:
        return None, "SLURM client tools are not installed (make test-slurm installs and starts a cluster)"
    env = dict(os.environ)
    if not env.get("SLURM_CONF"):
        harness_conf = Path(os.environ.get("PTLR_SLURM_DIR", "/tmp/ptlr-slurm")) / "etc" / "slurm.conf"
        if harness_conf.exists():
            env["SLURM_CONF"] = str(harness_conf)
    try:
        ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        nodes = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"SLURM did not answer within {PROBE_TIMEOUT_S} s"
    lines = (ping.stdout + ping.stderr).strip().splitlines()
    answer = lines[-1] if lines else ""
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        return None, (f"no SLURM controller is running (scontrol ping: {answer or ping.returncode}); "
                      "make test-slurm starts one")
    states = nodes.stdout.split()
    if not any(state.startswith(("idle", "mix", "alloc")) for state in states):
        return None, f"SLURM has no usable node (sinfo states: {states or nodes.stderr.strip()})"
    return env, ""


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """Environment in which sbatch/scontrol/squeue talk to the running cluster."""
    env, why = _cluster()
    if env is None:
        pytest.skip(why)
    return env


@dataclass
class Job:
    """What ``scontrol show job`` says about a job."""

    state: str
    restarts: int
    exit_code: int
    exit_signal: int


@dataclass
class SlurmRun(AutoresumeRun):
    """One test's jobs, files and environment; see the ``slurm_run`` fixture."""

    slurm_env: dict[str, str] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return self._script_env(self.slurm_env, keep=("SLURM_CONF",))

    def slurm(self, *command: str, timeout: float = 30) -> str:
        proc = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr}"
        return proc.stdout

    def sbatch(self, *args: str, nodes: int = 1, env: dict[str, str] | None = None) -> str:
        """Submit a batch job (log in tmp_path/slurm-<id>.out, 5-minute limit); return its id."""
        command = ["sbatch", "--parsable", "--job-name=autoresume-test", "--open-mode=append",
                   f"--output={self.tmp_path}/slurm-%j.out", f"--chdir={self.tmp_path}",
                   f"--nodes={nodes}", "--ntasks-per-node=1", "--time=5", *args]
        proc = subprocess.run(command, env={**self.env(), **(env or {})}, capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 0, f"sbatch failed ({proc.returncode}): {proc.stderr}"
        job_id = proc.stdout.strip().split(";")[0]
        assert job_id.isdigit(), proc.stdout
        self.jobs.append(job_id)
        return job_id

    def submit(self, *script_args: str, behaviour: list[str], sbatch_args: tuple[str, ...] = ("--requeue",),
               launcher_args: str = LAUNCHER_ARGS, nodes: int = 1, env: dict[str, str] | None = None) -> str:
        """Submit scripts/autoresume.sh itself as the batch script, running the test worker."""
        self.state_dir.mkdir(exist_ok=True)
        return self.sbatch(
            *sbatch_args, str(SCRIPT), "--launcher", str(FT_LAUNCHER), "--run-dir", str(self.run_dir),
            "--launcher-args", launcher_args, *script_args,
            "--", str(WORKER), str(self.state_dir), *behaviour, nodes=nodes, env=env)

    def job(self, job_id: str) -> Job:
        text = self.slurm("scontrol", "show", "job", "-o", job_id)

        def value(key: str) -> str:
            match = re.search(rf"(?:^|\s){key}=(\S+)", text)
            assert match, f"no {key} in: {text}"
            return match.group(1)

        code, sig = value("ExitCode").split(":")
        return Job(value("JobState"), int(value("Restarts")), int(code), int(sig))

    def wait_done(self, job_id: str) -> Job:
        """Wait until the job is over for good: in a final state and, if the script got to
        write a history, with a last decision that is not a continuation."""

        def done() -> Job | None:
            job = self.job(job_id)
            if job.state not in TERMINAL_STATES:
                return None
            history = self.run_dir / "history.tsv"
            if history.exists() and read_history(self.run_dir)[-1].decision.startswith("continue"):
                return None
            return job

        try:
            return wait_for(done, JOB_TIMEOUT_S, f"job {job_id} to end", interval=0.25)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.output(job_id)}") from None

    def output(self, job_id: str, tail: int | None = 6000) -> str:
        """The job's log (its last ``tail`` characters; all of it with ``tail=None``)."""
        path = self.tmp_path / f"slurm-{job_id}.out"
        text = path.read_text(errors="replace") if path.exists() else "<no job output>"
        return text if tail is None else text[-tail:]

    def cancel_all(self) -> None:
        for job_id in self.jobs:
            with contextlib.suppress(AssertionError, subprocess.SubprocessError):
                if self.job(job_id).state not in TERMINAL_STATES:
                    self.slurm("scancel", job_id)
                    wait_for(lambda job_id=job_id: self.job(job_id).state in TERMINAL_STATES, 60,
                             f"cancelled job {job_id} to end")


@pytest.fixture
def slurm_run(tmp_path: Path, slurm_env: dict[str, str]) -> Iterator[SlurmRun]:
    """A SlurmRun whose jobs are cancelled at the end, and which fails the test if a process it
    started is still alive then or a file is left in its private TMPDIR."""
    private_tmp = Path(tempfile.mkdtemp(prefix="ar-"))
    run = SlurmRun(tmp_path, private_tmp, slurm_env=slurm_env)
    try:
        yield run
        run.cancel_all()
        assert_no_leftovers(run.token, private_tmp)
    finally:
        run.cancel_all()
        shutil.rmtree(private_tmp, ignore_errors=True)
