"""RankMonitorClient on top of TimeoutsCalc, against a real rank monitor (this process is the rank).

What the client adds to the calculator: its bounds on calculated timeouts, the running
out-of-section interval counted at calculation time, the section calls' errors, and state files.
"""

from __future__ import annotations

import logging
import time

import pytest

from ft_core import FaultToleranceConfig, RankMonitorClient, RankMonitorClientError
from ft_core.wire.config import MIN_CALCULATED_DEFAULTS
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

SECTIONS = {"setup": 600.0, "step": 600.0}
# Small minimums of calculated timeouts, so that the tests below see the calculation itself.
MIN_INITIAL, MIN_HEARTBEAT, MIN_SECTION, MIN_OUT_OF_SECTION = 10.0, 1.0, 1.0, 1.0
MINIMUMS = dict(min_calculated_initial_heartbeat_timeout=MIN_INITIAL, min_calculated_heartbeat_timeout=MIN_HEARTBEAT,
                min_calculated_section_timeout=MIN_SECTION,
                min_calculated_out_of_section_timeout=MIN_OUT_OF_SECTION)


@pytest.fixture
def client(start_monitor, monkeypatch, harmless_termination):
    # The rank is this test process: calculated timeouts of 1 s could expire in a stall, so a
    # detected "hang" only sends a signal this process ignores.
    _, path = start_monitor(FaultToleranceConfig(rank_section_timeouts=SECTIONS, rank_out_of_section_timeout=900,
                                                 safety_factor=5.0, **harmless_termination, **MINIMUMS))
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    yield client
    client.shutdown_workload_monitoring()


def test_calculated_heartbeat_timeouts_are_bounded_then_merged(client):
    for _ in range(3):
        client.send_heartbeat()  # microseconds apart: 5 x that is far below the bounds
    assert client.calculate_and_set_hb_timeouts()
    hb = client.hb_timeouts
    assert (hb.initial, hb.subsequent, hb.were_calculated) == (MIN_INITIAL, MIN_HEARTBEAT, True)
    # merged with the current (calculated) values: about (10 + 0) / 2 and (1 + 0) / 2, so bounded
    # again
    assert client.calculate_and_set_hb_timeouts()
    assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (10.0, 1.0)


def test_loaded_calculated_timeouts_are_averaged_with_new_ones(client):
    client.load_state_dict({"version": 1,
                            "hb_timeouts": {"initial": 60.0, "subsequent": 30.0, "were_calculated": True}})
    client.send_heartbeat()
    client.send_heartbeat()
    assert client.calculate_and_set_hb_timeouts()
    # EMA, alpha 0.5: (60 + 5 x initial) / 2 and (30 + 5 x subsequent) / 2, with both intervals
    # far below a second (bounds generous for a busy machine)
    assert 30.0 <= client.hb_timeouts.initial < 32.5
    assert 15.0 <= client.hb_timeouts.subsequent < 17.5


def test_the_running_out_of_section_interval_counts_at_calculation(client):
    client.start_section("step")
    before_close = time.monotonic()
    client.end_section("step")
    time.sleep(0.4)  # out of section: the interval the calculation must count
    assert client.calculate_and_set_section_timeouts(["step"], calc_out_of_section=True)
    timeouts = client.section_timeouts
    waited = time.monotonic() - before_close
    assert 5 * 0.4 <= timeouts.out_of_section <= 5 * waited  # not the bound (1 s): the running interval
    assert timeouts.section == {"setup": 600.0, "step": MIN_SECTION}
    assert timeouts.calculated_sections == {"step"} and timeouts.is_out_of_section_calculated


def test_end_all_sections_closes_and_records_every_open_section(client):
    client.start_section("setup")
    client.start_section("step")
    assert client.open_sections == ("setup", "step")
    slot = client._slot  # the memory the monitor reads; sections in sorted order: setup, step
    assert slot.section_open_since(0) > 0 and slot.section_open_since(1) > 0
    assert slot.out_of_section_since() == 0.0
    client.end_all_sections()
    assert client.open_sections == ()
    assert slot.section_open_since(0) == slot.section_open_since(1) == 0.0
    assert slot.out_of_section_since() > 0.0
    client.end_all_sections()  # nothing open: nothing to do
    # both durations were recorded: both can be calculated
    assert client.calculate_and_set_section_timeouts(calc_out_of_section=False)
    assert client.section_timeouts.calculated_sections == {"setup", "step"}
    client.start_section("step")  # and the step can be opened again
    assert client.open_sections == ("step",)


def test_section_misuse_is_refused_and_changes_nothing(client):
    client.start_section("step")
    with pytest.raises(RankMonitorClientError, match="section 'step' is already open"):
        client.start_section("step")
    assert client.open_sections == ("step",)
    with pytest.raises(RankMonitorClientError, match=r"end_section\('setup'\) without a matching start_section"):
        client.end_section("setup")
    with pytest.raises(RankMonitorClientError, match="'nope' is not configured"):
        client.end_section("nope")
    with pytest.raises(RankMonitorClientError, match="cannot calculate section timeouts yet: .*setup"):
        client.calculate_and_set_section_timeouts(["setup"], calc_out_of_section=False)
    assert client.calculate_and_set_section_timeouts(["setup"], False, skip_if_not_ready=True) is False
    with pytest.raises(RankMonitorClientError, match="list of section names"):
        client.calculate_and_set_section_timeouts("step")
    client.shutdown_workload_monitoring()
    assert client.open_sections == ()
    with pytest.raises(RankMonitorClientError, match="not initialised"):
        client.end_section("step")


def test_a_state_written_by_the_earlier_code_loads(client):
    # the exact shape state_dict() wrote before the calculator had the reference's API
    client.load_state_dict({
        "version": 1,
        "hb_timeouts": {"initial": 40.0, "subsequent": 8.0, "were_calculated": True},
        "section_timeouts": {"section": {"setup": 70.0, "step": 9.5}, "out_of_section": 33.0,
                             "calculated_sections": ["step"], "is_out_of_section_calculated": True},
    })
    assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (40.0, 8.0)
    sections = client.section_timeouts
    assert sections.section == {"setup": 600.0, "step": 9.5}  # setup was not calculated: configured value
    assert sections.out_of_section == 33.0 and sections.calculated_sections == {"step"}
    state = client.state_dict()
    assert state["section_timeouts"]["calculated_sections"] == ["step"]
    RankMonitorClient().load_state_dict(state)  # what it writes, it reads (raises otherwise)


def test_a_state_saved_by_the_reference_client_loads(client):
    # the reference's state_dict(): dataclasses.asdict of its timeouts under "current_timeouts"
    client.load_state_dict({"current_timeouts": {
        "heartbeat": {"initial": 50.0, "subsequent": 6.0, "were_calculated": True},
        "section": {"section": {"setup": 80.0, "step": 7.0}, "out_of_section": 20.0,
                    "calculated_sections": ["setup", "step"], "is_out_of_section_calculated": True},
    }})
    assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (50.0, 6.0)
    assert client.section_timeouts.section == {"setup": 80.0, "step": 7.0}
    assert client.section_timeouts.were_calculated
    client.load_state_dict({"current_timeouts": {}})  # the reference's state before any calculation
    assert client.hb_timeouts.initial == 50.0


@pytest.mark.parametrize(("state", "fragment"), [
    ({"current_timeouts": [1]}, "current_timeouts must be a mapping"),
    ({"current_timeouts": {}, "hb_timeouts": {}}, "no other key"),
    ({"current_timeouts": {"heartbeat": {"initial": "5"}}}, "hb_timeouts.initial"),
])
def test_a_malformed_reference_state_is_refused(client, state, fragment):
    before = client.state_dict()
    with pytest.raises(RankMonitorClientError, match="invalid fault tolerance state") as info:
        client.load_state_dict(state)
    assert fragment in str(info.value)
    assert client.state_dict() == before


# ---------------------------------------------------------------------- minimums and the log


def connect(start_monitor, monkeypatch, harmless_termination, **cfg) -> RankMonitorClient:
    _, path = start_monitor(FaultToleranceConfig(**{**harmless_termination, **cfg}), name="d")
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    return client


def in_force_lines(caplog, level: str = "INFO") -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ft_core.client.rank_monitor_client" and r.levelname == level
            and r.getMessage().startswith(("heartbeat timeouts in force", "section timeouts in force"))]


def test_tiny_calculated_timeouts_are_raised_to_the_default_minimums_and_the_log_says_so(
        start_monitor, monkeypatch, caplog, harmless_termination):
    client = connect(start_monitor, monkeypatch, harmless_termination,
                     rank_section_timeouts={"setup": 600.0, "step": 30.0},
                     rank_out_of_section_timeout=900.0, log_level="DEBUG")
    try:
        for _ in range(3):
            client.send_heartbeat()  # microseconds apart
        client.start_section("step")
        client.end_section("step")
        assert client.calculate_and_set_hb_timeouts()
        assert client.calculate_and_set_section_timeouts(["step"], calc_out_of_section=False)
        hb, sections = client.hb_timeouts, client.section_timeouts
        assert (hb.initial, hb.subsequent) == (MIN_CALCULATED_DEFAULTS["initial_heartbeat"],
                                               MIN_CALCULATED_DEFAULTS["heartbeat"])
        assert sections.section == {"setup": 600.0, "step": MIN_CALCULATED_DEFAULTS["section"]}
        assert sections.out_of_section == 900.0  # configured: never bounded
        assert client.state_dict()["section_timeouts"]["section"]["step"] == 60.0  # what is saved is enforced
        hb_line, section_line = in_force_lines(caplog)[-2:]
        assert "initial 600 s (calculated" in hb_line and "raised to the minimum 600 s" in hb_line
        assert "between heartbeats 120 s (calculated" in hb_line
        assert "step 60.0 s (calculated" in section_line and "raised to the minimum 60.0 s" in section_line
        # a configured value is never called calculated
        assert "setup 600 s (configured)" in section_line and "out-of-section 900 s (configured)" in section_line
    finally:
        client.shutdown_workload_monitoring()


def test_minimums_are_config_fields_and_apply_to_restored_timeouts(
        start_monitor, monkeypatch, caplog, harmless_termination):
    client = connect(start_monitor, monkeypatch, harmless_termination,
                     rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=900,
                     min_calculated_heartbeat_timeout=45, min_calculated_initial_heartbeat_timeout=200,
                     min_calculated_section_timeout=7, min_calculated_out_of_section_timeout=11)
    try:
        # a state file written with the old 1 s floor (or by a run with other minimums)
        client.load_state_dict({"version": 1,
                                "hb_timeouts": {"initial": 10.0, "subsequent": 1.0, "were_calculated": True},
                                "section_timeouts": {"section": {"step": 1.0}, "out_of_section": 1.0,
                                                     "calculated_sections": ["step"],
                                                     "is_out_of_section_calculated": True}})
        assert (client.hb_timeouts.initial, client.hb_timeouts.subsequent) == (200.0, 45.0)
        assert client.section_timeouts.section == {"step": 7.0} and client.section_timeouts.out_of_section == 11.0
        hb_line, section_line = in_force_lines(caplog)[-2:]
        assert "(restored)" in hb_line and "calculated 1.00 s, raised to the minimum 45.0 s" in hb_line
        # the calculated value replaces the configured one, and says so (issue 29.4)
        assert ("step 7.00 s (calculated 1.00 s, raised to the minimum 7.00 s of min_calculated_section_timeout; "
                "replaces the configured 30.0 s)" in section_line)
    finally:
        client.shutdown_workload_monitoring()


def test_timeouts_are_logged_when_they_change_not_after_every_calculation(
        start_monitor, monkeypatch, caplog, harmless_termination):
    client = connect(start_monitor, monkeypatch, harmless_termination,
                     rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=900,
                     log_level="DEBUG")
    try:
        client.start_section("step")
        client.end_section("step")
        for _ in range(3):  # the same (raised) result three times: one INFO line
            assert client.calculate_and_set_section_timeouts(["step"], calc_out_of_section=False)
        assert len(in_force_lines(caplog)) == 1
        assert len([r for r in caplog.records if "no significant change" in r.getMessage()]) == 2
    finally:
        client.shutdown_workload_monitoring()


def test_log_level_of_the_config_applies_to_the_client(
        start_monitor, monkeypatch, caplog, harmless_termination):
    client = connect(start_monitor, monkeypatch, harmless_termination,
                     rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=900,
                     log_level="WARNING")
    try:
        client.start_section("step")
        client.end_section("step")
        assert client.calculate_and_set_section_timeouts(["step"], calc_out_of_section=False)
        assert client.cfg.log_level == logging.WARNING
        assert not [r for r in caplog.records if r.name.startswith("ft_core") and r.levelno < logging.WARNING]
    finally:
        client.shutdown_workload_monitoring()
