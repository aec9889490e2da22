"""FaultToleranceConfig: defaults, kwargs, YAML, CLI strings, and every kind of bad input."""

import json
import logging
import os
import signal
import stat

import pytest

from ft_core import ConfigError, FaultToleranceConfig
from ft_core.wire import protocol
from ft_core.wire.config import Role, parse_cli_value


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


SECONDS = "> 0 and <= 1e+06 or null (no limit)"


@pytest.mark.parametrize(
    ("field", "value", "fragments"),
    [
        ("rank_heartbeat_timeout", -1, ["-1", SECONDS]),
        ("rank_heartbeat_timeout", 0, ["got 0", SECONDS]),
        ("initial_rank_heartbeat_timeout", "abc", ["'abc'", SECONDS]),
        ("rank_heartbeat_timeout", True, ["True"]),
        ("rank_heartbeat_timeout", float("nan"), ["nan", SECONDS]),
        ("rank_heartbeat_timeout", 1e6 + 1, ["1000001.0", SECONDS]),
        ("rank_heartbeat_timeout", 10**400, ["-bit int", SECONDS]),
        ("rank_out_of_section_timeout", "-5", ["'-5'", SECONDS]),
        ("rank_section_timeouts", "setup600", ["setup600", "malformed"]),
        ("rank_section_timeouts", "setup:600,:10", ["malformed"]),
        ("rank_section_timeouts", "step:1,step:2", ["twice"]),
        ("rank_section_timeouts", "step:-3", ["rank_section_timeouts[step]", "-3", SECONDS]),
        ("rank_section_timeouts", 12, ["12"]),
        ("rank_section_timeouts", {f"s{i}": 1 for i in range(33)}, ["at most 32 sections", "33"]),
        ("rank_section_timeouts", ",".join(f"s{i}:1" for i in range(10**5)), ["at most 32 sections"]),
        ("rank_section_timeouts", {"x" * 65: 1}, ["at most 64 characters", "xxx"]),
        ("rank_termination_signal", "SIGNOPE", ["SIGNOPE"]),
        ("rank_termination_signal", 999, ["999"]),
        ("log_level", "LOUD", ["LOUD"]),
        ("log_level", 51, ["51", "0..50"]),
        ("safety_factor", 0.5, ["0.5", ">= 1 and <= 1e+09"]),
        ("safety_factor", 1e308, ["1e+308", ">= 1 and <= 1e+09"]),
        ("safety_factor", "fast", ["'fast'", ">= 1 and <= 1e+09"]),
        ("workload_check_interval", 0, ["got 0", ">= 0.1 and <= 3600"]),
        ("workload_check_interval", 1e-300, ["1e-300", ">= 0.1 and <= 3600"]),
        ("workload_check_interval", 2e6, ["2000000.0", ">= 0.1 and <= 3600"]),
        ("workload_check_interval", None, ["no null"]),
        ("restart_policy", "sometimes", ["'sometimes'", "any-failed, min-healthy"]),
        ("restart_policy", 3, ["got 3"]),
    ],
)
def test_bad_values_raise_a_config_error_naming_field_value_and_range(field, value, fragments):
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_kwargs(**{field: value})
    message = str(info.value)
    assert message.startswith(field)
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workload_check_interval", 0.1), ("workload_check_interval", 3600),
        ("safety_factor", 1), ("safety_factor", 1e9),
        ("rank_heartbeat_timeout", 1e6), ("rank_heartbeat_timeout", 1e-3),
        ("rank_section_timeouts", {"\N{GRINNING FACE}" * 62 + f"{i:02}": 1e6 for i in range(32)}),
    ],
)
def test_values_at_the_bounds_are_accepted(field, value):
    cfg = FaultToleranceConfig.from_kwargs(**{field: value})
    assert getattr(cfg, field) == value


@pytest.mark.parametrize("field", FaultToleranceConfig.field_names())
def test_every_field_is_declared_once_with_help_bounds_and_users(field):
    spec = FaultToleranceConfig.field_spec(field)
    assert spec.help and spec.accepts and spec.used_by and spec.metavar
    text = FaultToleranceConfig.field_help(field)
    assert spec.help in text and f"Accepted: {spec.accepts}" in text and "Default: " in text
    assert f"{field}: {text}" in FaultToleranceConfig.__doc__


@pytest.mark.parametrize(
    ("field", "text"),
    [("rank_heartbeat_timeout", "-2"), ("workload_check_interval", "1e-300"), ("safety_factor", "inf"),
     ("rank_section_timeouts", "a:0"), ("rank_termination_signal", "NOPE"), ("log_level", "99"),
     ("restart_policy", "never")],
)
def test_the_cli_parser_and_the_constructor_are_the_same_validator(field, text):
    with pytest.raises(ConfigError) as from_cli:
        parse_cli_value(field, text)
    with pytest.raises(ConfigError) as from_constructor:
        FaultToleranceConfig(**{field: text})
    assert str(from_cli.value) == str(from_constructor.value)


def test_monitors_and_ranks_receive_the_whole_config():
    # A rank's cfg is the launcher's, every field of it (a valid config it can save), not only
    # what the rank acts on.
    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 3.0}, restart_policy="min-healthy",
                               rank_termination_signal="SIGTERM", log_level="DEBUG", safety_factor=2,
                               workload_check_interval=7.5)
    rank = cfg.sent_to(Role.RANK)
    assert set(rank) == set(cfg.sent_to(Role.MONITOR)) == set(FaultToleranceConfig.field_names())
    received = FaultToleranceConfig.as_received(json.loads(json.dumps(rank)), Role.RANK)
    assert received == cfg
    on_monitor = FaultToleranceConfig.as_received(cfg.sent_to(Role.MONITOR), Role.MONITOR)
    assert on_monitor.rank_termination_signal is signal.SIGTERM and on_monitor.restart_policy == "min-healthy"
    assert on_monitor.sent_to(Role.RANK) == rank


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"rank_heartbeat_timeout": 5}, "missing: workload_check_interval, initial_rank_heartbeat_timeout"),
        ({k: v for k, v in FaultToleranceConfig().sent_to(Role.RANK).items() if k != "restart_policy"},
         "missing: restart_policy"),
        ({**FaultToleranceConfig().sent_to(Role.RANK), "bogus": 1}, "bogus"),
        ({**FaultToleranceConfig().sent_to(Role.RANK), "safety_factor": 0}, "safety_factor"),
        ([1, 2], "mapping"),
    ],
)
def test_a_received_config_must_hold_exactly_the_fields_sent(data, fragment):
    with pytest.raises(ConfigError, match=fragment):
        FaultToleranceConfig.as_received(data, Role.RANK)


def test_the_largest_section_config_fits_in_one_handshake_message():
    names = [chr(0x1F600 + i) * 64 for i in range(32)]  # 12 bytes each as JSON escapes
    cfg = FaultToleranceConfig(rank_section_timeouts={n: 1.2345678901234567e-05 for n in names})
    reply = {"type": protocol.MSG_INIT_OK, "config": cfg.sent_to(Role.RANK), "sections": sorted(names)}
    assert len(protocol.encode(reply)) <= protocol.MAX_MESSAGE_BYTES


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
