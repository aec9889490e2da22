"""Issue 12 section 4: the config from ft_launcher's arguments, and the reference's launcher options.

``FaultToleranceConfig.from_args`` takes ``launcher.get_args_parser()``'s namespace (file, then
``--ft-*`` options winning); an empty file with options runs with the options; a missing file is
an error unless ``--ft-ignore-missing-cfg``. The reference's options for features we lack are
judged by value (ft_core.wire.reference_options). Real parser, real files; the end-to-end runs are in
tests/integration/test_launcher_compat.py.
"""

from __future__ import annotations

import argparse
import logging

import pytest

from ft_core import FaultToleranceConfig
from ft_core.wire.config import ConfigError
from ft_core.wire.reference_options import REFERENCE_ONLY_OPTIONS
from launcher import get_args_parser
from launcher.options import DEFAULT_WORKERS_STOP_TIMEOUT, LauncherOptions


def parse(*argv: str) -> argparse.Namespace:
    return get_args_parser().parse_args([*argv, "train.py"])


def test_options_win_over_the_file_which_wins_over_the_defaults(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 50\n  initial_rank_heartbeat_timeout: 60\n"
                    "  log_level: DEBUG\n")
    cfg = FaultToleranceConfig.from_args(parse("--ft-cfg-path", str(path), "--ft-rank-heartbeat-timeout", "5",
                                               "--ft-param-rank_section_timeouts", "step:9"))
    assert cfg.rank_heartbeat_timeout == 5.0  # option
    assert cfg.initial_rank_heartbeat_timeout == 60.0 and cfg.log_level == logging.DEBUG  # file
    assert cfg.rank_section_timeouts == {"step": 9.0}  # option
    assert cfg.safety_factor == FaultToleranceConfig().safety_factor  # default


def test_no_file_means_the_defaults_and_the_options():
    assert FaultToleranceConfig.from_args(parse()) == FaultToleranceConfig()
    assert FaultToleranceConfig.from_args(parse("--ft-safety-factor", "3")).safety_factor == 3.0


@pytest.mark.parametrize("content", ["", "# nothing yet\n", "training:\n  lr: 0.1\n"],
                         ids=["empty", "comment-only", "no-section"])
def test_an_empty_file_with_options_runs_with_the_options(tmp_path, content, caplog):
    path = tmp_path / "ft.yaml"
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="ft_core"):
        cfg = FaultToleranceConfig.from_args(parse("--ft-cfg-path", str(path), "--ft-rank-heartbeat-timeout", "7"))
    assert cfg == FaultToleranceConfig(rank_heartbeat_timeout=7.0)
    assert [r.getMessage() for r in caplog.records if str(path) in r.getMessage()], caplog.text
    # with nothing at all to configure the run, it stays an error
    with pytest.raises(ConfigError, match="no 'fault_tolerance' section"):
        FaultToleranceConfig.from_args(parse("--ft-cfg-path", str(path)))


def test_a_config_path_that_does_not_exist_is_an_error(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    for extra in ([], ["--ft-rank-heartbeat-timeout", "7"]):
        with pytest.raises(ConfigError, match="nope.yaml.*No such file.*--ft-ignore-missing-cfg"):
            FaultToleranceConfig.from_args(parse("--ft-cfg-path", missing, *extra))


@pytest.mark.parametrize("flag", ["--ft-ignore-missing-cfg", "--ignore-missing-fault-tol-cfg"])
def test_ignore_missing_cfg_means_the_defaults(tmp_path, flag, caplog):
    missing = str(tmp_path / "nope.yaml")
    with caplog.at_level(logging.WARNING, logger="ft_core"):
        assert FaultToleranceConfig.from_args(parse("--ft-cfg-path", missing, flag)) == FaultToleranceConfig()
        cfg = FaultToleranceConfig.from_args(parse("--ft-cfg-path", missing, flag, "--ft-safety-factor", "2"))
    assert cfg.safety_factor == 2.0
    assert "does not exist" in caplog.text and missing in caplog.text
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert FaultToleranceConfig.from_args(parse("--ft-cfg-path", str(empty), flag)) == FaultToleranceConfig()


def test_a_namespace_with_the_references_attribute_names_works():
    # The reference's parser stores --ft-rank-heartbeat-timeout as ft_rank_heartbeat_timeout (a
    # float already) and always sets ft_restart_policy.
    args = argparse.Namespace(ft_cfg_path=None, ft_rank_heartbeat_timeout=12.0, ft_restart_policy="any-failed",
                              ft_rank_section_timeouts="setup:600,step:180", ft_log_level="DEBUG")
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg.rank_heartbeat_timeout == 12.0 and cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0}
    assert cfg.log_level == logging.DEBUG


def test_an_invalid_option_value_names_the_option():
    with pytest.raises(ConfigError, match=r"--ft-param-rank_heartbeat_timeout='-3'"):
        FaultToleranceConfig.from_args(parse("--ft-rank-heartbeat-timeout", "-3"))


# ---------------------------------------------------------------------- --workers-stop-timeout


def test_workers_stop_timeout_has_one_default_and_takes_fractions():
    assert DEFAULT_WORKERS_STOP_TIMEOUT == 2.0  # docs/launcher.md and --help say 2 s
    assert LauncherOptions.from_args(parse(), environ={}).workers_stop_timeout == DEFAULT_WORKERS_STOP_TIMEOUT
    for flag in ("--workers-stop-timeout", "--workers_stop_timeout"):
        assert LauncherOptions.from_args(parse(flag, "0.25"), environ={}).workers_stop_timeout == 0.25
    assert LauncherOptions.from_args(parse("--workers-stop-timeout", "0"), environ={}).workers_stop_timeout == 0.0


@pytest.mark.parametrize("value, echo", [("-1", "-1"), ("nan", "nan"), ("inf", "inf"), ("1e9", "1e9")])
def test_a_bad_workers_stop_timeout_names_the_option_and_echoes_the_value_as_given(value, echo):
    with pytest.raises(ConfigError, match=f"--workers-stop-timeout must be .*{echo}"):
        LauncherOptions.from_args(parse("--workers-stop-timeout", value), environ={})


# ---------------------------------------------------------------------- reference-only options

HARMLESS = [
    ("--ft-enable-nic-monitor", "false"), ("--ft-enable_nic_monitor", "0"), ("--ft-param-enable-nic-monitor", "no"),
    ("--ft_param_enable_nic_monitor", "False"), ("--ft-pci-topo-file", "null"), ("--ft-link-down-path-template", ""),
    ("--ft-node-health-check-interval", "5"), ("--ft-param-node_health_check_interval", "5.0"),
    ("--ft-restart-check-interval", "60"), ("--ft-enable-nic-healthcheck", "false"),
    ("--ft-link-state-path-template", "none"), ("--ft-gpu-memory-reclaim-timeout", "0"),
    ("--ft-gpu-memory-tolerance-mb", "512"), ("--ft-gpu-memory-poll-interval", "2"), ("--ft-segment", "null"),
    ("--ft-skip-section-response", "true"), ("--ft-check-remaining-processes", "true"), ("--ft-rdzv-impl", "barrier"),
]


@pytest.mark.parametrize("flag, value", HARMLESS)
def test_a_harmless_value_is_accepted_with_one_warning_line(flag, value):
    options = LauncherOptions.from_args(parse(flag, value), environ={})
    [line] = options.ignored_options
    assert line.startswith("ignoring --ft-") and repr(value) in line and "ptl-resiliency has no" in line
    assert FaultToleranceConfig.from_args(parse(flag, value)) == FaultToleranceConfig()  # the config is untouched


ASKING = [
    ("--ft-enable-nic-monitor", "true", "NIC health monitoring"),
    ("--ft-enable-nic-monitor", "1", "NIC health monitoring"),
    ("--ft-pci-topo-file", "/etc/topo.xml", "NIC health monitoring"),
    ("--ft-link-down-path-template", "/sys/class/infiniband/{dev_name}/ports/1/counters/link_downed",
     "link-down counter files"),
    ("--ft-enable-nic-healthcheck", "yes", "NIC link state check"),
    ("--ft-link-state-path-template", "/sys/{nic}", "NIC link state check"),
    ("--ft-gpu-memory-reclaim-timeout", "50", "GPU memory"),
    ("--ft-segment", "4", "segment-aware rank assignment"),
]


@pytest.mark.parametrize("flag, value, feature", ASKING)
def test_a_value_that_asks_for_a_feature_we_lack_is_an_error_naming_the_option(flag, value, feature):
    with pytest.raises(ConfigError) as err:
        LauncherOptions.from_args(parse(flag, value), environ={})
    text = str(err.value)
    bare = flag.removeprefix("--ft_param_").removeprefix("--ft-param-").removeprefix("--ft-")
    preferred = "--ft-" + bare.replace("_", "-")
    assert text.startswith(f"{preferred}={value!r} asks for") and feature in text and "does not have" in text


@pytest.mark.parametrize("flag, value", [("--ft-enable-nic-monitor", "maybe"),
                                         ("--ft-node-health-check-interval", "soon"),
                                         ("--ft-segment", "two"), ("--ft-rdzv-impl", "fast")])
def test_an_invalid_value_is_an_error_too(flag, value):
    with pytest.raises(ConfigError, match=repr(value)):
        LauncherOptions.from_args(parse(flag, value), environ={})


def test_the_references_config_keys_in_a_file_or_keywords_follow_the_same_rule(tmp_path, caplog):
    path = tmp_path / "ft.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 50\n  enable_nic_monitor: false\n"
                    "  node_health_check_interval: 5.0\n  restart_check_interval: 60.0\n"
                    "  pci_topo_file: null\n  link_down_path_template: null\n")
    with caplog.at_level(logging.WARNING, logger="ft_core"):
        cfg = FaultToleranceConfig.from_args(parse("--ft-cfg-path", str(path)))
    assert cfg == FaultToleranceConfig(rank_heartbeat_timeout=50.0)
    ignored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignoring ")]
    assert len(ignored) == 5 and all(f"in {path}" in line for line in ignored), ignored
    path.write_text("fault_tolerance:\n  enable_nic_monitor: true\n")
    with pytest.raises(ConfigError, match=f"enable_nic_monitor in {path}=True asks for NIC health monitoring"):
        FaultToleranceConfig.from_args(parse("--ft-cfg-path", str(path)))
    # FaultToleranceConfig.from_kwargs, as the reference's users call it
    assert FaultToleranceConfig.from_kwargs(enable_nic_monitor=False, safety_factor=2) == FaultToleranceConfig(
        safety_factor=2)
    with pytest.raises(ConfigError, match="pci_topo_file='/t.xml' asks for"):
        FaultToleranceConfig.from_kwargs(pci_topo_file="/t.xml")


def test_every_reference_only_option_is_on_the_command_line_and_none_is_a_config_field():
    actions = {action.dest: action for action in get_args_parser()._actions}
    fields = set(FaultToleranceConfig.field_names())
    for option in REFERENCE_ONLY_OPTIONS:
        assert option.name not in fields
        assert option.flag in actions[f"ft_{option.name}"].option_strings
