"""failure_records: torch's failures + monitor hang reports -> records, root causes first.

The inputs are torch's real ``ProcessFailure`` objects (as torch builds them from a worker's exit
code and error file); no agent is needed.
"""

from __future__ import annotations

import io
import json
import signal

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ft_core.monitor.deadlines import HangKind
from ft_core.wire.messages import RankHang
from launcher.decision.failures import (
    KIND_UNHEALTHY,
    FailureRecord,
    HangDetail,
    exit_text,
    failure_records,
    group_unhealthy_record,
    worker_error,
)
from launcher.events.log import EventLog

NOW = 1_700_000_000.0


def failure(local_rank: int, exitcode: int, pid: int | None = None, error_file: str = "<N/A>") -> ProcessFailure:
    return ProcessFailure(local_rank=local_rank, pid=pid or 1000 + local_rank, exitcode=exitcode, error_file=error_file)


def hang(cause: str = "hang: no heartbeat for 2.00 s > timeout 1.00 s", at: float = NOW - 5) -> RankHang:
    return RankHang(pid=1001, cause=cause, kind="heartbeat", section=None, elapsed=2.0, timeout=1.0, signal="SIGKILL",
                    detected_at=at)


def summary(records) -> list[tuple]:
    return [(r.rank, r.local_rank, r.kind, r.cause) for r in records]


CASES = [
    pytest.param(
        {0: failure(0, 1)}, {}, set(),
        [(0, 0, "exit", "exit code 1")], id="one-exit"),
    pytest.param(
        {0: failure(0, -signal.SIGSEGV)}, {}, set(),
        [(0, 0, "signal", "signal SIGSEGV")], id="one-signal"),
    pytest.param(
        # rank 1 hung and was killed by its monitor; torch then SIGTERMed rank 0
        {0: failure(0, -signal.SIGTERM), 1: failure(1, -signal.SIGKILL)}, {1: hang()}, set(),
        [(1, 1, "hang", hang().cause), (0, 0, "terminated", "stopped after another worker failed (signal SIGTERM)")],
        id="hang-first-sigterm-is-a-consequence"),
    pytest.param(
        # rank 1 crashed; the launcher stopped rank 0 itself (its pid is in stopped_by_us)
        {0: failure(0, -signal.SIGKILL), 1: failure(1, 3)}, {}, {1000},
        [(1, 1, "exit", "exit code 3"), (0, 0, "terminated", "stopped after another worker failed (signal SIGKILL)")],
        id="stopped-by-us"),
    pytest.param(
        # only SIGTERMs: nobody else caused them, so each is its own root cause
        {0: failure(0, -signal.SIGTERM), 1: failure(1, -signal.SIGTERM)}, {}, set(),
        [(0, 0, "signal", "signal SIGTERM"), (1, 1, "signal", "signal SIGTERM")],
        id="sigterm-alone-is-a-cause"),
    pytest.param(
        # two hangs: the earlier detection first
        {0: failure(0, -9), 1: failure(1, -9)}, {0: hang("late", NOW - 1), 1: hang("early", NOW - 2)}, set(),
        [(1, 1, "hang", "early"), (0, 0, "hang", "late")], id="hangs-by-detection-time"),
    pytest.param(
        {0: failure(0, -200)}, {}, set(), [(0, 0, "signal", "signal 200")], id="unknown-signal-number"),
]


@pytest.mark.parametrize(("failures", "hangs", "stopped", "expected"), CASES)
def test_records_root_causes_first(failures, hangs, stopped, expected):
    records = failure_records(failures, local_ranks={g: f.local_rank for g, f in failures.items()},
                              hangs=hangs, stopped_by_us=stopped, cycle=3, now=NOW)
    assert summary(records) == expected
    assert all(r.cycle == 3 for r in records)


def test_hang_details_and_detection_time_come_from_the_monitor():
    [record] = failure_records({5: failure(1, -9, pid=77)}, local_ranks={5: 1}, hangs={1: hang()},
                               stopped_by_us=set(), cycle=0, now=NOW)
    assert (record.rank, record.local_rank, record.pid, record.detected_at) == (5, 1, 77, NOW - 5)
    assert record.exit_code == -9 and record.error is None
    assert record.hang == HangDetail(HangKind.HEARTBEAT, None, 2.0, 1.0, "SIGKILL")
    assert record.hang.kind is HangKind.HEARTBEAT


def test_the_event_record_of_a_hang_holds_the_monitors_kind_string(tmp_path):
    [record] = failure_records({5: failure(1, -9, pid=77)}, local_ranks={5: 1}, hangs={1: hang()},
                               stopped_by_us=set(), cycle=0, now=NOW)
    events = EventLog(str(tmp_path / "events.jsonl"), node="n", stream=io.StringIO())
    try:
        events.failure(record, "restarting")
    finally:
        events.close()
    [written] = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert written["hang_kind"] == "heartbeat" and type(events.records[0]["hang_kind"]) is str
    # the hang's details follow the common fields (all of them, the null section too)
    hang_keys = ["exit_code", "hang_kind", "section", "elapsed", "timeout", "signal"]
    assert [key for key in written if key in hang_keys] == hang_keys and list(written)[-1] == "schema"
    # the cycle's fingerprint (launcher.decision.crash_loop) is written with it
    assert record.fingerprint is not None and written["fingerprint"] == record.fingerprint.digest
    assert written["fingerprint_text"].startswith("hang: ")
    assert "hang (heartbeat)" in events.summary()


def test_local_rank_from_the_worker_group_wins_over_torchs():
    # global rank 4 is local rank 0 on this node; the hang report is keyed by local rank
    [record] = failure_records({4: failure(0, -9)}, local_ranks={4: 0}, hangs={0: hang()},
                               stopped_by_us=set(), cycle=0, now=NOW)
    assert (record.rank, record.local_rank, record.kind) == (4, 0, "hang")
    [record] = failure_records({4: failure(2, 1)}, local_ranks={}, hangs={}, stopped_by_us=set(), cycle=0, now=NOW)
    assert record.local_rank == 2 and record.detected_at == NOW


def test_the_workers_own_error_is_recorded(tmp_path):
    error_file = tmp_path / "error.json"
    # what torch's @record writes for an uncaught exception
    error_file.write_text(json.dumps({"message": {"message": "RuntimeError: injected", "extraInfo": {
        "py_callstack": "...", "timestamp": "1700000000"}}}))
    [record] = failure_records({0: failure(0, 1, error_file=str(error_file))}, local_ranks={0: 0}, hangs={},
                               stopped_by_us=set(), cycle=0, now=NOW)
    assert (record.exit_code, record.error, record.hang, record.progress, record.stacks, record.root) == (
        1, "RuntimeError: injected", None, None, None, None)
    assert record.cause == "exit code 1: RuntimeError: injected"  # the failure line carries it
    # without an error file torch makes up a placeholder: not recorded as the worker's error
    [record] = failure_records({0: failure(0, 1)}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=0, now=NOW)
    assert record.error is None
    [record] = failure_records({0: failure(0, -9)}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=0, now=NOW)
    assert record.error is None


def test_worker_error_is_bounded():
    assert worker_error("x" * 5000) == "x" * 1000
    assert worker_error({"message": "boom"}) == "boom"
    assert worker_error(None) == ""


def test_no_failures_gives_no_records_and_the_unhealthy_fallback_names_the_cycle():
    assert failure_records({}, local_ranks={}, hangs={}, stopped_by_us=set(), cycle=0, now=NOW) == []
    record = group_unhealthy_record(4, NOW)
    assert (record.cycle, record.rank, record.kind, record.detected_at) == (4, None, KIND_UNHEALTHY, NOW)


def test_exit_text():
    assert exit_text(0) == "exit code 0"
    assert exit_text(-signal.SIGKILL) == "signal SIGKILL"


def test_a_failure_record_is_typed_through_and_through():
    # No free-form dict between the monitor and the event log (there was a `detail` dict, filled
    # with detail.update(...), spread into the record and read back with .get): every field typed.
    import typing

    hints = typing.get_type_hints(FailureRecord)
    loose = {name: hint for name, hint in hints.items() if "dict" in str(hint) or "Any" in str(hint)}
    assert not loose, loose
