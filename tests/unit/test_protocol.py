"""Framing: round trips, size limits, malformed input; private directory checks."""

import json
import os
import socket
import struct

import pytest

from ft_core import protocol
from ft_core.errors import ProtocolError


def test_encode_then_feed_round_trips_in_arbitrary_chunks():
    messages = [{"type": "a", "n": i, "s": "x" * i} for i in range(50)]
    stream = b"".join(protocol.encode(m) for m in messages)
    reader = protocol.FrameReader()
    received = []
    for start in range(0, len(stream), 7):
        received.extend(reader.feed(stream[start : start + 7]))
    assert received == messages


def test_encode_refuses_oversized_and_untyped_messages():
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        protocol.encode({"type": "big", "data": "x" * protocol.MAX_MESSAGE_BYTES})
    with pytest.raises(ProtocolError, match="string 'type'"):
        protocol.encode({"no_type": 1})
    with pytest.raises(ProtocolError, match="JSON"):
        protocol.encode({"type": "t", "value": object()})


def test_reader_refuses_an_oversized_announcement_before_buffering_it():
    reader = protocol.FrameReader()
    with pytest.raises(ProtocolError, match="limit"):
        list(reader.feed(struct.pack("!I", protocol.MAX_MESSAGE_BYTES + 1)))


@pytest.mark.parametrize(
    "payload",
    [b"\xff\xfe", b"not json", b"[1, 2]", b'{"type": 3}', b"{}", b"1e999999"],
)
def test_reader_refuses_malformed_payloads(payload):
    reader = protocol.FrameReader()
    with pytest.raises(ProtocolError):
        list(reader.feed(struct.pack("!I", len(payload)) + payload))


def test_decode_never_evaluates_anything():
    # A pickle or Python literal is just malformed JSON to us.
    import pickle

    with pytest.raises(ProtocolError):
        protocol.decode_payload(pickle.dumps({"type": "x"}))


def test_recv_message_over_a_real_socket_pair():
    a, b = socket.socketpair()
    with a, b:
        protocol.send_message(a, {"type": "hello", "v": [1, 2]})
        assert protocol.recv_message(b, timeout=5) == {"type": "hello", "v": [1, 2]}
        a.close()
        with pytest.raises(ConnectionError):
            protocol.recv_message(b, timeout=5)


def test_recv_message_times_out():
    a, b = socket.socketpair()
    with a, b, pytest.raises(TimeoutError):
        protocol.recv_message(b, timeout=0.05)


def test_check_socket_path_refuses_long_paths():
    protocol.check_socket_path("/tmp/" + "a" * 90)
    with pytest.raises(ValueError, match="TMPDIR"):
        protocol.check_socket_path("/tmp/" + "a" * 110)


def test_ensure_private_dir_creates_0700(tmp_path):
    path = str(tmp_path / "new")
    old = os.umask(0)
    try:
        protocol.ensure_private_dir(path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o700


def test_ensure_private_dir_refuses_a_shared_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(PermissionError, match="chmod 700"):
        protocol.ensure_private_dir(str(shared))


def test_json_limits_are_documented_consistently():
    frame = protocol.encode({"type": "t", "x": "y" * 100})
    (length,) = struct.unpack("!I", frame[:4])
    assert json.loads(frame[4:]) == {"type": "t", "x": "y" * 100}
    assert length == len(frame) - 4
