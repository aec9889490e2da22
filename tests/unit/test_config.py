"""FaultToleranceConfig: defaults, kwargs, YAML, CLI strings, and every kind of bad input."""

import logging
import os
import signal
import stat

import pytest

from ft_core import ConfigError, FaultToleranceConfig
from ft_core.config import parse_cli_value


def test_defaults_match_the_documented_values():
    cfg = FaultToleranceConfig()
    assert cfg.initial_rank_heartbeat_timeout == 3600.0
    assert cfg.rank_heartbeat_timeout == 2700.0
    assert cfg.rank_section_timeouts == {}
    assert cfg.rank_out_of_section_timeout is None
    assert cfg.safety_factor == 5.0
    assert cfg.rank_termination_signal is signal.SIGKILL
    assert cfg.log_level == logging.INFO
    assert cfg.workload_check_interval == 5.0
    assert cfg.restart_policy == "any-failed"


def test_from_kwargs_parses_strings_like_the_cli():
    cfg = FaultToleranceConfig.from_kwargs(
        initial_rank_heartbeat_timeout="null",
        rank_heartbeat_timeout=30,
        rank_section_timeouts="setup:600,step:180,checkpointing:null",
        rank_termination_signal="SIGTERM",
        log_level="DEBUG",
    )
    assert cfg.initial_rank_heartbeat_timeout is None
    assert cfg.rank_heartbeat_timeout == 30.0
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0, "checkpointing": None}
    assert cfg.rank_termination_signal is signal.SIGTERM
    assert cfg.log_level == logging.DEBUG


def test_from_kwargs_ignores_unknown_keys_by_default_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timeout=10, no_such_key=1)
    assert cfg.rank_heartbeat_timeout == 10.0
    assert "no_such_key" in caplog.text


def test_from_kwargs_strict_rejects_unknown_keys_naming_them():
    with pytest.raises(ConfigError, match="no_such_key"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, no_such_key=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("null", None), ("None", None), ("", None), ("  NULL ", None), ("12.5", 12.5), ("7", 7.0)],
)
def test_cli_timeout_values(text, expected):
    assert parse_cli_value("rank_heartbeat_timeout", text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("SIGTERM", signal.SIGTERM), ("TERM", signal.SIGTERM), ("15", signal.SIGTERM),
     ("sigkill", signal.SIGKILL), ("9", signal.SIGKILL)],
)
def test_cli_signal_values(text, expected):
    assert parse_cli_value("rank_termination_signal", text) is expected


@pytest.mark.parametrize(("text", "expected"), [("DEBUG", 10), ("warning", 30), ("20", 20)])
def test_cli_log_levels(text, expected):
    assert parse_cli_value("log_level", text) == expected


def test_cli_section_list():
    assert parse_cli_value("rank_section_timeouts", "setup:600, step : 180") == {
        "setup": 600.0, "step": 180.0,
    }
    assert parse_cli_value("rank_section_timeouts", "") == {}


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("rank_heartbeat_timeout", -1, "rank_heartbeat_timeout"),
        ("rank_heartbeat_timeout", 0, "positive"),
        ("initial_rank_heartbeat_timeout", "abc", "'abc'"),
        ("rank_heartbeat_timeout", True, "True"),
        ("rank_heartbeat_timeout", float("nan"), "positive"),
        ("rank_out_of_section_timeout", "-5", "'-5'"),
        ("rank_section_timeouts", "setup600", "setup600"),
        ("rank_section_timeouts", "setup:600,:10", "malformed"),
        ("rank_section_timeouts", "step:1,step:2", "twice"),
        ("rank_section_timeouts", "step:-3", "step"),
        ("rank_section_timeouts", 12, "12"),
        ("rank_termination_signal", "SIGNOPE", "SIGNOPE"),
        ("rank_termination_signal", 999, "999"),
        ("log_level", "LOUD", "LOUD"),
        ("safety_factor", 0.5, ">= 1.0"),
        ("workload_check_interval", 0, "workload_check_interval"),
        ("restart_policy", "sometimes", "sometimes"),
    ],
)
def test_bad_values_raise_value_error_naming_field_and_value(field, value, fragment):
    with pytest.raises(ValueError) as info:
        FaultToleranceConfig.from_kwargs(**{field: value})
    message = str(info.value)
    assert fragment in message
    assert field.split("[")[0] in message or field == "rank_section_timeouts"


def test_unknown_field_in_cli_parser_lists_valid_fields():
    with pytest.raises(ConfigError, match="rank_heartbeat_timeout"):
        parse_cli_value("rank_hearbeat_timeout", "10")


def test_yaml_top_level_section(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text(
        "fault_tolerance:\n"
        "  initial_rank_heartbeat_timeout: null\n"
        "  rank_heartbeat_timeout: null\n"
        "  log_level: DEBUG\n"
    )
    cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.initial_rank_heartbeat_timeout is None
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.log_level == logging.DEBUG


def test_yaml_nested_section_is_found(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(
        "model:\n  layers: 3\n"
        "trainer:\n"
        "  exp_manager:\n"
        "    fault_tolerance:\n"
        "      rank_section_timeouts: {setup: 600, step: 180}\n"
        "      rank_out_of_section_timeout: 300\n"
        "      rank_termination_signal: SIGTERM\n"
    )
    cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0}
    assert cfg.rank_out_of_section_timeout == 300.0
    assert cfg.rank_termination_signal is signal.SIGTERM


def test_yaml_round_trip_gives_an_equal_config(tmp_path):
    cfg = FaultToleranceConfig(
        initial_rank_heartbeat_timeout=None,
        rank_heartbeat_timeout=12.5,
        rank_section_timeouts={"setup": 600.0, "step": None},
        rank_out_of_section_timeout=300.0,
        safety_factor=3.0,
        rank_termination_signal=signal.SIGTERM,
        log_level=logging.DEBUG,
        restart_policy="min-healthy",
    )
    path = tmp_path / "out.yaml"
    cfg.to_yaml_file(path)
    assert FaultToleranceConfig.from_yaml_file(path) == cfg
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_yaml_without_section_is_a_clear_error(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text("model:\n  layers: 3\n")
    with pytest.raises(ConfigError, match="no 'fault_tolerance' section"):
        FaultToleranceConfig.from_yaml_file(path)


def test_yaml_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read .*missing.yaml"):
        FaultToleranceConfig.from_yaml_file(tmp_path / "missing.yaml")


def test_yaml_syntax_error_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("fault_tolerance: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        FaultToleranceConfig.from_yaml_file(path)


def test_yaml_wrong_type_names_file_and_field(tmp_path):
    path = tmp_path / "types.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: [1, 2]\n")
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_yaml_file(path)
    assert "types.yaml" in str(info.value) and "rank_heartbeat_timeout" in str(info.value)


def test_yaml_section_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "scalar.yaml"
    path.write_text("fault_tolerance: 5\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        FaultToleranceConfig.from_yaml_file(path)


def test_dict_round_trip_is_json_safe():
    import json

    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 3.0}, rank_termination_signal=15)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["rank_termination_signal"] == "SIGTERM"
    assert FaultToleranceConfig.from_dict(data) == cfg
