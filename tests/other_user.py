"""Connect to a Unix socket as another user (nobody), for the tests of the same-uid rule."""

from __future__ import annotations

import json
import subprocess
import sys

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
