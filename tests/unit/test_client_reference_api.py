"""Details of ``RankMonitorClient``'s API that code written for the reference relies on, against a
real rank monitor (this test process is the rank).

- ``hb_timeouts`` and ``section_timeouts`` are None until ``init_workload_monitoring()`` or
  ``load_state_dict()``;
- ``cfg`` is the whole config the launcher runs with, so that ``cfg.to_yaml_file()`` and
  ``FaultToleranceConfig.from_yaml_file()`` round-trip;
- the "timeouts in force" line of a calculation says what was observed, what was calculated
  and what applies.
"""

from __future__ import annotations

import logging
import signal

from ft_core import FaultToleranceConfig, RankMonitorClient
from ft_core.wire.data import HeartbeatTimeouts
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

SAVED = {"version": 1,
         "hb_timeouts": {"initial": 10.0, "subsequent": 1.0, "were_calculated": True},
         "section_timeouts": {"section": {"step": 2.0}, "out_of_section": 3.0, "calculated_sections": ["step"],
                              "is_out_of_section_calculated": True}}


def start(start_monitor, monkeypatch, cfg: FaultToleranceConfig) -> None:
    _, path = start_monitor(cfg)
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)


def test_timeouts_are_none_until_init_or_load_state_dict(start_monitor, monkeypatch, harmless_termination):
    start(start_monitor, monkeypatch, FaultToleranceConfig(
        rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=900, **harmless_termination))
    fresh = RankMonitorClient()
    assert fresh.hb_timeouts is None and fresh.section_timeouts is None
    fresh.init_workload_monitoring()
    try:
        assert fresh.hb_timeouts == HeartbeatTimeouts(3600.0, 2700.0)  # the configured ones
        assert fresh.section_timeouts.section == {"step": 30.0} and fresh.section_timeouts.out_of_section == 900.0
    finally:
        fresh.shutdown_workload_monitoring()

    loaded = RankMonitorClient()
    loaded.load_state_dict(SAVED)  # before init: shown as saved ...
    assert (loaded.hb_timeouts.initial, loaded.hb_timeouts.subsequent) == (10.0, 1.0)
    assert loaded.section_timeouts.section == {"step": 2.0} and loaded.section_timeouts.out_of_section == 3.0
    loaded.init_workload_monitoring()  # ... applied over the config's at init, and bounded
    try:
        assert (loaded.hb_timeouts.initial, loaded.hb_timeouts.subsequent) == (600.0, 120.0)
        assert loaded.section_timeouts.section == {"step": 60.0} and loaded.section_timeouts.out_of_section == 120.0
    finally:
        loaded.shutdown_workload_monitoring()


def test_a_ranks_cfg_is_the_whole_config_and_round_trips_through_yaml(
        start_monitor, monkeypatch, harmless_termination, tmp_path):
    # Values of fields a rank does not act on, other than their defaults: a rank must see the launcher's.
    cfg = FaultToleranceConfig(workload_check_interval=1.5, restart_policy="min-healthy", stack_capture_budget=0,
                               rank_section_timeouts={"setup": None, "step": 30.0},
                               log_level="WARNING", **harmless_termination)
    start(start_monitor, monkeypatch, cfg)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    try:
        received = client.cfg
        assert received == cfg
        assert received.rank_termination_signal is signal.Signals(cfg.rank_termination_signal)
        path = tmp_path / "saved_ft.yaml"
        received.to_yaml_file(path)
        assert FaultToleranceConfig.from_yaml_file(path) == cfg
    finally:
        client.shutdown_workload_monitoring()


def test_the_in_force_line_says_what_was_observed_calculated_and_applied(
        start_monitor, monkeypatch, harmless_termination, caplog):
    # The default minimums: a tiny calculated step timeout is raised to 60 s. The second
    # calculation averages with the 60 s in force; the line must say so rather than show the mix
    # as "calculated 30 s".
    start(start_monitor, monkeypatch, FaultToleranceConfig(
        rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=900, log_level="DEBUG",
        **harmless_termination))
    caplog.set_level(logging.DEBUG, logger="ft_core.client.rank_monitor_client")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    try:
        lines = []
        for _ in range(2):
            client.start_section("step")
            client.end_section("step")
            assert client.calculate_and_set_section_timeouts(["step"], calc_out_of_section=False)
            lines.append([r.getMessage() for r in caplog.records if "section timeouts" in r.getMessage()
                          and "calculated" in r.getMessage()][-1])
        assert client.section_timeouts.section == {"step": 60.0}
        first, second = lines
        assert first.startswith("section timeouts in force (calculated): step 60.0 s (calculated: longest observed ")
        assert " x safety factor 5 = " in first
        # ... and which configured value it replaces (issue 29.4)
        assert ("raised to the minimum 60.0 s of min_calculated_section_timeout; replaces the configured 30.0 s)"
                in first)
        assert "averaged" not in first
        # merged with the value in force, then raised again: the line shows both steps
        # issue 29 item 10: at DEBUG this line came at every checkpoint on every rank, ~500 characters long
        assert second == "section timeouts calculated: no significant change since the last 'in force' line"
    finally:
        client.shutdown_workload_monitoring()
