"""What the launcher tells scripts/autoresume.sh: its exit and the nodes that caused it."""

from __future__ import annotations

import io

from launcher.attempt_result import check_result_path, write_result
from launcher.events.log import EventLog
from launcher.events.records import CycleStart, Failure


def log_with(*cycles: list[dict]) -> EventLog:
    log = EventLog(None, node="here", stream=io.StringIO())
    for number, failures in enumerate(cycles):
        log.record_event(CycleStart(cycle=number))
        for failure in failures:
            log.record_event(Failure(cycle=number, cause="exit code 1", **failure))
    return log


def test_a_root_names_its_own_node_and_a_collateral_rank_names_the_roots():
    log = log_with([{"role": "collateral", "cause_kind": "hang", "root_node": "node2"},
                    {"role": "root", "cause_kind": "signal"},
                    {"role": "collateral", "cause_kind": "terminated", "root_node": "node2"}])
    assert log.last_cycle_root_nodes() == ["node2", "here"]


def test_only_the_last_cycle_counts_an_earlier_failure_was_recovered_from():
    log = log_with([{"role": "root", "cause_kind": "hang"}], [])
    assert log.last_cycle_root_nodes() == []
    log = log_with([{"role": "root", "cause_kind": "hang"}],
                   [{"role": "collateral", "cause_kind": "hang", "root_node": "node3"}])
    assert log.last_cycle_root_nodes() == ["node3"]


def test_no_node_is_blamed_when_torch_named_no_worker_or_the_root_is_unknown():
    log = log_with([{"role": "root", "cause_kind": "unhealthy"},
                    {"role": "collateral", "cause_kind": "hang", "root_node": None}])
    assert log.last_cycle_root_nodes() == []
    assert EventLog(None, node="here", stream=io.StringIO()).last_cycle_root_nodes() == []


def test_the_file_is_key_value_lines_and_holds_only_host_names(tmp_path):
    path = tmp_path / "result"
    assert write_result(str(path), 1, "failed\nagain", ["node2", "bad name;rm -rf /", "n-3.cluster", ""])
    assert path.read_text() == ("exit_code=1\noutcome=failed again\nroot_nodes=node2,n-3.cluster\nlost_nodes=\n"
                                "fingerprint=\nfingerprint_text=\n")
    assert write_result(str(path), 0, "succeeded", [])
    assert path.read_text() == ("exit_code=0\noutcome=succeeded\nroot_nodes=\nlost_nodes=\n"
                                "fingerprint=\nfingerprint_text=\n")


def test_the_fingerprint_is_one_printable_line(tmp_path):
    path = tmp_path / "result"
    assert write_result(str(path), 66, "repeated_failure", ["node2"],
                        ("0123456789ab", "crash: ValueError: bad\nshard\x1b[31m N at train.py step"))
    lines = path.read_text().splitlines()
    assert lines[-2:] == ["fingerprint=0123456789ab",
                          "fingerprint_text=crash: ValueError: bad shard [31m N at train.py step"]


def test_an_unwritable_result_file_is_a_warning_not_a_crash(tmp_path, caplog):
    assert not write_result(str(tmp_path / "gone" / "result"), 1, "failed", ["n"])
    assert "cannot write the result file" in caplog.text


def test_the_path_must_be_absolute_in_an_existing_directory(tmp_path):
    assert check_result_path(str(tmp_path / "r")) is None
    assert check_result_path("relative/r") == "must be an absolute path, got 'relative/r'"
    assert "existing directory" in check_result_path(str(tmp_path / "missing" / "r"))
