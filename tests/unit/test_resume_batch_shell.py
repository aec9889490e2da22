"""launcher.resume.batch_shell: the warning for an autoresume.sh that SLURM's batch shell runs
without ``exec`` (SLURM's ``B:`` warning signals reach that shell alone, which dies of them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.resume import batch_shell
from launcher.resume.batch_shell import Proc

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "autoresume.sh"

BATCH_ENV = {"SLURM_JOB_ID": "42"}
STEPD = Proc("slurmstepd", 1, "slurmstepd: [42.batch]")
SHELL = Proc("bash", 10, "/bin/bash /var/spool/slurmd/job00042/slurm_script")
# pid -> process: 20 is the script run by the batch shell (10), 21 the script exec'd as it (its
# parent is slurmstepd itself), 30 a script under an interactive shell outside any job step.
TABLE = {
    10: STEPD,
    11: SHELL,
    20: Proc("autoresume.sh", 11, "bash scripts/autoresume.sh --run-dir r train.py"),
    21: Proc("autoresume.sh", 10, "bash scripts/autoresume.sh --run-dir r train.py"),
    30: Proc("autoresume.sh", 31, "bash scripts/autoresume.sh"),
    31: Proc("bash", 32, "-bash"),
    32: Proc("sshd", 1, "sshd: user@pts/0"),
    40: Proc("autoresume.sh", 41, "bash scripts/autoresume.sh"),  # parent gone
}

# (name, env, script pid) -> whether the warning is given
ROWS = [
    ("not exec'd in the batch step", BATCH_ENV, 20, True),
    ("SLURM_STEP_ID=batch", {**BATCH_ENV, "SLURM_STEP_ID": "batch"}, 20, True),
    ("SLURM_STEP_ID=SLURM_BATCH_SCRIPT", {**BATCH_ENV, "SLURM_STEP_ID": "4294967294"}, 20, True),
    ("exec'd: the parent is slurmstepd", BATCH_ENV, 21, False),
    ("in a job step (srun): not the batch step", {**BATCH_ENV, "SLURM_STEP_ID": "0"}, 20, False),
    ("outside SLURM", {}, 20, False),
    ("a shell that slurmstepd did not start", BATCH_ENV, 30, False),
    ("parent unreadable: no guess", BATCH_ENV, 40, False),
    ("script itself unreadable: no guess", BATCH_ENV, 99, False),
]


@pytest.mark.parametrize(("env", "pid", "warned"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_not_exec_warning(env: dict[str, str], pid: int, warned: bool) -> None:
    text = batch_shell.not_exec_warning(env, pid, TABLE.get)
    assert bool(text) == warned, text
    if warned:
        assert "\n" not in text
        assert text.startswith("warning: this script is not the batch shell of job 42: its parent "
                               "(pid 11: /bin/bash /var/spool/slurmd/job00042/slurm_script) is")
        assert text.endswith("exec it: exec scripts/autoresume.sh ... (or exec ft_autoresume ...)")


@pytest.mark.parametrize(("value", "pid"), [("123", 123), ("", None), ("0", None), ("x1", None), ("-5", None)])
def test_script_pid(value: str, pid: int | None) -> None:
    assert batch_shell.script_pid({"AUTORESUME_SCRIPT_PID": value}) == pid


def test_read_proc_reads_a_real_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        # Under load /proc may show the new program's name before its command line (seen in CI:
        # cmdline ''): poll with a deadline for what a settled process shows.
        expected = Proc("sleep", os.getpid(), "sleep 30")
        deadline = time.monotonic() + 10
        while (seen := batch_shell.read_proc(child.pid)) != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == expected
    finally:
        child.kill()
        child.wait(timeout=10)
    assert batch_shell.read_proc(child.pid) is None


def run_batch(tmp_path: Path, exec_it: bool) -> subprocess.CompletedProcess[str]:
    """A batch script started the way slurmstepd starts one (its parent is a process named
    ``slurmstepd``: a bash run through a link of that name), running the real autoresume.sh in local mode
    with a finished flag, so that it stops right after its checks."""
    stepd = tmp_path / "slurmstepd"
    stepd.symlink_to("/bin/bash")
    flag = tmp_path / "finished.flag"
    flag.write_text("done\n")
    call = f"bash {SCRIPT} --mode local --launcher /bin/true --run-dir {tmp_path / 'run'} --flag-file {flag} -- x.py"
    batch = tmp_path / "slurm_script"
    # Something after the call, so that bash cannot run the last command in its own process.
    batch.write_text(f"#!/bin/bash\n{'exec ' if exec_it else ''}{call}\necho batch shell done: $?\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_JOB_ID="42", AUTORESUME_PYTHON=sys.executable)
    # The fake slurmstepd (a bash) starts the batch shell as its child, as the real one does.
    return subprocess.run([str(stepd), "-c", f"/bin/bash {batch}; echo stepd done"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)


def test_script_warns_when_the_batch_shell_runs_it_without_exec(tmp_path: Path) -> None:
    proc = run_batch(tmp_path, exec_it=False)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "not the batch shell" in line]
    assert len(warnings) == 1, proc.stderr
    assert "autoresume.sh: warning: this script is not the batch shell of job 42: its parent (pid " in warnings[0]
    assert f"/bin/bash {tmp_path / 'slurm_script'}) is" in warnings[0], warnings[0]
    assert "exec it: exec scripts/autoresume.sh ..." in warnings[0]
    assert "nothing to run" in proc.stderr and "batch shell done: 0" in proc.stdout


def test_script_is_quiet_when_exec_d(tmp_path: Path) -> None:
    proc = run_batch(tmp_path, exec_it=True)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to run" in proc.stderr
    assert "not the batch shell" not in proc.stderr and "warning" not in proc.stderr, proc.stderr
