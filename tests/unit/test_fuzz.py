"""Hypothesis fuzzing of every parser that reads bytes from a socket or a file.

Each property says the same thing: whatever comes in, the parser returns a valid value or raises
its own documented error (never another exception, never an unbounded buffer). The servers that
use these parsers are fuzzed live in test_fuzz_servers.py.
"""

from __future__ import annotations

import json
import math
import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.wire import protocol
from ft_core.wire.config import ConfigError, FaultToleranceConfig, parse_cli_value
from ft_core.wire.data import HeartbeatTimeouts, SectionTimeouts, WorkloadAction, WorkloadControlRequest
from ft_core.wire.errors import ProtocolError, RankMonitorClientError
from ft_core.wire.straggler_report import SCOPES, parse_report

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON numbers have no size limit: ints beyond float range are part of the input space.
numbers = st.integers(-(10**6), 10**6) | st.sampled_from([10**400, -(10**400), 2**63]) | st.floats()
# Strings a user or a peer would plausibly send, next to arbitrary text.
plausible = st.sampled_from(["SIGTERM", "9", "INFO", "15", "null", "setup:5,step:1", "step:", "any-failed",
                             "min-healthy", "3", "-1", "nan", "inf", "1e400", "shutdown_workload"])
scalars = st.none() | st.booleans() | numbers | plausible | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def fields_of(names: list[str], values=json_values) -> st.SearchStrategy[dict]:
    """Dicts whose keys are mostly the expected field names, with arbitrary values."""
    return st.dictionaries(st.sampled_from(names) | st.text(max_size=8), values, max_size=len(names) + 1)


# ---------------------------------------------------------------------- framing


@FUZZ
@given(st.binary(max_size=512))
def test_decode_payload_returns_a_typed_object_or_protocol_error(payload):
    try:
        message = protocol.decode_payload(payload)
    except ProtocolError:
        return
    assert isinstance(message, dict) and isinstance(message["type"], str)


@FUZZ
@given(json_values | fields_of(["type"]))
def test_decode_payload_of_any_json_value(value):
    payload = json.dumps(value).encode()
    try:
        message = protocol.decode_payload(payload)
    except ProtocolError:
        assert not (isinstance(value, dict) and isinstance(value.get("type"), str))
        return
    assert message == json.loads(payload)


def test_decode_payload_of_deeply_nested_json():
    for payload in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        try:
            protocol.decode_payload(payload)
        except ProtocolError as err:
            assert "malformed" in str(err)


@FUZZ
@given(st.lists(st.binary(max_size=200), max_size=30))
def test_frame_reader_never_crashes_and_never_buffers_past_its_limit(chunks):
    limit = 64
    reader = protocol.FrameReader(max_message_bytes=limit)
    try:
        for chunk in chunks:
            for message in reader.feed(chunk):
                assert isinstance(message, dict) and isinstance(message["type"], str)
            # whatever is left is one incomplete frame within the limit
            assert len(reader._buffer) < 4 + limit
    except ProtocolError:
        pass


@FUZZ
@given(st.lists(fields_of(["type", "n"], scalars), max_size=8).map(
    lambda ms: [{**m, "type": str(m.get("type"))} for m in ms]), st.data())
def test_frame_reader_decodes_valid_frames_split_anywhere(messages, data):
    frames = []
    for message in messages:
        try:
            frames.append(protocol.encode(message))
        except ProtocolError:  # NaN is not JSON
            assert any(isinstance(v, float) and not math.isfinite(v) for v in message.values())
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    reader = protocol.FrameReader()
    received = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received.extend(reader.feed(stream[start:end]))
    assert received == [json.loads(frame[4:]) for frame in frames]


@FUZZ
@given(st.binary(max_size=300))
def test_recv_message_returns_or_raises_a_documented_error(data):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        try:
            message = protocol.recv_message(b, timeout=1.0)
        except (ProtocolError, ConnectionError, TimeoutError):
            return
        assert isinstance(message["type"], str)
        (length,) = struct.unpack("!I", data[:4])
        assert length <= protocol.MAX_MESSAGE_BYTES


# ---------------------------------------------------------------------- configuration

CONFIG_FIELDS = list(FaultToleranceConfig.field_names())


@FUZZ
@given(fields_of(CONFIG_FIELDS))
def test_config_from_any_mapping_is_valid_or_a_config_error(data):
    try:
        cfg = FaultToleranceConfig.from_dict(data)
    except ConfigError:
        return
    # A valid config survives the trip to the monitor (--config-json) unchanged.
    assert FaultToleranceConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@FUZZ
@given(fields_of(CONFIG_FIELDS), st.sampled_from(["rank", "monitor"]))
def test_a_received_config_is_valid_or_a_config_error(data, role):
    # What a rank makes of a monitor's handshake reply, and a monitor of its --config-json.
    try:
        cfg = FaultToleranceConfig.as_received(data, role)
    except ConfigError:
        return
    assert cfg.sent_to(role) == FaultToleranceConfig.from_dict(cfg.sent_to(role)).sent_to(role)
    unsent = set(CONFIG_FIELDS) - set(FaultToleranceConfig.fields_sent_to(role))
    assert all(getattr(cfg, name) is None for name in unsent)


@FUZZ
@given(st.sampled_from(CONFIG_FIELDS), plausible | st.text(max_size=40) | st.integers().map(str))
def test_cli_values_parse_or_raise_a_config_error(field, text):
    try:
        value = parse_cli_value(field, text)
        FaultToleranceConfig.from_kwargs(**{field: value})
    except ConfigError as err:
        assert field in str(err) or "fault tolerance" in str(err)


@FUZZ
@given(st.integers(0, 50))
def test_every_log_level_survives_the_trip_to_the_monitor(level):
    cfg = FaultToleranceConfig(log_level=level)
    assert FaultToleranceConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))).log_level == level


# ---------------------------------------------------------------------- saved state


timeouts = st.none() | st.floats(min_value=1e-3, max_value=1e6)
valid_states = st.builds(
    lambda hb, sections, oos, calculated: {
        "version": 1,
        "hb_timeouts": HeartbeatTimeouts(hb[0], hb[1], True).to_dict(),
        "section_timeouts": SectionTimeouts(sections, oos, sorted(calculated & set(sections)),
                                            oos is not None).to_dict(),
    },
    st.tuples(timeouts, timeouts),
    st.dictionaries(st.sampled_from(["setup", "step", "checkpointing"]), timeouts),
    timeouts,
    st.sets(st.sampled_from(["setup", "step", "checkpointing"])),
)


@FUZZ
@given(json_values | fields_of(["version", "hb_timeouts", "section_timeouts"],
                               json_values | fields_of(["initial", "subsequent", "were_calculated", "section",
                                                        "out_of_section", "calculated_sections"])))
def test_load_state_dict_accepts_or_raises_rank_monitor_client_error(state):
    client = RankMonitorClient()
    try:
        client.load_state_dict(state)
    except RankMonitorClientError as err:
        assert "invalid fault tolerance state" in str(err)


@FUZZ
@given(valid_states)
def test_saved_state_loads_back(state):
    client = RankMonitorClient()
    client.load_state_dict(json.loads(json.dumps(state)))
    parsed = client._loaded_state
    assert parsed.hb.to_dict() == state["hb_timeouts"]
    assert parsed.sections.to_dict() == state["section_timeouts"]


# ---------------------------------------------------------------------- workload control


@FUZZ
@given(json_values | fields_of(["action", "description", "type", "rank", "only_if_replaceable"],
                               json_values | st.sampled_from([a.value for a in WorkloadAction])))
def test_workload_control_request_parses_or_raises_value_error(data):
    try:
        request = WorkloadControlRequest.from_dict(data)
    except ValueError:
        return
    assert isinstance(request.action, WorkloadAction) and len(request.description) <= 2000


# ---------------------------------------------------------------------- straggler reports


_ENTRY_FIELDS = ["scope", "rank", "node", "relative", "individual", "consecutive", "action"]
_entry_values = json_values | st.sampled_from(["rank", "node", "report", "stop", "replace", "node1", 0, 3, 0.7])


_entry_lists = st.lists(fields_of(_ENTRY_FIELDS, _entry_values), min_size=1, max_size=3)


@FUZZ
@given(json_values | fields_of(["interval_s", "entries"],
                               json_values | _entry_lists | st.sampled_from([30.0, 0, -1.0])))
def test_straggler_report_parses_or_raises_value_error(data):
    if not isinstance(data, dict):
        data = {"interval_s": 1.0, "entries": [data]}
    try:
        interval, entries = parse_report(data)
    except ValueError:
        return
    assert math.isfinite(interval) and interval > 0 and entries
    for entry in entries:
        assert entry.scope in SCOPES and (entry.rank is None) == (entry.scope == "node")
        assert all(s is None or (math.isfinite(s) and s >= 0) for s in (entry.relative, entry.individual))
        assert json.loads(json.dumps(entry.to_dict(), allow_nan=False)) == entry.to_dict()
