"""launcher.node.processes.terminate_groups: the launcher's one way to stop workers, with real children."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from launcher.node.processes import WorkerProcesses, running_child, terminate_groups, wait_for_any

IGNORES_SIGTERM = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "print('ready', flush=True)\n"
                   "time.sleep(120)\n")
# SIGINT's Python handler is installed explicitly: a child started from a background job (nohup, a
# CI runner) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
OBEYS = ("import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
         "print('ready', flush=True)\ntime.sleep(120)\n")


def start(code: str, new_session: bool = True) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=new_session)
    assert proc.stdout.readline().strip() == "ready"  # its handlers are installed
    return proc, os.pidfd_open(proc.pid)


@pytest.mark.parametrize("grace", [0.4, 1.5])
def test_the_grace_is_kept_to_the_fraction_of_a_second(grace):
    proc, pidfd = start(IGNORES_SIGTERM)
    try:
        started = time.monotonic()
        terminate_groups([proc.pid], {proc.pid: pidfd}, grace)
        elapsed = time.monotonic() - started
    finally:
        os.close(pidfd)
    assert proc.wait(10) == -signal.SIGKILL
    # torch's stop path would have truncated 1.5 s to 1 s and 0.4 s to 0 s
    assert elapsed >= grace, elapsed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_death_signal_comes_first_and_ends_an_obedient_worker(sig):
    proc, pidfd = start(OBEYS)
    try:
        terminate_groups([proc.pid], {proc.pid: pidfd}, grace=60, sig=sig)  # returns once it exited
    finally:
        os.close(pidfd)
    assert proc.wait(10) in (-sig, 1)  # SIGINT becomes KeyboardInterrupt -> exit 1 in Python
    if sig == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM


def test_without_a_pidfd_the_worker_is_polled_not_killed_early():
    proc, pidfd = start(IGNORES_SIGTERM)
    os.close(pidfd)
    started = time.monotonic()
    terminate_groups([proc.pid], {}, 0.5)
    assert time.monotonic() - started >= 0.5
    assert proc.wait(10) == -signal.SIGKILL


def test_a_worker_without_its_own_process_group_is_signalled_alone():
    proc, pidfd = start(OBEYS, new_session=False)  # torch's --run-path workers: our process group
    try:
        terminate_groups([proc.pid], {proc.pid: pidfd}, grace=60)
    finally:
        os.close(pidfd)
    assert proc.wait(10) == -signal.SIGTERM


def test_the_whole_process_group_is_stopped():
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print('ready', child.pid, flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    word, grandchild = proc.stdout.readline().split()
    assert word == "ready"
    pidfd = os.pidfd_open(proc.pid)
    grandchild_fd = os.pidfd_open(int(grandchild))
    try:
        terminate_groups([proc.pid], {proc.pid: pidfd}, grace=60)
        # the data-loader-like child in the worker's group got the signal too
        assert select.select([grandchild_fd], [], [], 10)[0], "the worker's child survived"
    finally:
        os.close(pidfd)
        os.close(grandchild_fd)
    assert proc.wait(10) == -signal.SIGTERM


def test_running_child():
    proc, pidfd = start(OBEYS)
    os.close(pidfd)
    assert running_child(proc.pid)
    assert not running_child(os.getppid())  # not our child
    proc.kill()
    deadline = time.monotonic() + 10
    while running_child(proc.pid):  # a zombie is not running
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert proc.wait(10) == -signal.SIGKILL
    assert not running_child(proc.pid)  # reaped
    terminate_groups([proc.pid], {}, 0.1)  # an exited worker is never signalled (nor waited for)


def test_worker_processes_wake_a_wait_when_a_worker_exits():
    first, fd1 = start(OBEYS)
    second, fd2 = start(OBEYS)
    os.close(fd1)
    os.close(fd2)
    workers = WorkerProcesses()
    workers.started({0: first.pid, 1: second.pid})
    try:
        assert workers.pids == [first.pid, second.pid] and len(workers.fds()) == 2
        assert workers.exit_statuses() == {first.pid: None, second.pid: None}
        first.kill()
        started = time.monotonic()
        wait_for_any(workers.fds(), timeout=60)  # returns at the exit, not after 60 s
        assert time.monotonic() - started < 30
        assert workers.exit_statuses() == {first.pid: -signal.SIGKILL, second.pid: None}
        workers.terminate([second.pid], grace=60)
        assert second.wait(10) == -signal.SIGTERM
    finally:
        workers.close()
    assert workers.fds() == [] and workers.pids == [first.pid, second.pid]
    assert first.wait(10) == -signal.SIGKILL
