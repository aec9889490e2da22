"""Connect to a Unix socket as another user (nobody), for the tests of the same-uid rule."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

# Connect as uid/gid 65534 (nobody), send one frame, report what happened.
AS_NOBODY = """
import json, os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except OSError as err:
    print(json.dumps({"connect": err.strerror})); sys.exit(0)
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
    data = s.recv(100).decode("latin-1") or "<closed>"
except ConnectionError:
    data = "<closed>"
print(json.dumps({"connect": "ok", "reply": data}))
"""


def as_nobody(path: str, payload: bytes) -> dict:
    """Send ``payload`` to ``path`` as ``nobody``; return what the connection did (see AS_NOBODY)."""
    out = subprocess.run([sys.executable, "-c", AS_NOBODY, path, payload.hex()],
                         capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


STRANGER = Path(__file__).resolve().parent / "stranger.py"


class Stranger:
    """``tests/stranger.py`` running as nobody: a fake server, or the run-directory thief.

    Its JSON lines are collected by a reader thread; :meth:`wait` returns the first line with
    a given key (bounded), :meth:`stop` ends it and returns everything it printed.
    """

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", str(STRANGER), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[dict] = []
        self._queue: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def serve(cls, paths: list[str], reply: bytes = b"", slot: bool = False, seconds: float = 60) -> Stranger:
        """Fake servers at ``paths`` (see stranger.py); returns once they listen."""
        stranger = cls("serve", json.dumps(paths), reply.hex(), "1" if slot else "0", str(seconds))
        stranger.wait("listening")
        return stranger

    def _read(self) -> None:
        for line in self.proc.stdout:
            record = json.loads(line)
            self.lines.append(record)
            self._queue.put(record)
        self._queue.put(None)

    def wait(self, key: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the stranger printed no {key!r} within {timeout} s: {self.lines}") from None
            if record is None:
                raise AssertionError(f"the stranger ended without {key!r}: {self.lines}, {self.proc.stderr.read()}")
            if key in record:
                return record

    def received(self) -> list[dict]:
        """The connections the stranger accepted so far (``got`` lines)."""
        return [line for line in list(self.lines) if "got" in line]

    def stop(self) -> list[dict]:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.lines

    def __enter__(self) -> Stranger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
