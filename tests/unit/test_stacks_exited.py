"""A rank that exited before its stacks were read (issue 22 item 5): the capture says so in plain
words at once, instead of "py-spy: Error: ...; faulthandler: ... (a signal handler cannot run?)"
after the whole budget, and its monitor logs it at debug level, not as a warning.

The rank is a real process that registers the client's dump handler, then exits and is left
unreaped (a zombie), as a worker is between its exit and torch's next poll.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from ft_core.monitor.session import RankSession
from ft_core.wire import stacks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = ("import sys\n"
        "from ft_core.wire.stacks import DumpHandler\n"
        "handler = DumpHandler.install()\n"
        "print(handler.fd, handler.signum, flush=True)\n"
        "sys.stdin.readline()\n")
BUDGET = 3.0


@pytest.fixture
def exited_rank():
    proc = subprocess.Popen([sys.executable, "-c", RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    fd, signum = proc.stdout.readline().split()
    dump_fd = os.open(f"/proc/{proc.pid}/fd/{fd}", os.O_RDONLY)
    proc.stdin.close()  # the rank reads EOF and exits; nobody reaps it yet
    deadline = time.monotonic() + 10
    while _state(proc.pid) != "Z":
        assert time.monotonic() < deadline, "the rank did not exit"
        time.sleep(0.01)
    yield stacks.StackTarget(pid=proc.pid, dump_fd=dump_fd, dump_signal=int(signum))
    os.close(dump_fd)
    proc.wait(timeout=10)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stream:
        return stream.read().rpartition(")")[2].split()[0]


@pytest.mark.timeout(30)
def test_an_exited_rank_is_named_as_such_at_once(exited_rank):
    started = time.monotonic()
    result = stacks.capture(exited_rank, BUDGET)
    assert (result.method, result.error, result.exited) == (None, stacks.RANK_EXITED, True)
    assert time.monotonic() - started < BUDGET / 2  # it did not wait for a dump that cannot come


@pytest.mark.timeout(30)
def test_its_monitor_logs_no_warning(exited_rank, caplog):
    session = RankSession(conn=None, pid=exited_rank.pid, info={"rank": 3, "local_rank": 1}, slot=None,
                          timeouts=None, stack_target=exited_rank)
    with caplog.at_level(logging.DEBUG, logger="ft_core.monitor.session"):
        captured = session.capture_stacks(BUDGET, None, "test", "")
    assert captured.stack_error == stacks.RANK_EXITED and captured.stack_frames == []
    [line] = [r for r in caplog.records if "no stacks" in r.getMessage()]
    assert line.levelno == logging.DEBUG, line.getMessage()
    assert line.getMessage() == f"rank 3 (local rank 1, pid {exited_rank.pid}): no stacks: {stacks.RANK_EXITED}"


def test_has_exited_reads_proc():
    assert not stacks.has_exited(os.getpid())
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    assert stacks.has_exited(int(done.stdout))  # reaped: gone from /proc
