"""ft_launcher's command line: every torchrun flag, every FT flag spelling, precedence, errors."""

import subprocess
import sys

import pytest

from ft_core import FaultToleranceConfig
from launcher import get_args_parser
from launcher.cli import build_ft_config

FT = [sys.executable, "-m", "launcher"]


def parse(*argv):
    return get_args_parser().parse_args([*argv, "train.py", "--lr", "1"])


def test_torchrun_flags_parse_as_in_torchrun():
    args = parse(
        "--standalone", "--nnodes", "1:2", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "job", "--rdzv-conf", "join_timeout=5",
        "--max-restarts", "3", "--monitor-interval", "0.5", "--log-dir", "/tmp/x", "-r", "3", "-t", "1",
        "--local-ranks-filter", "0", "--role", "trainer", "--no-python",
    )
    assert (args.nnodes, args.nproc_per_node, args.max_restarts, args.monitor_interval) == ("1:2", "4", 3, 0.5)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "127.0.0.1:29400", "job")
    assert args.standalone and args.no_python and args.role == "trainer"
    assert args.training_script == "train.py" and args.training_script_args == ["--lr", "1"]
    assert get_args_parser().parse_args(["-m", "pkg.mod"]).module


def test_pet_environment_fallbacks(monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "7")
    args = parse()
    assert args.nproc_per_node == "3" and args.max_restarts == 7


@pytest.mark.parametrize("field", FaultToleranceConfig.field_names())
def test_every_field_has_all_four_flag_spellings(field):
    dashed = field.replace("_", "-")
    value = {"rank_section_timeouts": "step:5", "rank_termination_signal": "SIGTERM", "log_level": "DEBUG",
             "restart_policy": "min-healthy"}.get(field, "7")
    for flag in (f"--ft-param-{dashed}", f"--ft-param-{field}", f"--ft-{dashed}", f"--ft-{field}"):
        args = parse(flag, value)
        assert getattr(args, f"ft_param_{field}") == value, flag


def test_restart_policy_and_cfg_path_aliases():
    assert parse("--restart-policy", "min-healthy").ft_param_restart_policy == "min-healthy"
    for flag in ("--fault-tol-cfg-path", "--ft-cfg-path", "--ft_cfg_path"):
        assert parse(flag, "a.yaml").ft_cfg_path == "a.yaml"
    assert parse("--term-timeout", "12.5").term_timeout == 12.5


def test_precedence_defaults_then_yaml_then_cli(tmp_path):
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text(
        "trainer:\n  fault_tolerance:\n    rank_heartbeat_timeout: 50\n"
        "    initial_rank_heartbeat_timeout: 60\n    safety_factor: 3\n"
    )
    cfg = build_ft_config(parse("--ft-cfg-path", str(cfg_file), "--ft-param-rank_heartbeat_timeout", "5"))
    assert cfg.rank_heartbeat_timeout == 5.0  # CLI beats YAML
    assert cfg.initial_rank_heartbeat_timeout == 60.0  # YAML beats default
    assert cfg.safety_factor == 3.0
    assert cfg.rank_out_of_section_timeout is None  # default


def test_help_documents_every_ft_option():
    text = get_args_parser().format_help()
    for field in FaultToleranceConfig.field_names():
        assert f"--ft-param-{field.replace('_', '-')}" in text
    for flag in ("--fault-tol-cfg-path", "--restart-policy", "--term-timeout", "--ft-event-log", "--nproc-per-node"):
        assert flag in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()[:2] in ("64", "65")}
    assert "ShutdownWorkload" in lines["64"] and "ExcludeThisNode" in lines["65"]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--ft-param-rank_heartbeat_timeout", "-3"], ["--ft-param-rank_heartbeat_timeout", "'-3'"]),
        (["--ft-rank-section-timeouts", "step"], ["--ft-param-rank_section_timeouts", "'step'"]),
        (["--restart-policy", "never"], ["restart_policy", "'never'"]),
        (["--ft-param-rank_termination_signal", "SIGFOO"], ["rank_termination_signal", "SIGFOO"]),
        (["--ft-cfg-path", "/nonexistent/ft.yaml"], ["/nonexistent/ft.yaml"]),
        (["--ft-param-no_such_field", "1"], ["unrecognized arguments", "--ft-param-no_such_field"]),
        (["--term-timeout", "-1"], ["--term-timeout"]),
    ],
)
def test_invalid_values_fail_before_anything_starts(argv, fragments, tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = subprocess.run(FT + ["--standalone", *argv, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    for fragment in fragments:
        assert fragment in out.stderr
    assert "Traceback" not in out.stderr
    assert not marker.exists()


def test_yaml_with_wrong_types_names_the_file(tmp_path):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text("fault_tolerance:\n  safety_factor: fast\n")
    out = subprocess.run(FT + ["--standalone", "--ft-cfg-path", str(cfg_file), "x.py"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "bad.yaml" in out.stderr and "safety_factor" in out.stderr
