"""The trampoline stays standard-library only (see its docstring); its copies of ft_core's names
and limits must equal ft_core's, and its frames must be what ft_core's framing reads and writes."""

from __future__ import annotations

import json
import os
import socket

import pytest

from ft_core.wire import env, osutil, protocol
from ft_core.wire.errors import ProtocolError
from launcher.warm import coordinator as warm
from launcher.warm import trampoline, zygote


def test_the_trampolines_copies_equal_ft_cores():
    assert trampoline.ZYGOTE_SOCKET_ENV == env.FT_WARM_TEMPLATE_SOCKET_ENV_VAR
    assert (trampoline.MSG_SPAWN, trampoline.MSG_SPAWNED, trampoline.MSG_EXITED) == (
        protocol.MSG_SPAWN, protocol.MSG_SPAWNED, protocol.MSG_EXITED)
    assert trampoline.MAX_REPLY_BYTES == protocol.MAX_MESSAGE_BYTES
    assert trampoline.MAX_REQUEST_BYTES == zygote.MAX_REQUEST_BYTES
    assert warm.TRAMPOLINE == os.path.abspath(trampoline.__file__)  # the file torch runs is this module
    assert trampoline._PEERCRED.format == protocol._PEERCRED.format  # the uid check's SO_PEERCRED layout
    assert trampoline.STEP_SIGNALS == osutil.STEP_SIGNALS


def test_the_trampolines_title_code_does_what_ft_cores_does(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, {root!r}); from launcher.warm import trampoline; "
            "from ft_core.wire import osutil; "
            "f = trampoline._set_title if sys.argv[1] == 't' else osutil.set_process_title; f('new title x'); "
            "print(open('/proc/self/cmdline', 'rb').read())")
    root = os.path.dirname(os.path.dirname(trampoline.__file__))
    shown = [subprocess.run([sys.executable, "-c", code.format(root=root), which, "padding" * 4],
                            capture_output=True, text=True, timeout=60, check=True).stdout for which in "to"]
    assert shown[0] == shown[1] == repr(b"new title x\x00") + "\n"


def test_a_request_framed_by_the_trampoline_is_read_by_ft_cores_reader():
    request = {"type": trampoline.MSG_SPAWN, "argv": ["-u", "x.py"], "env": {"A": "1"}, "cwd": "/"}
    payload = json.dumps(request).encode()
    frame = trampoline._HEADER.pack(len(payload)) + payload
    reader = protocol.FrameReader(zygote.MAX_REQUEST_BYTES)
    # byte by byte: the template reads a non-blocking stream
    messages = [m for i in range(len(frame)) for m in reader.feed(frame[i:i + 1])]
    assert messages == [request]


def test_the_request_bound_is_the_templates():
    too_big = trampoline._HEADER.pack(zygote.MAX_REQUEST_BYTES + 1)
    with pytest.raises(ProtocolError):
        list(protocol.FrameReader(zygote.MAX_REQUEST_BYTES).feed(too_big))


@pytest.mark.parametrize("message", [
    {"type": protocol.MSG_SPAWNED, "pid": 123},
    {"type": protocol.MSG_EXITED, "pid": 123, "status": -9},
])
def test_a_reply_encoded_by_ft_core_is_read_by_the_trampoline(message):
    left, right = socket.socketpair()
    with left, right:
        left.sendall(protocol.encode(message) + protocol.encode(message))
        buffer = bytearray()
        assert trampoline._read_message(right, buffer) == message
        assert trampoline._read_message(right, buffer) == message  # the second frame was buffered


def test_the_trampoline_refuses_a_reply_over_the_protocol_bound():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(trampoline._HEADER.pack(protocol.MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ConnectionError, match="oversized"):
            trampoline._read_message(right, bytearray())
