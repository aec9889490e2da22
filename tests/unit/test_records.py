"""Typed event records and monitor messages (issue 20 item 2): one class per kind, written and
read by the same class; readers skip what they cannot read with one warning per reason; the
schema table of docs/launcher.md is generated from the classes."""

from __future__ import annotations

import ast
import collections
import dataclasses
import io
import json
import logging
from pathlib import Path

import pytest

from ft_core.wire import messages
from ft_core.wire.typed import MalformedError
from launcher.events import records
from launcher.events.log import EventLog
from launcher.events.records import (
    KINDS,
    SCHEMA_VERSION,
    CycleStart,
    EventRecord,
    Failure,
    LauncherStart,
    Result,
    read_events,
    schema_table,
)

REPO = Path(__file__).resolve().parents[2]
TABLE_BEGIN = "<!-- records table: launcher.records.schema_table(); tests/unit/test_records.py checks it -->\n"
TABLE_END = "<!-- end of records table -->\n"


def required(cls: type) -> dict:
    """Values for the required fields of a record or message class."""
    samples = {"cycle": 3, "cause": "exit code 1", "cause_kind": "exit", "outcome": "failed", "pid": 42,
               "kind": "heartbeat", "elapsed": 2.0, "timeout": 1.0, "signal": "SIGKILL", "detected_at": 5.0,
               "step": 136, "source": "jit"}
    return {f.name: samples[f.name] for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


# ---------------------------------------------------------------------- records


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_round_trips_through_its_json_line(kind):
    cls = KINDS[kind]
    record = cls(ts=12.5, node="n1", pid=7, run_id="r", **required(cls))
    line = json.dumps(record.to_wire())
    data = json.loads(line)
    assert data["event"] == kind and data["schema"] == SCHEMA_VERSION
    parsed, reason = records.parse_line(line)
    assert reason == "" and parsed == record and type(parsed) is cls


def test_the_envelope_and_the_fields_keep_todays_names_and_order(tmp_path):
    log = EventLog(str(tmp_path / "ft_events.jsonl"), node="n1", stream=io.StringIO(), run_id="r1")
    try:
        log.record_event(CycleStart(cycle=0, restart_count=0, warm_start=False))
        log.record_event(Result(outcome="succeeded", exit_code=0, cycles=1))
    finally:
        log.close()
    first, second = [json.loads(line) for line in (tmp_path / "ft_events.jsonl").read_text().splitlines()]
    assert list(first)[:6] == ["event", "time", "ts", "node", "pid", "run_id"]
    assert first["event"] == "cycle_start" and first["cycle"] == 0 and first["run_id"] == "r1"
    assert (second["event"], second["outcome"], second["exit_code"]) == ("result", "succeeded", 0)
    assert log.records == [first, second]  # the records as written
    assert [type(r) for r in log.history] == [CycleStart, Result]


def test_a_kind_names_another_process_in_pid_only_when_it_says_so(tmp_path):
    log = EventLog(None, node="n1", stream=io.StringIO())
    template = log.record_event(records.WarmTemplateStarted(cycle=0, pid=99))
    start = log.record_event(records.MonitorsStarted(monitor_pids=[1, 2]))
    assert template.pid == 99 and start.pid not in (None, 99)
    assert "pid" in records.WarmTemplateStarted.field_names()
    assert "pid" not in records.MonitorsStarted.field_names()


def test_a_field_the_kind_lacks_or_a_missing_required_one_is_an_error_where_it_is_written():
    with pytest.raises(TypeError, match="cycel"):
        CycleStart(cycel=0)
    with pytest.raises(TypeError, match="outcome"):  # a required field
        Result(exit_code=0)


def _calls(attr: str) -> list[tuple[str, ast.Call]]:
    """Every call ``X.<attr>(...)`` in the launcher's and ft_core's code: (file:line, the call)."""
    calls = []
    for root in ("launcher", "ft_core"):
        for path in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr:
                    calls.append((f"{path.relative_to(REPO)}:{node.lineno}", node))
    return calls


def test_records_are_written_one_way_only():
    # EventLog.record_event(<kind's class>(...)) is the only writer: no kind named by a string
    assert not hasattr(EventLog, "record") and not hasattr(records, "build")
    by_string = [where for where, call in _calls("record")
                 if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)]
    assert by_string == []


def test_every_record_the_launcher_writes_names_its_kinds_fields():
    # read statically, so that a path the tests rarely take (store_lost, ...) is checked too
    classes = {cls.__name__: cls for cls in KINDS.values()}
    written: dict[str, str] = {}
    for where, call in _calls("record_event"):
        assert len(call.args) == 1 and not call.keywords, f"{where}: record_event takes one record"
        built = call.args[0]
        if not (isinstance(built, ast.Call) and isinstance(built.func, ast.Name) and built.func.id in classes):
            continue  # a record built elsewhere (the failure records of launcher.events.log)
        cls = classes[built.func.id]
        fields = {f.name for f in dataclasses.fields(cls)}
        # (the failure record of launcher.events.log adds its detail with **: its keys are checked at run time)
        keywords = {k.arg for k in built.keywords if k.arg is not None}
        assert not built.args, f"{where}: {cls.__name__} takes its fields by name"
        assert keywords <= fields, f"{where}: {cls.EVENT!r} has no field(s) {sorted(keywords - fields)}"
        written.setdefault(where.split(":")[0], cls.EVENT)
    assert {"launcher/launch.py", "launcher/agent.py", "launcher/warm/coordinator.py"} <= set(written), written


def test_an_older_record_reads_with_defaults_and_a_newer_ones_extra_fields_are_ignored():
    old = {"event": "failure", "ts": 10.0, "node": "n", "pid": 1, "cycle": 0, "cause": "exit code 1",
           "cause_kind": "terminated"}
    record, _ = records.parse(old)
    assert isinstance(record, Failure) and record.role is None and record.effective_role == "collateral"
    assert record.run_id is None and record.stack_frames is None
    extra, _ = records.parse({**old, "cause_kind": "exit", "a_future_field": [1], "schema": SCHEMA_VERSION})
    assert extra.effective_role == "root"
    wrong, _ = records.parse({**old, "rank": "one"})  # an optional field of the wrong type: its default
    assert wrong.rank is None


def test_readers_skip_what_they_cannot_read_with_one_warning_per_reason(tmp_path, caplog):
    good = [LauncherStart(ts=1.0, node="n", pid=1, nnodes="1:1").to_wire(),
            CycleStart(ts=2.0, node="n", pid=1, cycle=0).to_wire()]
    lines = [
        json.dumps(good[0]),
        '{"event": "failure", "ts": 5',                                  # torn by a killed launcher
        '{"event": "failure", "ts": 6',
        json.dumps({"event": "gpu_reset", "ts": 3.0}),                   # a kind of a newer launcher
        json.dumps({"event": "gpu_reset", "ts": 3.5}),
        json.dumps({**good[1], "schema": SCHEMA_VERSION + 1}),           # a newer schema
        json.dumps({"event": "result", "ts": 4.0, "exit_code": 1}),      # no outcome
        json.dumps({"event": "result", "outcome": "failed"}),            # no time stamp
        "[1, 2]",
        json.dumps(good[1]),
    ]
    path = tmp_path / "ft_events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    skipped: collections.Counter = collections.Counter()
    with caplog.at_level(logging.WARNING, logger="launcher.events.records"):
        found = list(read_events(path, skipped))
    assert [type(r) for r in found] == [LauncherStart, CycleStart]
    assert sum(skipped.values()) == 8
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(skipped) == 6, warnings
    assert any("unknown record kind 'gpu_reset'" in w for w in warnings)
    assert any(f"schema version {SCHEMA_VERSION + 1} is newer" in w for w in warnings)
    assert not [r for r in caplog.records if r.exc_info]


_CYCLE = {"event": "cycle_start", "ts": 2.0, "node": "n", "pid": 1, "run_id": "r", "cycle": 0}
ODD_LINES = {  # issue 21 item 12: each is one bad line, never a traceback
    "nested": '{"event": "cycle_start", "ts": 2, "cycle": 0, "ranks": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "ts Infinity": json.dumps({**_CYCLE, "ts": float("inf")}),
    "ts NaN": json.dumps({**_CYCLE, "ts": float("nan")}),
    "ts 1e300": json.dumps({**_CYCLE, "ts": 1e300}),
    "ts negative": json.dumps({**_CYCLE, "ts": -5}),
    "ts a bool": json.dumps({**_CYCLE, "ts": True}),
    "detected_at 1e300": json.dumps({"event": "failure", "ts": 3.0, "node": "n", "run_id": "r", "cycle": 0,
                                     "cause": "exit code 1", "cause_kind": "exit", "detected_at": 1e300}),
    "cycle 1.5": json.dumps({**_CYCLE, "cycle": 1.5}),
    "cycle of a failure 0.5": json.dumps({"event": "failure", "ts": 3.0, "node": "n", "run_id": "r", "cycle": 0.5,
                                          "cause": "x", "cause_kind": "exit"}),
    "cycle of workers_ready a string": json.dumps({"event": "workers_ready", "ts": 3.0, "node": "n", "cycle": "0"}),
    "pid 2.5": json.dumps({**_CYCLE, "pid": 2.5}),
    "pid a string": json.dumps({**_CYCLE, "pid": "1"}),
    "node a list": json.dumps({**_CYCLE, "node": ["n"]}),
    "run_id a dict": json.dumps({**_CYCLE, "run_id": {"a": 1}}),
}


@pytest.mark.parametrize("name", sorted(ODD_LINES))
def test_an_odd_line_is_one_skipped_record_with_its_reason(name, tmp_path):
    path = tmp_path / "ft_events.jsonl"
    path.write_text(json.dumps(_CYCLE) + "\n" + ODD_LINES[name] + "\n")
    skipped: collections.Counter = collections.Counter()
    assert list(read_events(path, skipped)) == [CycleStart(**{k: v for k, v in _CYCLE.items() if k != "event"})]
    [(reason, count)] = skipped.items()
    assert count == 1 and ("nested too deeply" in reason or "malformed" in reason), reason


def test_the_envelope_may_be_null_or_absent():
    record, reason = records.parse({"event": "cycle_start", "ts": 0, "cycle": 0, "node": None, "pid": None})
    assert reason == "" and record.node is None and record.ts == 0.0


@pytest.mark.parametrize("found, text", [((True, False), "yes (flag file present: /f)"),
                                         ((False, False), "no (no flag file at /f)"),
                                         ((None, None), "-")])
def test_ft_report_finished_from_the_launchers_flag_file(tmp_path, found, text):
    # without history.tsv: finished when the last launcher of any node found the flag file
    from launcher.events import report

    lines = []
    for node, finished in zip(("a", "b"), found, strict=True):
        flag = "/f" if finished is not None else None
        lines.append(Result(ts=5.0, node=node, pid=1, run_id=node, outcome="succeeded", finished_flag_file=flag,
                            finished=finished).to_wire())
    path = tmp_path / "ft_events.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    values = report.figures(report.load(path))
    assert f"finished: {text}" in report.figure_lines(values)[0]


def test_ft_report_counts_what_it_skipped(tmp_path):
    from launcher.events import report

    path = tmp_path / "ft_events.jsonl"
    path.write_text(json.dumps(CycleStart(ts=2.0, node="n", pid=1, cycle=0).to_wire()) + "\n"
                    + json.dumps({"event": "gpu_reset", "ts": 3.0}) + "\n")
    loaded = report.load(path)
    assert loaded.skipped_lines == 1 and len(loaded.runs) == 1


def test_the_docs_schema_table_is_generated_from_the_classes():
    text = (REPO / "docs" / "launcher.md").read_text()
    assert TABLE_BEGIN in text and TABLE_END in text
    table = text[text.index(TABLE_BEGIN) + len(TABLE_BEGIN):text.index(TABLE_END)]
    assert table == schema_table(), "docs/launcher.md's records table differs from launcher.records.schema_table()"
    for kind in KINDS:
        assert f"| `{kind}` |" in table


def test_every_kind_has_a_base_envelope():
    for cls in KINDS.values():
        assert issubclass(cls, EventRecord) and cls.EVENT
        assert {"time", "ts", "node", "pid", "run_id"} <= {f.name for f in dataclasses.fields(cls)}


# ---------------------------------------------------------------------- monitor messages


@pytest.mark.parametrize("kind", sorted(messages.MESSAGES))
def test_every_message_round_trips(kind):
    cls = messages.MESSAGES[kind]
    message = cls(**required(cls))
    wire = json.loads(json.dumps(message.to_wire()))
    assert wire["type"] == kind and wire["schema"] == messages.SCHEMA_VERSION
    assert messages.decode(wire) == message


def test_a_hang_report_keeps_its_wire_keys_and_reads_as_typed_fields():
    hang = messages.RankHang(pid=5, rank=1, local_rank=1, node="n", kind="section", section="step", elapsed=3.0,
                             timeout=2.0, cause="hang: section 'step'", signal="SIGKILL", detected_at=9.0,
                             heartbeats=4, progress=messages.Progress(step=12, last_progress_at=6.0))
    hang = messages.with_stacks(hang, messages.StackSummary(stack_frames=["/job/train.py:3 f"], stack_file="/s"))
    wire = hang.to_wire()
    for key in ("pid", "rank", "local_rank", "node", "kind", "section", "elapsed", "timeout", "cause", "signal",
                "detected_at", "heartbeats", "progress", "stack_file", "stack_frames", "stack_error"):
        assert key in wire, key
    assert "world_size" not in wire and "hostname" not in wire  # what the rank did not say is left out
    decoded = messages.decode(wire)
    assert decoded.progress.step == 12 and decoded.stacks.stack_frames == ["/job/train.py:3 f"]
    assert isinstance(decoded, messages.RankHang) and decoded.TYPE == "rank_hang" and decoded.pid == 5
    assert not hasattr(decoded, "get")  # read as attributes, not as a mapping


def test_an_older_monitors_hang_report_decodes_and_a_broken_one_is_refused():
    older = {"type": "rank_hang", "pid": 5, "kind": "heartbeat", "elapsed": 2, "timeout": 1, "cause": "c",
             "signal": "SIGKILL", "detected_at": 9}
    decoded = messages.decode(older)
    assert decoded.progress is None and decoded.stacks is None and decoded.elapsed == 2.0
    with pytest.raises(MalformedError):
        messages.decode({**older, "pid": "5"})
    with pytest.raises(messages.UnknownMessageError):
        messages.decode({"type": "rank_reborn"})


def test_the_link_decodes_typed_messages_and_skips_unknown_ones_with_one_warning(tmp_path, caplog):
    import socket
    import threading
    import time

    from ft_core.monitor.link import MonitorLink
    from ft_core.wire import protocol

    path = str(tmp_path / "monitor.sock")
    listener = protocol.listen_unix(path, 1)
    listener.settimeout(10)  # blocking, bounded: the link connects once the thread waits
    served: list[dict] = []

    def fake_monitor() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn:
            served.append(protocol.recv_message(conn, 10))
            protocol.send_message(conn, messages.Ok().to_wire())
            for _ in range(2):  # a newer monitor's message, twice
                protocol.send_message(conn, {"type": "rank_reborn", "pid": 5})
            protocol.send_message(conn, {"type": "rank_hang", "pid": "not a pid"})  # malformed
            protocol.send_message(conn, messages.RankConnected(pid=5, rank=0).to_wire())
            protocol.send_message(conn, messages.Pong().to_wire())
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1)  # until the link closes

    thread = threading.Thread(target=fake_monitor, daemon=True)
    thread.start()
    link = MonitorLink(path)
    try:
        assert served == [messages.LauncherHello().to_wire()]
        got: list[messages.Message] = []
        deadline = time.monotonic() + 10
        with caplog.at_level(logging.WARNING, logger="ft_core.monitor.link"):
            while not link.lost and time.monotonic() < deadline:
                got.extend(link.poll_messages())
                time.sleep(0.01)
        assert got == [messages.RankConnected(pid=5, rank=0), messages.Pong()]
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2 and "rank_reborn" in warnings[0] and "RankHang" in warnings[1], warnings
    finally:
        link.close()
        listener.close()
        thread.join(10)


def test_the_root_nodes_of_one_launchers_last_cycle_read_back_from_its_log(tmp_path):
    # what the auto-resume loop learns from the shared log: read_events, one run id, then the rule
    path = tmp_path / "ft_events.jsonl"
    log = EventLog(str(path), node="here", stream=io.StringIO(), run_id="r1")
    try:
        log.record_event(CycleStart(cycle=0))
        log.record_event(Failure(cycle=0, cause="hang: x", cause_kind="hang", role="collateral", root_node="node2"))
        log.record_event(Failure(cycle=0, cause="signal SIGKILL", cause_kind="signal", role="root"))
    finally:
        log.close()
    mine = [r for r in read_events(path) if r.run_id == "r1" and r.node == "here"]
    assert records.last_cycle_root_nodes(mine) == log.last_cycle_root_nodes() == ["node2", "here"]


def test_the_records_module_names_the_failure_kinds_as_launcher_failures_does():
    # launcher.events.records imports no torch, so it spells these out; they must agree
    from launcher.decision import failures

    assert records.ROOT_CAUSE_KINDS == {failures.KIND_HANG, failures.KIND_EXIT, failures.KIND_SIGNAL}
    assert records.CAUSE_TERMINATED == failures.KIND_TERMINATED
