"""Framing: round trips, size limits, malformed input; socket directory checks."""

import json
import logging
import os
import select
import socket
import stat
import struct
import threading

import pytest

from ft_core.wire import protocol
from ft_core.wire.errors import ProtocolError


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


def test_ensure_socket_dir_creates_a_missing_directory_0700(tmp_path):
    path = str(tmp_path / "new")
    old = os.umask(0)
    try:
        protocol.ensure_socket_dir(path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode, refused", [
    (0o700, False), (0o755, False), (0o711, False), (0o1777, False), (0o1770, False),
    (0o777, True), (0o770, True), (0o757, True), (0o2775, True),
])
def test_ensure_socket_dir_refuses_only_where_another_user_could_swap_the_socket(tmp_path, mode, refused):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if refused:
        with pytest.raises(PermissionError, match="without the sticky bit"):
            protocol.ensure_socket_dir(str(shared))
    else:
        protocol.ensure_socket_dir(str(shared))
    assert stat.S_IMODE(shared.stat().st_mode) == mode  # never changed


def test_json_limits_are_documented_consistently():
    frame = protocol.encode({"type": "t", "x": "y" * 100})
    (length,) = struct.unpack("!I", frame[:4])
    assert json.loads(frame[4:]) == {"type": "t", "x": "y" * 100}
    assert length == len(frame) - 4


def test_every_message_type_is_named_once_in_protocol():
    names = {name: value for name, value in vars(protocol).items() if name.startswith("MSG_")}
    assert len(set(names.values())) == len(names), "two message names share a wire string"
    assert protocol.MESSAGE_TYPES == set(names.values()) - {protocol.MSG_MONITOR_LOST}


def test_ft_core_spells_no_message_type_as_a_bare_string():
    import re
    from pathlib import Path

    bare = re.compile(r"""["']type["']\s*:\s*["']|\[["']type["']\]\s*[!=]=\s*["']|get\(["']type["']\)\s*[!=]=\s*["']""")
    offenders = [f"{path.name}:{number}" for path in sorted(Path(protocol.__file__).parent.glob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if bare.search(line)]
    assert not offenders, f"use the protocol.MSG_* constants: {offenders}"


def test_accept_own_user_takes_every_pending_connection_with_its_pid(run_dir, caplog):
    path = os.path.join(run_dir, "a.sock")
    listener = protocol.listen_unix(path, 8)
    clients = [protocol.connect_unix(path, 5) for _ in range(3)]
    try:
        accepted = list(protocol.accept_own_user(listener, logging.getLogger("tests.accept"), "test socket"))
        assert [pid for _sock, pid in accepted] == [os.getpid()] * 3
        assert list(protocol.accept_own_user(listener, logging.getLogger("tests.accept"), "test socket")) == []
        for (sock, _pid), client in zip(accepted, clients, strict=True):
            protocol.send_message(client, {"type": "x"})
            assert protocol.recv_message(sock, 5) == {"type": "x"}
            sock.close()
    finally:
        for client in clients:
            client.close()
        listener.close()
    assert "refused" not in caplog.text


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to switch to another uid")
def test_accept_own_user_refuses_another_uid_with_one_line(run_dir, caplog):
    from tests.other_user import as_nobody

    os.chmod(run_dir, 0o711)  # let the stranger reach the socket: only the uid check is left
    path = os.path.join(run_dir, "a.sock")
    listener = protocol.listen_unix(path, 8)
    os.chmod(path, 0o666)
    result: list[dict] = []
    stranger = threading.Thread(target=lambda: result.append(as_nobody(path, protocol.encode({"type": "x"}))))
    stranger.start()
    try:
        assert select.select([listener], [], [], 30)[0], "the stranger never connected"
        with caplog.at_level(logging.WARNING, logger="tests.accept"):
            assert list(protocol.accept_own_user(listener, logging.getLogger("tests.accept"), "test socket")) == []
    finally:
        stranger.join(30)
        listener.close()
        os.chmod(run_dir, 0o700)
    assert result == [{"connect": "ok", "reply": "<closed>"}]
    assert "test socket: refused connection from pid" in caplog.text and "uid 65534" in caplog.text


def test_connect_unix_raises_oserror_and_leaves_no_socket(run_dir):
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        protocol.connect_unix(os.path.join(run_dir, "missing.sock"), 5)
    assert set(os.listdir("/proc/self/fd")) == before
