"""The leftover-kill never hits a reused pid (issue 21.9).

``launcher.node.processes.kill_leftovers`` kills the processes in the sessions the workers led (workers
start their own), by the session ids it recorded. Once a worker is reaped its pid is free: a
process of another user may take it and lead a session of its own with that id. Root's launcher
must not kill it: a leftover is killed only if, once a pidfd pins it, it still carries the run's
token or descends from the launcher.

The reuse itself cannot be arranged (nobody chooses its pid), so the test puts the rule to work
with what reuse would produce: a ``killer`` process that runs ``kill_leftovers`` as the launcher
does (the run token in its environment), given the session ids of two real session leaders it
did not start (not its descendants):

- a process of the run (it carries the token): killed;
- a process of user nobody without the token, as a reused pid would be: left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ft_core.wire.env import FT_LAUNCHER_RUN_ENV_VAR
from ft_core.wire.procfs import pid_alive

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
AS_NOBODY = "import os\nos.setgroups([])\nos.setgid(65534)\nos.setuid(65534)\n"  # nobody cannot run the venv's python
KILLER = ("import json, sys\n"
          "from launcher.node.processes import kill_leftovers\n"
          "print(json.dumps(sorted(kill_leftovers(worker_pids=json.loads(sys.argv[1]), keep=set()))))\n")
TOKEN = f"{os.getpid()}-leftover-test"


def session_leader(env: dict[str, str], nobody: bool = False) -> subprocess.Popen:
    """A sleeping session leader (its pid is its session id), once it runs (as nobody if asked)."""
    code = (AS_NOBODY if nobody else "") + SLEEPER
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a process of another user, killable by us")
def test_a_recorded_session_of_another_user_without_the_token_is_not_killed():
    base = {k: v for k, v in os.environ.items() if k != FT_LAUNCHER_RUN_ENV_VAR}
    ours = session_leader({**base, FT_LAUNCHER_RUN_ENV_VAR: TOKEN})
    stranger = session_leader(base, nobody=True)
    try:
        assert os.stat(f"/proc/{stranger.pid}").st_uid == 65534
        killer = subprocess.run([sys.executable, "-c", KILLER, json.dumps([ours.pid, stranger.pid])],
                                env={**base, FT_LAUNCHER_RUN_ENV_VAR: TOKEN}, capture_output=True, text=True,
                                timeout=30, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert killer.returncode == 0, killer.stderr
        killed = json.loads(killer.stdout)
        assert ours.wait(10) == -signal.SIGKILL  # the run's own process still goes
        # Before issue 21.9 the recorded session id alone sufficed: the stranger was SIGKILLed too.
        assert (killed, pid_alive(stranger.pid)) == ([ours.pid], True)
    finally:
        for proc in (ours, stranger):
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            proc.stdout.close()
