"""Run the user's node check command and leave nothing of it behind (a helper process).

``ft_launcher`` starts this file as a small process of its own (``python -I -S check_reaper.py
TIMEOUT``) for :func:`launcher.node.check.check_command`. It makes itself a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``): every process the command starts and then orphans - a background
job, a daemon that double-forks, a ``setsid`` child that left the command's session and process
group - is re-parented to this helper instead of to init, so none can escape it. Then:

1. it runs ``/bin/sh -c COMMAND`` (the command's stdout and stderr are this helper's stderr: the
   launcher's output pipe) and waits for that shell's own exit, at most ``TIMEOUT`` seconds;
2. it writes one status line to its stdout: ``exit N``, ``signal N`` or ``timeout``;
3. it kills every process left under it (``SIGKILL``, repeated until it has no child left:
   each killed process's own children are re-parented to it in turn), then exits.

When its stdin reaches end of file before that (the launcher died, or gave up), it kills
everything under it at once and exits: nothing the command started outlives the launcher.

The subreaper is this helper and not ``ft_launcher``, so the launcher's own children (its
workers and theirs) are never re-parented to it. Standard library only, and no import of the
``launcher`` package: it runs with ``-I -S``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
POLL_SECONDS = 0.02
KILL_SECONDS = 10.0


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (from ``/proc``; zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as src:
                stat = src.read()
        except OSError:
            continue  # it ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def reap() -> list[tuple[int, int]]:
    """Every ended child waited for: ``[(pid, wait status)]``, without blocking."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status))


def kill_all(deadline_seconds: float = KILL_SECONDS) -> None:
    """SIGKILL every process under this one until none is left (bounded by ``deadline_seconds``)."""
    me = os.getpid()
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        reap()
        left = children(me)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(POLL_SECONDS)


def describe(status: int) -> str:
    """``exit N`` or ``signal N`` for a wait status."""
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def main(argv: list[str]) -> int:
    """Run the command (from the environment variable ``FT_NODE_CHECK_COMMAND``) with ``argv[0]``
    as its timeout in seconds; see the module docstring for what it promises."""
    timeout = float(argv[0])
    command = os.environ.pop("FT_NODE_CHECK_COMMAND")
    # The command's output goes to our stderr (the launcher's pipe); our stdout carries the status.
    status_out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    if not become_subreaper():
        print("warning: no PR_SET_CHILD_SUBREAPER: only the command's process group is killed", file=sys.stderr)
    shell = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=2, stderr=2)
    # our copy of the output pipe is no longer needed: the launcher sees its end once the command's are gone
    os.dup2(devnull, 2)
    deadline = time.monotonic() + timeout
    outcome = None
    launcher_gone = False
    while outcome is None:
        for pid, status in reap():
            if pid == shell.pid:
                outcome = describe(status)
                shell.returncode = status  # so that Popen does not try to wait for it again
        if outcome is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            outcome = "timeout"
            break
        readable, _, _ = select.select([0], [], [], min(POLL_SECONDS, left))
        if readable and not os.read(0, 64):
            launcher_gone = True
            break
    if outcome is not None and not launcher_gone:
        try:
            status_out.write(outcome + "\n")
            status_out.flush()
        except OSError as err:
            if err.errno != errno.EPIPE:
                raise
    kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
