"""Live servers fed random frames (hypothesis): the rank monitor, the launcher's control socket and
the warm template. After every example the server must still be running and must still answer a
well-formed request: no input crashes it, and no input (a partial frame left open included) keeps
it from serving others.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ft_core import FaultToleranceConfig
from ft_core.monitor.link import MonitorLink
from ft_core.wire import protocol
from launcher.node.control_server import ControlServer

LIVE = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
ZYGOTE = Path(__file__).resolve().parents[2] / "launcher" / "warm" / "zygote.py"
TRAMPOLINE = Path(__file__).resolve().parents[2] / "launcher" / "warm" / "trampoline.py"
REPLY_TIMEOUT = 5.0

# Edge values first: zero, negatives, ints beyond float range (JSON has no limit), NaN, infinities.
edges = st.sampled_from([0, -1, 10**400, -(10**400), 2**63, 1e-300, 1e308, float("nan"), float("inf")])
numbers = st.one_of(edges, edges, st.floats(), st.integers(-(10**6), 10**6))
values = st.recursive(
    st.none() | st.booleans() | numbers | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
TYPES = sorted(protocol.MESSAGE_TYPES)
RANK_TYPES = [protocol.MSG_SET_HB_TIMEOUTS, protocol.MSG_SET_SECTION_TIMEOUTS, protocol.MSG_SHUTDOWN]
# Pids that no process has (above pid_max) or that we may not signal: never a real process.
harmless_pids = st.sampled_from([0, -1, 4194305, 2**31 - 1, 2**40, "1"])
messages = st.fixed_dictionaries(
    {"type": st.sampled_from(RANK_TYPES) | st.sampled_from(TYPES) | st.text(max_size=6)},
    optional={
        "protocol": st.sampled_from([protocol.PROTOCOL_VERSION, 0, "1"]) | values,
        "rank": values, "local_rank": values, "hostname": values, "world_size": values,
        "initial": numbers | st.none(), "subsequent": numbers | st.none(),
        "section": st.dictionaries(st.sampled_from(["setup", "step", "x"]) | st.text(max_size=4),
                                   numbers | st.none() | values, max_size=3) | values,
        "out_of_section": numbers | st.none(),
        "pid": harmless_pids, "cycle": values,
        "action": st.sampled_from(["shutdown_workload", "exclude_this_node", "continue"]) | values,
        "description": values,
        "argv": values, "env": values, "cwd": values,
    },
)


def frame_json(message: dict) -> bytes:
    """Frame with NaN/Infinity allowed: a peer is not bound to our encoder's rules."""
    payload = json.dumps(message, allow_nan=True).encode()
    return struct.pack("!I", len(payload)) + payload


framed_messages = messages.map(frame_json)
frames = st.one_of(  # mostly well-formed messages, which reach deeper than garbage does
    framed_messages, framed_messages, framed_messages, framed_messages,
    st.binary(max_size=40),
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=40)).map(lambda t: struct.pack("!I", t[0]) + t[1]),
    st.just(struct.pack("!I", 10) + b"[" * 5),  # a partial frame
    st.integers(1, 200_000).map(lambda n: struct.pack("!I", 2 * n) + b"[" * n + b"]" * n),  # deep nesting
)
VALID_INIT = frame_json({"type": "init", "protocol": protocol.PROTOCOL_VERSION})
# What an attached rank may send, with hostile values in the fields that matter.
hb_update = st.fixed_dictionaries({"type": st.just("set_hb_timeouts"), "initial": numbers | st.none() | values,
                                   "subsequent": numbers | st.none() | values})
section_update = st.fixed_dictionaries(
    {"type": st.just("set_section_timeouts"),
     "section": st.dictionaries(st.sampled_from(["setup", "step"]) | st.text(max_size=4),
                                numbers | st.none() | values, max_size=3) | values},
    optional={"out_of_section": numbers | st.none() | values},
)
rank_frames = st.one_of(hb_update, section_update, st.just({"type": "shutdown"}), messages).map(frame_json)
session = st.lists(st.one_of(rank_frames, rank_frames, rank_frames, frames), min_size=1, max_size=6).map(
    lambda rest: [VALID_INIT, *rest])
# (frames, keep the connection open while checking); most streams first pass the handshake, so
# that the messages of an attached rank get fuzzed too.
streams = st.tuples(st.one_of(session, session, st.lists(frames, min_size=1, max_size=6)), st.booleans())


class Connector:
    """A child process that connects on our behalf, so that servers see *its* pid as the peer.

    The monitor signals the pid of the rank attached to it, and the warm template serves only
    children of its launcher: the fuzzing client must be a process of its own, a child of ours.
    """

    CODE = (
        "import signal, socket, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "ctl = socket.socket(fileno=int(sys.argv[1]))\n"
        "while ctl.recv(1):\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    try:\n"
        "        s.connect(sys.argv[2])\n"
        "        socket.send_fds(ctl, [b'c'], [s.fileno()])\n"
        "    except OSError:\n"
        "        ctl.sendall(b'e')\n"
        "    s.close()\n"
    )

    def __init__(self, path: str) -> None:
        self._ctl, child = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, str(child.fileno()), path],
                                     pass_fds=(child.fileno(),))
        child.close()
        self._ctl.settimeout(10)

    def connect(self) -> socket.socket:
        self._ctl.sendall(b"x")
        _data, fds, _flags, _addr = socket.recv_fds(self._ctl, 1, 1)
        assert fds, "the connector could not connect"
        return socket.socket(fileno=fds[0])

    def close(self) -> None:
        self._ctl.close()
        self.proc.wait(10)


def send_stream(sock: socket.socket, chunks: list[bytes]) -> None:
    sock.settimeout(2)
    with contextlib.suppress(OSError):  # the server may drop us half-way: that is allowed
        for chunk in chunks:
            sock.sendall(chunk)


# ---------------------------------------------------------------------- rank monitor


@pytest.fixture
def fuzzed_monitor(start_monitor):
    # SIGTERM, which the connector ignores, as the termination signal, with a grace longer than
    # the test: a fuzzing session that sets tiny timeouts gets its hang detected, and the
    # connector survives it. No stack capture (it would only slow the fuzzing down).
    cfg = FaultToleranceConfig(rank_termination_signal="SIGTERM", rank_termination_grace=3600,
                               stack_capture_budget=0, rank_section_timeouts={"setup": 60, "step": 60},
                               initial_rank_heartbeat_timeout=5, rank_heartbeat_timeout=0.5)
    handle, path = start_monitor(cfg)
    link = MonitorLink(path)  # the launcher role is taken: a fuzzing peer cannot claim it
    connector = Connector(path)
    yield handle, path, link, connector
    connector.close()
    link.close()


def monitor_answers(path: str) -> dict:
    """A rank handshake from this process; returns the monitor's reply (init_ok or error)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(REPLY_TIMEOUT)
        sock.connect(path)
        protocol.send_message(sock, {"type": "init", "protocol": protocol.PROTOCOL_VERSION, "rank": 0})
        reply, fds = protocol.recv_message_with_fds(sock, REPLY_TIMEOUT)
        for fd in fds:
            os.close(fd)
        if reply["type"] == protocol.MSG_INIT_OK:
            protocol.send_message(sock, {"type": protocol.MSG_SHUTDOWN})
            assert protocol.recv_message(sock, REPLY_TIMEOUT)["type"] == protocol.MSG_OK
        return reply


@LIVE
@given(streams)
def test_monitor_survives_any_stream_and_keeps_serving(fuzzed_monitor, stream):
    handle, path, link, connector = fuzzed_monitor
    chunks, keep_open = stream
    sock = connector.connect()
    try:
        send_stream(sock, chunks)
        if not keep_open:
            sock.close()
        reply = monitor_answers(path)
        assert reply["type"] in (protocol.MSG_INIT_OK, protocol.MSG_ERROR), reply
    finally:
        sock.close()
    link.poll_events()  # drain what the monitor reported, as the launcher does
    assert handle.is_alive()
    assert not link.lost
    assert connector.proc.poll() is None  # the monitor never killed the peer (it ignores SIGTERM)


def test_after_hostile_input_a_real_rank_hang_is_still_detected(fuzzed_monitor, spawn_rank):
    handle, path, link, connector = fuzzed_monitor
    sock = connector.connect()
    send_stream(sock, [frame_json({"type": "init", "protocol": 1}),
                       frame_json({"type": "set_hb_timeouts", "initial": 10**400, "subsequent": float("nan")}),
                       frame_json({"type": "set_section_timeouts", "section": {"step": 10**400}}),
                       frame_json({"type": "set_section_timeouts", "section": {"step": -1}, "out_of_section": 1e-300}),
                       struct.pack("!I", 10**6)])
    sock.close()
    rank = spawn_rank([["init"], ["hb", 2, 0.01], ["sleep", 60]], path)
    rank.next_event("sleep")
    deadline = time.monotonic() + 20
    hangs = []
    while not hangs:
        assert time.monotonic() < deadline, "the monitor no longer detects hangs"
        hangs = [e for e in link.poll_events() if e["type"] == protocol.MSG_RANK_HANG and e["pid"] == rank.proc.pid]
        time.sleep(0.02)
    assert hangs[0]["kind"] == "heartbeat" and hangs[0]["timeout"] == 0.5
    assert handle.is_alive()


# ---------------------------------------------------------------------- control socket


@pytest.fixture
def control(run_dir):
    server = ControlServer(os.path.join(run_dir, "launcher.sock"))
    server.set_workers([os.getpid()])  # this test process plays a worker
    yield server
    server.close()


def control_request(path: str, chunks: list[bytes]) -> bytes:
    """Send ``chunks``, end the stream, return whatever the server answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(REPLY_TIMEOUT + 5)
        sock.connect(path)
        send_stream(sock, chunks)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        sock.settimeout(REPLY_TIMEOUT + 5)
        data = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                data += chunk
        return data


@LIVE
@given(streams)
def test_control_socket_survives_any_stream_and_keeps_serving(control, stream):
    chunks, _keep_open = stream
    answer = control_request(control.path, chunks)
    if answer:  # an answer is always one well-formed reply
        reply = protocol.FrameReader().feed(answer)
        assert next(reply)["type"] in (protocol.MSG_OK, protocol.MSG_ERROR)
    valid = frame_json({"type": "workload_control", "action": "continue", "description": "still there?"})
    ok = next(protocol.FrameReader().feed(control_request(control.path, [valid])))
    assert ok["type"] == protocol.MSG_OK
    assert control._thread.is_alive()
    while not control.requests.empty():
        control.requests.get_nowait()


# ---------------------------------------------------------------------- warm template


@pytest.fixture
def zygote(run_dir):
    path = os.path.join(run_dir, "warm.sock")
    proc = subprocess.Popen([sys.executable, str(ZYGOTE), "--socket", path, "--parent-pid", str(os.getpid()),
                             "--preload", ""], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "the warm template did not start"
        time.sleep(0.02)
    connector = Connector(path)
    yield proc, path, connector
    connector.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{entry}/stat").read_bytes()
                if int(raw[raw.rfind(b")") + 2 :].split()[1]) == pid:
                    found.append(int(entry))
    return found


@LIVE
@given(streams)
def test_warm_template_survives_any_stream_and_forks_nothing(zygote, stream):
    proc, path, connector = zygote
    chunks, keep_open = stream
    sock = connector.connect()
    try:
        send_stream(sock, chunks)
        if not keep_open:
            sock.close()
        # A request without the three standard streams never forks anything.
        assert not children_of(proc.pid)
        assert proc.poll() is None
        connector.connect().close()  # still accepting
    finally:
        sock.close()


def test_after_fuzzing_the_warm_template_still_forks_a_real_request(zygote, tmp_path):
    proc, path, connector = zygote
    sock = connector.connect()
    send_stream(sock, [struct.pack("!I", 2 * 150_000) + b"[" * 150_000 + b"]" * 150_000,
                       struct.pack("!I", 2**31)])
    sock.close()
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(TRAMPOLINE), "-c", "import os; print(os.getppid())"],
        env={**os.environ, "FT_WARM_TEMPLATE_SOCKET": path}, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == proc.pid  # forked by the template, not started cold
    assert proc.poll() is None
