"""scripts/autoresume.sh in local mode, with the real ft_launcher and tiny stdlib workers.

Each test runs the script as a subprocess in its own session, with a private short TMPDIR and
a token in the environment; afterwards no process carrying the token may be alive and the
TMPDIR must be empty. The worker (tests/workers/autoresume_worker.py) counts its own runs, so
the attempt counts below do not just trust the script's bookkeeping.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher import exit_codes
from launcher.resume import own_files
from tests.lock_holder import LockHolder
from tests.workers.autoresume_common import (
    FT_LAUNCHER,
    SCRIPT,
    WORKER,
    AutoresumeRun,
    assert_no_leftovers,
    processes_with_token,
    read_history,
    wait_for,
    worker_runs,
)

RUN_TIMEOUT_S = 90.0
LAUNCHER_ARGS = "--standalone --nproc-per-node 1 --max-restarts 0 --monitor-interval 0.1"


@dataclass
class LocalRun(AutoresumeRun):
    """Where one test's script keeps things, and how to start it."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.tmp_path / "autoresume.log"

    def env(self) -> dict[str, str]:
        return {**self._script_env(dict(os.environ)), **self.extra_env}

    def start(self, *script_args: str, behaviour: list[str] | None = None,
              launcher_args: str = LAUNCHER_ARGS) -> subprocess.Popen:
        """Start the script; ``behaviour`` (worker arguments) makes it run our worker."""
        self.state_dir.mkdir(exist_ok=True)
        command = ["bash", str(SCRIPT), "--launcher", str(FT_LAUNCHER), "--run-dir", str(self.run_dir),
                   "--launcher-args", launcher_args, *script_args]
        if behaviour is not None:
            command += ["--", str(WORKER), str(self.state_dir), *behaviour]
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(command, env=self.env(), cwd=self.tmp_path, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"autoresume.sh still running after {timeout} s:\n{self.output()}") from None

    def run(self, *script_args: str, behaviour: list[str] | None = None, **kwargs) -> int:
        return self.wait(self.start(*script_args, behaviour=behaviour, **kwargs))

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else "<no output>"


@contextlib.contextmanager
def _local_run_in(base: Path) -> Iterator[LocalRun]:
    """A run under ``base``; afterwards nothing of it may be left, and what is, is killed."""
    private_tmp = Path(tempfile.mkdtemp(prefix="ar-"))   # short path: sockets live here
    run = LocalRun(base, private_tmp)
    try:
        yield run
        assert_no_leftovers(run.token, private_tmp)
    finally:
        for proc in run.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        shutil.rmtree(private_tmp, ignore_errors=True)


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[LocalRun]:
    with _local_run_in(tmp_path) as run:
        yield run


def decisions(run: LocalRun) -> list[str]:
    return [row.decision.split(":")[0] for row in read_history(run.run_dir)]


def test_fails_twice_then_finishes(local_run: LocalRun) -> None:
    # The worker fails the same way twice: --max-repeats 3, or the second would stop the loop.
    rc = local_run.run("--max-failures", "3", "--max-repeats", "3", behaviour=["fail-first", "2"])

    assert rc == 0, local_run.output()
    history = read_history(local_run.run_dir)
    assert [row.attempt for row in history] == [1, 2, 3]
    assert [row.exit_code for row in history] == ["1", "1", "0"]
    assert [row.failures for row in history] == [1, 2, 0]
    assert decisions(local_run) == ["continue", "continue", "finished"]
    assert [row.flag for row in history] == ["no", "no", "yes"]
    assert {row.job_id for row in history} == {"local"}
    assert all(row.start <= row.end for row in history)
    assert local_run.flag.exists()
    assert worker_runs(local_run.state_dir) == 3


def test_always_failing_job_stops_as_a_repeating_failure(local_run: LocalRun) -> None:
    # The real launcher names the failure's fingerprint in its result file: the same crash ending
    # two attempts (--max-repeats 2, the default) is a bug, so the loop stops with exit 66 before
    # --max-failures 3 would (before, it ran a third attempt and stopped with exit 1).
    rc = local_run.run("--max-failures", "3", behaviour=["always-fail"])

    assert rc == exit_codes.EXIT_REPEATED_FAILURE, local_run.output()
    history = read_history(local_run.run_dir)
    assert [row.failures for row in history] == [1, 2]
    assert decisions(local_run) == ["continue", "stop"]
    assert re.fullmatch(r"stop: a repeating failure, a bug and not a node: fingerprint [0-9a-f]{12} \(crash: exit "
                        r"code 1\) ended attempts 1,2 \(root nodes \S+\); not requeued \(ft_launcher exit 1\)",
                        history[-1].decision), history[-1].decision
    assert not local_run.flag.exists()
    assert worker_runs(local_run.state_dir) == 2
    events = [line.split("\t") for line in (local_run.run_dir / "node_history.tsv").read_text().splitlines()]
    assert [row[:3] for row in events if row[1] == "-"] == [["1", "-", "failed"], ["2", "-", "failed"],
                                                              ["2", "-", "stop"]]
    assert [row[0] for row in events if row[2] == "root"] == ["1", "2"]


def test_no_progress_stops_with_its_own_exit_code(local_run: LocalRun) -> None:
    checkpoints = local_run.tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "step_10.pt").write_text("old")
    rc = local_run.run("--max-failures", "10", "--progress-path", str(checkpoints), "--max-stalled", "2",
                       "--max-repeats", "0", behaviour=["always-fail"])

    assert rc == 3, local_run.output()
    history = read_history(local_run.run_dir)
    assert decisions(local_run) == ["continue", "stop"]
    assert "no progress, 2 consecutive failed attempts without a newer file" in history[-1].decision
    assert worker_runs(local_run.state_dir) == 2


def test_warning_signal_continues_and_is_not_a_failure(local_run: LocalRun) -> None:
    # --max-failures 1: had the warning ending counted as a failure, the loop would stop there.
    proc = local_run.start("--max-failures", "1", behaviour=["until-usr1"],
                           launcher_args=LAUNCHER_ARGS.replace("--nproc-per-node 1", "--nproc-per-node 2"))
    ready = [local_run.state_dir / f"ready-{rank}-1" for rank in (0, 1)]
    wait_for(lambda: all(path.exists() for path in ready) or proc.poll() is not None, 60,
             "both ranks waiting for SIGUSR1")
    assert proc.poll() is None, local_run.output()
    proc.send_signal(signal.SIGUSR1)
    rc = local_run.wait(proc)

    assert rc == 0, local_run.output()
    history = read_history(local_run.run_dir)
    assert decisions(local_run) == ["continue", "finished"]
    assert "warning signal SIGUSR1" in history[0].decision
    assert history[0].exit_code == "0" and history[0].flag == "no"
    assert [row.failures for row in history] == [0, 0]
    assert worker_runs(local_run.state_dir, 0) == worker_runs(local_run.state_dir, 1) == 2


def test_shutdown_workload_request_stops_without_continuing(local_run: LocalRun) -> None:
    rc = local_run.run(behaviour=["shutdown"])

    assert rc == 64, local_run.output()
    history = read_history(local_run.run_dir)
    assert len(history) == 1
    assert history[0].exit_code == "64"
    assert history[0].decision.startswith("stop: a rank requested ShutdownWorkload")
    assert not local_run.flag.exists()
    assert worker_runs(local_run.state_dir) == 1


def test_launcher_usage_error_stops(local_run: LocalRun) -> None:
    rc = local_run.run(behaviour=["finish"], launcher_args="--standalone --nproc-per-node two")

    assert rc == 2, local_run.output()
    history = read_history(local_run.run_dir)
    assert len(history) == 1 and history[0].exit_code == "2"
    assert history[0].decision.startswith("stop: ft_launcher usage error")
    assert worker_runs(local_run.state_dir) == 0


def sigterm_once_the_worker_runs(local_run: LocalRun, behaviour: str) -> int:
    """Start the loop, SIGTERM the script once the first worker is up; its exit code."""
    proc = local_run.start(behaviour=[behaviour])
    wait_for(lambda: (local_run.state_dir / "ready-0-1").exists() or proc.poll() is not None, 60,
             "the worker to start")
    assert proc.poll() is None, local_run.output()
    proc.send_signal(signal.SIGTERM)
    return local_run.wait(proc)


def test_sigterm_stops_the_loop(local_run: LocalRun) -> None:
    rc = sigterm_once_the_worker_runs(local_run, "until-usr1")

    assert rc == 128 + signal.SIGTERM, local_run.output()
    history = read_history(local_run.run_dir)
    assert len(history) == 1
    assert history[0].decision.startswith("stop: terminated by SIGTERM")
    assert worker_runs(local_run.state_dir) == 1


def test_sigterm_stops_the_loop_even_when_the_launcher_exits_0(local_run: LocalRun) -> None:
    # A preemption the ranks honour: they checkpoint (3 s) and exit 0 within --term-timeout, so
    # ft_launcher exits 0. The script saw the signal itself: it stops, it does not "continue
    # after a clean exit without the flag".
    rc = sigterm_once_the_worker_runs(local_run, "slow-stop")

    assert rc == 128 + signal.SIGTERM, local_run.output()
    history = read_history(local_run.run_dir)
    assert [(row.exit_code, row.decision) for row in history] == [
        ("0", "stop: terminated by SIGTERM (ft_launcher exit 0: the ranks stopped in time)")]
    assert (local_run.state_dir / "stopped-0-1").exists()
    assert worker_runs(local_run.state_dir) == 1


def test_attempt_of_a_killed_script_is_recorded_and_counted(local_run: LocalRun) -> None:
    # The first script dies with SIGKILL mid-attempt (as on a lost node): it cannot record
    # anything, so the next run must, counting it as a failure.
    proc = local_run.start(behaviour=["until-usr1"])
    wait_for(lambda: (local_run.state_dir / "ready-0-1").exists() or proc.poll() is not None, 60,
             "the worker to start")
    assert proc.poll() is None, local_run.output()
    os.killpg(proc.pid, signal.SIGKILL)   # the script; its launcher (own session) stops on its own
    proc.wait(timeout=10)
    wait_for(lambda: lock_is_free(local_run), 30, "the first attempt to end and free the run dir")

    rc = local_run.run(behaviour=["until-usr1"])   # run 2 of the worker finishes

    assert rc == 0, local_run.output()
    history = read_history(local_run.run_dir)
    assert [row.attempt for row in history] == [1, 2]
    assert history[0].decision.startswith("continue: no record of how it ended")
    assert (history[0].end, history[0].exit_code, history[0].failures) == ("-", "-", 1)
    assert history[1].decision.startswith("finished")
    assert worker_runs(local_run.state_dir) == 2


def lock_is_free(run: LocalRun) -> bool:
    with open(run.run_dir / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(lock, fcntl.LOCK_UN)
        return True


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def test_a_killed_script_stops_its_launcher_and_holds_the_run_dir_until_all_is_gone(local_run: LocalRun) -> None:
    # SIGKILL to the script alone (as an OOM killer or a lost terminal would): its launcher must
    # stop within seconds (its workers get SIGTERM; this one takes 3 s to checkpoint), and a
    # second loop on the same run dir must be refused while anything of the first one lives.
    proc = local_run.start(behaviour=["slow-stop"])
    ready = local_run.state_dir / "ready-0-1"
    wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "the worker to start")
    assert proc.poll() is None, local_run.output()
    worker = int(ready.read_text())
    proc.kill()
    proc.wait(timeout=10)
    killed = time.monotonic()

    second = local_run.run(behaviour=["finish"])
    still_alive = alive(worker)
    assert second == 1 and "in use by another autoresume.sh" in local_run.output(), local_run.output()
    assert still_alive, "the first attempt's worker was gone before the second loop tried"
    wait_for(lambda: not processes_with_token(local_run.token), 30, "every process of the first loop to exit")
    gone_s = time.monotonic() - killed
    assert (local_run.state_dir / "stopped-0-1").exists(), "the worker's SIGTERM handler was cut short"
    assert gone_s < 15, gone_s
    assert lock_is_free(local_run)

    third = local_run.run(behaviour=["slow-stop"])  # run 2 of the worker finishes
    assert third == 0, local_run.output()
    assert [row.decision.split(":")[0] for row in read_history(local_run.run_dir)] == ["continue", "finished"]


def test_max_attempts_bounds_clean_endings_without_the_flag(local_run: LocalRun) -> None:
    rc = local_run.run("--max-attempts", "2", "--max-failures", "1", behaviour=["clean-exit"])

    assert rc == 1, local_run.output()
    history = read_history(local_run.run_dir)
    assert decisions(local_run) == ["continue", "stop"]
    assert "exited 0 without the flag" in history[0].decision
    assert history[1].decision.startswith("stop: --max-attempts 2 reached")
    assert [row.failures for row in history] == [0, 0]
    assert worker_runs(local_run.state_dir) == 2


def test_finished_flag_before_start_runs_nothing(local_run: LocalRun) -> None:
    local_run.run_dir.mkdir()
    local_run.flag.write_text("done\n")

    rc = local_run.run(behaviour=["always-fail"])

    assert rc == 0, local_run.output()
    assert worker_runs(local_run.state_dir) == 0
    assert not (local_run.run_dir / "history.tsv").exists()
    assert "nothing to run" in local_run.output()


def test_run_dir_in_use_is_refused(local_run: LocalRun) -> None:
    local_run.run_dir.mkdir()
    with open(local_run.run_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc = local_run.run(behaviour=["finish"])

    assert rc == 1, local_run.output()
    assert "in use by another autoresume.sh" in local_run.output()
    assert worker_runs(local_run.state_dir) == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--max-failures", "zero", "train.py"],
     "--max-failures (AUTORESUME_MAX_FAILURES) must be a whole number >= 1 and <= 1000000, got 'zero'"),
    (["--max-attempts", "-1", "train.py"],
     "--max-attempts (AUTORESUME_MAX_ATTEMPTS) must be a whole number <= 1000000 (0 = no limit), got '-1'"),
    # bash arithmetic wraps past 2^63: such a value used to be taken (and silently become negative)
    (["--max-attempts", "99999999999999999999", "train.py"],
     "--max-attempts (AUTORESUME_MAX_ATTEMPTS) must be a whole number <= 1000000 (0 = no limit), "
     "got '99999999999999999999'"),
    (["--max-failures", "1000001", "train.py"],
     "--max-failures (AUTORESUME_MAX_FAILURES) must be a whole number >= 1 and <= 1000000, got '1000001'"),
    (["--mode", "cloud", "train.py"], "--mode (AUTORESUME_MODE) must be auto, slurm or local, got 'cloud'"),
    (["--mode", "slurm", "train.py"], "--mode slurm needs to run inside an sbatch job"),
    (["--launcher", "/nonexistent/ft_launcher", "train.py"],
     "ft_launcher not found: --launcher (FT_LAUNCHER) is '/nonexistent/ft_launcher'"),
    (["--frobnicate", "train.py"], "unknown option '--frobnicate'"),
    (["--run-dir"], "option --run-dir needs a value"),
    ([], "no training command given"),
])
def test_bad_input_is_a_usage_error(local_run: LocalRun, args: list[str], message: str) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--launcher", str(FT_LAUNCHER), *args],
                          env=local_run.env(), cwd=local_run.tmp_path, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not (local_run.tmp_path / "autoresume").exists()


def test_help_documents_the_exit_code_mapping() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    text = proc.stdout
    for needle in ("launcher exit 64", "launcher exit 2", "launcher exit 1", "launcher exit 128+N",
                   "SIGUSR1", "--max-failures", "--run-dir", "--flag-file", "--launcher-args",
                   "history.tsv", "scontrol requeue", "--open-mode=append", "launcher exit 66",
                   "--max-repeats N", "--node-failures-to-exclude K", "--node-exclusion-expiry N",
                   "AUTORESUME_MAX_REPEATS", "node_history.tsv"):
        assert needle in text, needle


# ---------------------------------------------------------------------- other users (issue 21 items 7 and 8)

NOBODY = 65534


@pytest.fixture
def open_run() -> Iterator[LocalRun]:
    """A run whose files other users may reach (pytest's tmp_path is 0700): base dir 0755 in /tmp."""
    base = Path(tempfile.mkdtemp(prefix="aro-", dir="/tmp"))
    base.chmod(0o755)
    try:
        with _local_run_in(base) as run:
            yield run
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_another_user_cannot_lock_the_run_dir(open_run: LocalRun) -> None:
    # A first loop finds the flag and runs nothing, but it has made the run dir's lock file.
    open_run.run_dir.mkdir()
    open_run.flag.write_text("done\n")
    assert open_run.run(behaviour=["always-fail"]) == 0, open_run.output()
    open_run.flag.unlink()
    with LockHolder(str(open_run.run_dir / ".lock"), "flock") as nobody:
        rc = open_run.run(behaviour=["finish"])
    assert rc == 0, open_run.output()
    assert "in use by another autoresume.sh" not in open_run.output()
    assert nobody.result == {"error": "Permission denied"}, nobody.result
    assert worker_runs(open_run.state_dir) == 1
    lock = (open_run.run_dir / ".lock").stat()
    assert (lock.st_uid, lock.st_mode & 0o777) == (os.getuid(), 0o600)


def plant(run: LocalRun, case: str) -> tuple[list[str], str]:
    """Set up ``case``; the script arguments it needs and what the refusal must say."""
    secret = run.tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    if case in ("foreign-dir-with-flag", "foreign-dir-with-history-link"):
        # another user made the run dir before us, open to all, and planted a file in it
        run.run_dir.mkdir(mode=0o777)
        run.run_dir.chmod(0o777)
        os.chown(run.run_dir, NOBODY, NOBODY)
        if case == "foreign-dir-with-flag":
            run.flag.write_text("done\n")
            os.chown(run.flag, NOBODY, NOBODY)
        else:
            (run.run_dir / "history.tsv").symlink_to(secret)
            os.lchown(run.run_dir / "history.tsv", NOBODY, NOBODY)
        return [], f"belongs to uid {NOBODY}"
    run.run_dir.mkdir()
    if case == "own-dir-with-foreign-state":
        (run.run_dir / "state").write_text("attempt=999\nfailures=0\nrunning=0\n")
        os.chown(run.run_dir / "state", NOBODY, NOBODY)
        return [], f"{run.run_dir / 'state'} belongs to uid {NOBODY}"
    if case == "own-dir-with-history-link":
        (run.run_dir / "history.tsv").symlink_to(secret)
        return [], f"{run.run_dir / 'history.tsv'} is a symbolic link"
    if case == "group-writable-dir":
        run.run_dir.chmod(0o775)
        return [], "writable by its group"
    assert case == "foreign-flag-elsewhere"
    shared = run.tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "done.flag").write_text("done\n")
    os.chown(shared / "done.flag", NOBODY, NOBODY)
    return ["--flag-file", str(shared / "done.flag")], f"{shared / 'done.flag'} belongs to uid {NOBODY}"


@pytest.mark.parametrize("case", ["foreign-dir-with-flag", "foreign-dir-with-history-link",
                                  "own-dir-with-foreign-state", "own-dir-with-history-link", "group-writable-dir",
                                  "foreign-flag-elsewhere"])
def test_a_run_dir_or_file_another_user_could_have_planted_is_refused(open_run: LocalRun, case: str) -> None:
    args, message = plant(open_run, case)
    rc = open_run.run(*args, behaviour=["finish"])

    assert rc == 2, open_run.output()
    assert message in open_run.output(), open_run.output()
    assert worker_runs(open_run.state_dir) == 0
    assert (open_run.tmp_path / "secret").read_text() == "root only\n"
    assert not (open_run.run_dir / ".lock").exists()


# What a colleague in the run dir's group (nobody, gid 65534) does in it: move our history away, and
# add a file under one of the loop's names. Prints what each step did.
AS_COLLEAGUE = """
import json, os, sys
os.setgid(65534); os.setgroups([]); os.setuid(65534)
run_dir, name = sys.argv[1], sys.argv[2]
done = {}
try:
    os.rename(os.path.join(run_dir, "history.tsv"), os.path.join(run_dir, "history.old"))
    done["rename"] = "ok"
except OSError as err:
    done["rename"] = err.strerror
with open(os.path.join(run_dir, name), "w") as planted:
    planted.write("attempt=999\\n")
done["planted"] = name
print(json.dumps(done))
"""


def test_a_sticky_group_run_dir_is_used_and_a_colleague_can_neither_move_nor_plant_what_counts(
        open_run: LocalRun) -> None:
    # issue 31 item 12: a 3770 project dir was refused as "writable by its group"
    open_run.run_dir.mkdir()
    os.chown(open_run.run_dir, os.getuid(), NOBODY)
    open_run.run_dir.chmod(0o3770)
    assert open_run.run(behaviour=["finish"]) == 0, open_run.output()
    assert worker_runs(open_run.state_dir) == 1
    name = next(n for n in own_files.RUN_DIR_FILES if not (open_run.run_dir / n).exists())
    done = subprocess.run([sys.executable, "-c", AS_COLLEAGUE, str(open_run.run_dir), name],
                          capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(done.stdout) == {"rename": "Operation not permitted", "planted": name}, done.stderr
    assert (open_run.run_dir / "history.tsv").exists()
    # the colleague's file under a loop's name is refused, not trusted
    open_run.flag.unlink()
    assert open_run.run(behaviour=["finish"]) == 2, open_run.output()
    assert f"{open_run.run_dir / name} belongs to uid {NOBODY}" in open_run.output()
    assert worker_runs(open_run.state_dir) == 1


# ---------------------------------------------------------------------------- a scripted launcher
# For the decisions across attempts: a stand-in for ft_launcher that writes the result file
# (FT_LAUNCHER_RESULT_FILE) and exits as its plan says, one line per call: "<exit code>
# <fingerprint or -> [root node]". No torch, no ranks: a few tenths of a second per attempt.
FAKE_LAUNCHER = """#!/bin/bash
echo "$AUTORESUME_ATTEMPT ${SLURMD_NODENAME:-local}" >> "$FAKE_DIR/calls"
read -r rc fingerprint root < <(sed -n "${AUTORESUME_ATTEMPT}p" "$FAKE_DIR/plan")
if [ -n "${FT_LAUNCHER_RESULT_FILE:-}" ]; then
  { echo "exit_code=$rc"; echo "outcome=scripted"; echo "root_nodes=${root:-}"
    if [ "$fingerprint" != - ]; then
      echo "fingerprint=$fingerprint"; echo "fingerprint_text=crash: ValueError: bad batch"
    fi
  } > "$FT_LAUNCHER_RESULT_FILE"
fi
exit "${rc:-3}"
"""
FP_A, FP_B = "aaaaaaaaaaaa", "0123456789ab"


def scripted(local_run: LocalRun, *plan: str) -> str:
    """A scripted launcher with ``plan`` (line N: attempt N); its path."""
    fake_dir = local_run.tmp_path / "fake"
    fake_dir.mkdir()
    (fake_dir / "plan").write_text("".join(f"{line}\n" for line in plan))
    launcher = fake_dir / "ft_launcher"
    launcher.write_text(FAKE_LAUNCHER)
    launcher.chmod(0o755)
    local_run.extra_env["FAKE_DIR"] = str(fake_dir)
    return str(launcher)


def launcher_calls(local_run: LocalRun) -> int:
    return len((local_run.tmp_path / "fake" / "calls").read_text().splitlines())


def test_a_fingerprint_that_repeats_across_attempts_stops_with_66(local_run: LocalRun) -> None:
    # A clean attempt starts the count afresh (before, the loop went on to --max-attempts).
    launcher = scripted(local_run, f"1 {FP_A} h1", "0 -", f"1 {FP_A} h1", f"1 {FP_A} h1", "0 -")
    rc = local_run.run("--launcher", launcher, "--max-failures", "10", "--max-attempts", "5", behaviour=["finish"])

    assert rc == exit_codes.EXIT_REPEATED_FAILURE, local_run.output()
    assert launcher_calls(local_run) == 4
    assert decisions(local_run) == ["continue"] * 3 + ["stop"]
    assert read_history(local_run.run_dir)[-1].decision == (
        f"stop: a repeating failure, a bug and not a node: fingerprint {FP_A} (crash: ValueError: bad batch) "
        "ended attempts 3,4 (root nodes h1); not requeued (ft_launcher exit 1)")


def test_launcher_exit_66_stops_without_another_attempt(local_run: LocalRun) -> None:
    launcher = scripted(local_run, f"66 {FP_A} h1", "0 -")
    rc = local_run.run("--launcher", launcher, "--max-attempts", "2", behaviour=["finish"])

    assert rc == exit_codes.EXIT_REPEATED_FAILURE, local_run.output()
    assert launcher_calls(local_run) == 1
    assert read_history(local_run.run_dir)[-1].decision.startswith(
        "stop: ft_launcher stopped a repeating failure (exit 66)")


def test_an_older_launcher_without_fingerprints_stops_at_max_failures(local_run: LocalRun) -> None:
    launcher = scripted(local_run, "1 - h1", "1 - h1", "0 -")
    rc = local_run.run("--launcher", launcher, "--max-failures", "2", behaviour=["finish"])

    assert rc == exit_codes.EXIT_FAILURE, local_run.output()
    assert launcher_calls(local_run) == 2
    assert read_history(local_run.run_dir)[-1].decision == \
        "stop: 2 consecutive failures, the maximum (ft_launcher exit 1)"


# In slurm mode, without SLURM: srun starts the node task once per node of the allocation the
# test chose (from the loop's exclusion list), scontrol answers what the loop asks, and each run
# of the script is one run of the requeued job.
FAKE_SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
index=0; pids=()
for node in $(cat "$FAKE_DIR/allocation"); do
  SLURM_NODEID=$index SLURMD_NODENAME=$node "$@" & pids+=($!); index=$((index + 1))
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || { code=$?; [ "$code" -le "$rc" ] || rc=$code; }; done
exit "$rc"
"""
FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show job") echo "JobId=$3 BatchFlag=1 Requeue=1" ;;
  "show hostnames") tr ' ' '\\n' < "$FAKE_DIR/allocation" ;;
  "show node") echo "NodeName=$4 NodeAddr=127.0.0.1" ;;
esac
"""
PARTITION = ["n1", "n2", "n3", "n4", "n5"]


def test_slurm_mode_excludes_a_repeating_root_lets_it_back_and_stops_a_repeating_bug(local_run: LocalRun) -> None:
    plan = [f"1 {FP_A} n1", f"1 {FP_B} n1", "0 -", f"1 {FP_A} n2", f"1 {FP_A} n1"]
    launcher = scripted(local_run, *plan)
    fake_dir = local_run.tmp_path / "fake"
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("sinfo", "#!/bin/sh\nprintf '%s\\n' " + " ".join(PARTITION) + "\n")):
        (fake_dir / name).write_text(text)
        (fake_dir / name).chmod(0o755)
    local_run.extra_env.update({"PATH": f"{fake_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "17",
                                "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
                                "AUTORESUME_PYTHON": sys.executable})
    codes, allocations = [], []
    for _ in plan:   # each run: the requeued job, on the nodes the exclusion list leaves
        excluded_file = local_run.run_dir / "excluded_nodes"
        excluded = excluded_file.read_text().split() if excluded_file.exists() else []
        allocations.append([node for node in PARTITION if node not in excluded][:2])
        (fake_dir / "allocation").write_text(" ".join(allocations[-1]))
        codes.append(local_run.run("--mode", "slurm", "--launcher", launcher, "--max-failures", "10",
                                   "--node-exclusion-expiry", "1", behaviour=["finish"]))

    assert codes == [0, 0, 0, 0, exit_codes.EXIT_REPEATED_FAILURE], local_run.output()
    history = read_history(local_run.run_dir)
    assert [row.decision.split("; ", 1)[-1] for row in history[:4]] == [
        "job 17 requeued",                       # n1 the root once: not yet
        "job 17 requeued excluding n1",          # n1 the root of two failures
        "job 17 requeued excluding no node",     # one clean attempt later n1 may come back
        "job 17 requeued"]
    assert allocations == [["n1", "n2"], ["n1", "n2"], ["n2", "n3"], ["n1", "n2"], ["n1", "n2"]]
    # Fingerprint A on n1 (attempt 1), then on n2 and n1 after the clean attempt 3: a bug.
    assert history[4].decision == (
        f"stop: a repeating failure, a bug and not a node: fingerprint {FP_A} (crash: ValueError: bad batch) "
        "ended attempts 4,5 (root nodes n2,n1); not requeued (ft_launcher exit 1)")
    events = [line.split("\t")[:3] for line in (local_run.run_dir / "node_history.tsv").read_text().splitlines()[1:]]
    assert [row for row in events if row[1] != "-"] == [
        ["1", "n1", "root"], ["2", "n1", "root"], ["2", "n1", "excluded"], ["3", "n1", "expired"],
        ["4", "n2", "root"], ["5", "n1", "root"]]
