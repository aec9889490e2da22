"""Shared fixtures: private run directories, real monitors, scripted rank processes."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ft_core import FaultToleranceConfig, RankMonitorServer
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from tests.launcher_util import live_descendants

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"
_PR_SET_CHILD_SUBREAPER = 36


# Tests .ci/run leaves out (marker ``extended``; .ci/run runs ``make test`` with -m "not extended")
# to stay within its 30-minute budget on 2 cores; ``make test`` runs them all. Each is a variant
# of a test CI does run, through the same code; the reason names that test.
CI_LEAVES_OUT: dict[str, str] = {
    "tests/integration/test_blame_ddp_backward.py::test_plain_ddp_loop_blames_the_rank_sleeping_in_its_step_not_the_one"
    "_in_backward[sections-together]":
        "[sections-root-progressed-later]: the same hang, where the clocks alone would also point at the wrong rank",
    "tests/integration/test_blame_ddp_backward.py::test_plain_ddp_loop_blames_the_rank_sleeping_in_its_step_not_the_one"
    "_in_backward[heartbeat-together]":
        "[heartbeat-root-progressed-later], as above",
    "tests/integration/test_graceful_stop.py::test_sigusr1_stops_every_rank_after_the_same_step_with_a_checkpoint"
    "_and_the_next_run_resumes_there[heartbeats]":
        "[sections] makes the same stop and resume; both callbacks share the graceful stop",
    "tests/integration/test_lightning_callbacks.py::test_too_little_data_skips_the_update_with_a_log_line[heartbeats]":
        "[sections]; both callbacks share the update rule",
    "tests/integration/test_graceful_stop_children.py::test_a_graceful_stop_survives_dataloader_workers"
    "[lightning-launcher]":
        "[lightning-job-wide]: the launcher's relay reaches the same process group; relaying is tested "
        "in test_signal_order and test_launcher",
    "tests/integration/test_graceful_stop_children.py::test_a_graceful_stop_survives_dataloader_workers"
    "[integration-launcher]":
        "[integration-job-wide], as above",
    "tests/integration/test_signals_after_finish.py::test_a_stop_signal_after_the_training_ended_does_not_fail_the_ranks"
    "[lightning-launcher]":
        "[lightning-job-wide]: the rank sees the same signal after fit returned",
    "tests/integration/test_signals_after_finish.py::test_a_stop_signal_after_the_training_ended_does_not_fail_the_ranks"
    "[integration-launcher]":
        "[integration-job-wide], as above",
    "tests/integration/test_examples.py::test_example_runs_as_documented[lightning_sections.py]":
        "[lightning_heartbeats.py] runs the same documented command; the sections callback has its own tests",
    "tests/integration/test_examples.py::test_example_runs_as_documented[train_ddp_sections.py]":
        "[train_ddp_heartbeats.py], as above",
    "tests/integration/test_examples.py::test_example_runs_as_documented[train_loop_integration.py]":
        "test_docs.py::test_the_readme_example_runs_as_written runs the same command (it checks they are the same), "
        "as README writes it",
    "tests/integration/test_launcher_multinode.py::test_more_waiting_nodes_than_free_slots_do_not_restart_the_workload"
    "_forever[min-healthy]":
        "[any-failed]: the same waiting nodes; min-healthy's own rule has test_min_healthy_waits_while_enough_nodes_"
        "are_healthy",
    "tests/integration/test_job_suspend.py::test_a_monitor_stopped_with_its_rank_reports_no_hang[rank-first]":
        "[monitor-first], the other order of the same two SIGSTOPs, and the job-wide suspend test",
    "tests/integration/test_detection.py::test_signals_that_cannot_end_a_rank_are_refused[STOP]":
        "[SIGSTOP]: another spelling of the same signal (tests/unit/test_stacks.py parses every spelling)",
    "tests/integration/test_detection.py::test_signals_that_cannot_end_a_rank_are_refused[19]":
        "[SIGSTOP], as above",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid in CI_LEAVES_OUT:
            item.add_marker(pytest.mark.extended)


def _our_tmp_entries() -> set[str]:
    tmp = tempfile.gettempdir()
    return {name for name in os.listdir(tmp) if name.startswith(("ft-", "torchelastic_"))}


@pytest.fixture(scope="session", autouse=True)
def _isolated_session() -> Iterator[None]:
    """Make leaks visible and attributable to this test session.

    Orphans of anything a test starts re-parent to pytest (child subreaper), and every process
    started by the tests uses a session-private TMPDIR, so run directories left by *this*
    session's launchers can be told apart from other users' of /tmp.
    """
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    session_tmp = tempfile.mkdtemp(prefix="ftt-session-", dir="/tmp")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = session_tmp
    tempfile.tempdir = None
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
        tempfile.tempdir = None
        shutil.rmtree(session_tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail a test that leaves a process of ours running or a run directory in the temp dir."""
    before = _our_tmp_entries()
    yield
    leaked = []
    deadline = time.monotonic() + 5.0
    while True:
        leaked = live_descendants(os.getpid())
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    new_dirs = _our_tmp_entries() - before
    for name in new_dirs:
        shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
    assert not leaked, f"processes left running after the test: {leaked}"
    assert not new_dirs, f"temporary directories left behind: {sorted(new_dirs)}"


HARMLESS_TERMINATION = {"rank_termination_signal": "SIGUSR2", "rank_termination_grace": 3600}
"""Config for tests whose *rank is the test process itself*: a detected "hang" (a stall of a
busy test machine against a short calculated timeout) sends SIGUSR2, which the
``harmless_termination`` fixture makes this process ignore, and SIGKILL would come only after
an hour. (Signals that cannot end a process are refused by the config.)"""


@pytest.fixture
def harmless_termination() -> Iterator[dict]:
    """Ignore SIGUSR2 in this process for the test; yields :data:`HARMLESS_TERMINATION`."""
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        yield dict(HARMLESS_TERMINATION)
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.fixture
def run_dir() -> Iterator[str]:
    """A short private (0700) directory for sockets; removed after the test."""
    path = tempfile.mkdtemp(prefix="ftt-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class RankProcess:
    """A scripted rank (tests/workers/scripted_rank.py) in its own session.

    A reader thread turns its stdout JSON lines into events, so waiting for one is a bounded
    queue read (no polling, no buffering surprises).
    """

    def __init__(self, steps: list, socket_path: str | None, env: dict[str, str] | None = None):
        full_env = dict(os.environ)
        full_env.pop(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, None)
        if socket_path is not None:
            full_env[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = socket_path
        full_env.setdefault("RANK", "0")
        full_env.setdefault("LOCAL_RANK", "0")
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS / "scripted_rank.py"), json.dumps(steps)],
            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self._events: queue.Queue = queue.Queue()
        self._stashed: list[dict] = []
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self._events.put(json.loads(line))
        self._events.put(None)

    def next_event(self, op: str, timeout: float = 30.0) -> dict:
        """Return the next event with this op, waiting at most ``timeout`` seconds."""
        for event in self._stashed:
            if event["op"] == op:
                self._stashed.remove(event)
                return event
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                event = None
            if event is None:
                raise AssertionError(
                    f"rank never reported {op!r}; exit={self.proc.poll()} stderr={self.stderr()}"
                )
            if event["op"] == op:
                return event
            self._stashed.append(event)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "<running>"
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def spawn_rank() -> Iterator:
    """Factory: ``spawn_rank(steps, socket_path, env=None)`` -> RankProcess (killed at teardown)."""
    ranks: list[RankProcess] = []

    def factory(steps: list, socket_path: str | None, env: dict[str, str] | None = None) -> RankProcess:
        rank = RankProcess(steps, socket_path, env)
        ranks.append(rank)
        return rank

    yield factory
    for rank in ranks:
        rank.kill()


@pytest.fixture
def start_monitor(run_dir: str) -> Iterator:
    """Factory: ``start_monitor(cfg, name='m')`` -> (handle, socket_path); stopped at teardown."""
    handles = []

    def factory(cfg: FaultToleranceConfig, name: str = "m") -> tuple:
        path = os.path.join(run_dir, f"{name}.sock")
        handle = RankMonitorServer.run_in_subprocess(cfg, path)
        handles.append(handle)
        return handle, path

    yield factory
    for handle in handles:
        if handle.is_alive():
            handle.terminate()
            handle.join(10)
        if handle.is_alive():
            handle.kill()
            handle.join(10)
        assert not handle.is_alive()
