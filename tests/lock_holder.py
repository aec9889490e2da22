"""Another user (nobody) who takes a lock on one of our files and holds it, for the tests of issue 21 item 7.

:class:`LockHolder` starts a standard-library script (``python -I``) that drops to uid/gid 65534,
opens the file read-only (all that a reader of a 0644 file can do) and takes the lock: ``lockf``
(a shared POSIX lock, which needs only read access) or ``flock`` (exclusive: ``flock`` needs
no write access at all). It reports ``{"locked": true}`` or ``{"error": strerror}`` as one JSON
line, then holds the lock until its stdin is closed (bounded by ``seconds``).
"""

from __future__ import annotations

import json
import subprocess
import sys

HOLD_AS_NOBODY = """
import fcntl, json, os, select, sys
os.setgid(65534); os.setgroups([]); os.setuid(65534)
path, kind, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    fd = os.open(path, os.O_RDONLY)
    if kind == "lockf":
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    else:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as err:
    print(json.dumps({"error": err.strerror}), flush=True)
    sys.exit(0)
print(json.dumps({"locked": True}), flush=True)
select.select([sys.stdin], [], [], seconds)  # held until the test closes our stdin
"""


class LockHolder:
    """``nobody`` holding a ``lockf`` (shared) or ``flock`` (exclusive) lock on ``path``.

    Use as a context manager; :attr:`result` is what the holder reported once it tried.
    """

    def __init__(self, path: str, kind: str, seconds: float = 120.0) -> None:
        assert kind in ("lockf", "flock"), kind
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", HOLD_AS_NOBODY, str(path), kind, str(seconds)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()  # the holder prints its line at once (or dies)
        if not line:
            self.proc.wait(10)
            raise AssertionError(f"the lock holder printed nothing: {self.proc.stderr.read()}")
        self.result: dict = json.loads(line)

    def __enter__(self) -> LockHolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
