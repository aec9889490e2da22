"""ft_launcher's command line: every torchrun flag, every FT flag spelling, precedence, errors."""

import json
import os
import subprocess
import sys

import pytest

from ft_core import FaultToleranceConfig
from ft_core.wire.config import ConfigError
from ft_core.wire.env import (
    FT_LAUNCHER_EVENT_LOG_ENV_VAR,
    FT_LAUNCHER_WARM_RESTARTS_ENV_VAR,
    FT_LAUNCHER_WARM_START_DELAY_ENV_VAR,
)
from launcher import get_args_parser, torch_compat
from launcher.options import LauncherOptions

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
    # parsed by LauncherOptions (echoes bad values as given)
    assert options("--term-timeout", "12.5").term_timeout == 12.5


def test_precedence_defaults_then_yaml_then_cli(tmp_path):
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text(
        "trainer:\n  fault_tolerance:\n    rank_heartbeat_timeout: 50\n"
        "    initial_rank_heartbeat_timeout: 60\n    safety_factor: 3\n"
    )
    cfg = FaultToleranceConfig.from_args(
        parse("--ft-cfg-path", str(cfg_file), "--ft-param-rank_heartbeat_timeout", "5"))
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
    epilog = get_args_parser().epilog  # the exit codes; option help may wrap onto "64 ..." too
    assert epilog and epilog in text
    lines = {line.split()[0]: line for line in epilog.splitlines() if line.strip()[:2] in ("64", "65")}
    assert "ShutdownWorkload" in lines["64"] and "ExcludeThisNode" in lines["65"]


def test_ft_param_help_and_metavar_come_from_the_field_declarations():
    actions = {action.dest: action for action in get_args_parser()._actions}
    for field in FaultToleranceConfig.field_names():
        action = actions[f"ft_param_{field}"]
        assert action.help == FaultToleranceConfig.field_help(field)
        assert action.metavar == FaultToleranceConfig.field_spec(field).metavar


INVALID_VALUES = [
    (["--ft-param-rank_heartbeat_timeout", "-3"], ["--ft-param-rank_heartbeat_timeout", "'-3'"]),
    (["--ft-rank-section-timeouts", "step"], ["--ft-param-rank_section_timeouts", "'step'"]),
    (["--restart-policy", "never"], ["restart_policy", "'never'"]),
    (["--ft-param-rank_termination_signal", "SIGFOO"], ["rank_termination_signal", "SIGFOO"]),
    (["--ft-cfg-path", "/nonexistent/ft.yaml"], ["/nonexistent/ft.yaml"]),
    (["--ft-param-no_such_field", "1"], ["unrecognized arguments", "--ft-param-no_such_field"]),
    # a typo gets the YAML file's "did you mean", spelled as typed (issue 29.12)
    (["--ft-param-rank_heartbeat_timout=5"], ["unrecognized arguments: --ft-param-rank_heartbeat_timout=5 "
                                              "(did you mean --ft-param-rank_heartbeat_timeout?)"]),
    (["--ft-rank-heartbeat-timout", "5"], ["--ft-rank-heartbeat-timout (did you mean --ft-rank-heartbeat-timeout?)"]),
    (["--nproc-per-nod=1"], ["--nproc-per-nod=1 (did you mean --nproc-per-node?)"]),
    (["--term-timeout", "-1"], ["--term-timeout", "-1"]),
    (["--term-timeout", "nan"], ["--term-timeout", "nan"]),
    (["--term-timeout", "inf"], ["--term-timeout", "inf"]),
    (["--term-timeout", "1e9"], ["--term-timeout", "'1e9'"]),
    (["--term-timeout", "1e309"], ["--term-timeout", "'1e309'"]),  # was a traceback (OverflowError)
    (["--term-timeout", "soon"], ["--term-timeout", "'soon'"]),
    # torchrun's numbers that go into our WorkerSpec and wait loop: were tracebacks
    (["--monitor-interval", "nan"], ["--monitor-interval", "nan"]),
    (["--monitor-interval", "0"], ["--monitor-interval", "> 0 and <= 3600"]),
    (["--monitor-interval", "1e309"], ["--monitor-interval", "inf"]),
    (["--nproc-per-node", "0"], ["--nproc-per-node", "got 0"]),
    (["--nproc-per-node", "-2"], ["--nproc-per-node", "got -2"]),
]

# Each case runs ft_launcher's main() in one helper process (torch is imported once, not once per
# case: 17 interpreters cost ~1 minute of CPU): the exit code, what it wrote to stderr, and whether
# the training script ran (it would create its marker file).
USAGE_ERRORS_HELPER = """
import contextlib, io, json, sys, traceback
from launcher.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    code = None
    with contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            traceback.print_exc()
    results.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def usage_errors(tmp_path_factory) -> list[dict]:
    """For each INVALID_VALUES case: ft_launcher's exit code, stderr and whether its script ran."""
    tmp = tmp_path_factory.mktemp("usage")
    argvs = []
    for index, (argv, _fragments) in enumerate(INVALID_VALUES):
        script = tmp / f"w{index}.py"
        script.write_text(f"open({str(tmp / f'started{index}')!r}, 'w').close()\n")
        argvs.append(["--standalone", *argv, str(script)])
    out = subprocess.run([sys.executable, "-c", USAGE_ERRORS_HELPER, json.dumps(argvs)], capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.splitlines()[-1])
    for index, result in enumerate(results):
        result["started"] = (tmp / f"started{index}").exists()
    return results


@pytest.mark.parametrize("case", range(len(INVALID_VALUES)),
                         ids=[" ".join(argv) for argv, _fragments in INVALID_VALUES])
def test_invalid_values_fail_before_anything_starts(usage_errors, case):
    _argv, fragments = INVALID_VALUES[case]
    result = usage_errors[case]
    assert result["code"] == 2, result["stderr"]
    for fragment in fragments:
        assert fragment in result["stderr"]
    assert "Traceback" not in result["stderr"]
    assert not result["started"]


def test_yaml_with_wrong_types_names_the_file(tmp_path):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text("fault_tolerance:\n  safety_factor: fast\n")
    out = subprocess.run(FT + ["--standalone", "--ft-cfg-path", str(cfg_file), "x.py"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "bad.yaml" in out.stderr and "safety_factor" in out.stderr


# ---------------------------------------------------------------------- LauncherOptions


def options(*argv, environ=None) -> LauncherOptions:
    return LauncherOptions.from_args(parse(*argv), environ or {})


def test_launcher_options_defaults():
    opts = options()
    default_log = os.path.join(os.getcwd(), "ft_launcher_logs", "ft_events.jsonl")
    assert opts == LauncherOptions(event_log=default_log, event_log_source="default")
    assert (opts.term_timeout, opts.warm_restarts, opts.event_log) == (None, True, default_log)
    assert opts.warm_preload == ("torch", "torch.distributed") and opts.warm_start_delay == 20.0
    assert opts.stop_timeout(30) == 30


@pytest.mark.parametrize(("raw", "seconds"), [("1.9", 1.9), ("0.25", 0.25), ("0", 0.0), ("12", 12.0)])
def test_term_timeout_keeps_fractions(raw, seconds):
    opts = options("--term-timeout", raw)
    assert opts.term_timeout == seconds and opts.stop_timeout(30) == seconds


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "-inf", "1e7", "1e309"])
def test_term_timeout_rejects_non_finite_negative_and_huge(raw):
    with pytest.raises(ConfigError, match="--term-timeout") as info:
        options(f"--term-timeout={raw}")
    assert repr(raw) in str(info.value)  # the value as given


def test_event_log_flag_beats_variable_beats_log_dir(tmp_path):
    env = {FT_LAUNCHER_EVENT_LOG_ENV_VAR: "/from/env.jsonl"}
    assert options("--ft-event-log", "/flag.jsonl", "--log-dir", "/logs", environ=env).event_log == "/flag.jsonl"
    assert options("--log-dir", "/logs", environ=env).event_log == "/from/env.jsonl"
    assert options("--log-dir", "/logs").event_log == os.path.join("/logs", "ft_events.jsonl")
    assert options().event_log == os.path.join(os.getcwd(), "ft_launcher_logs", "ft_events.jsonl")


def test_warm_restart_switches():
    assert options("--no-warm-restarts").warm_restarts is False
    assert options(environ={FT_LAUNCHER_WARM_RESTARTS_ENV_VAR: "0"}).warm_restarts is False
    assert options(environ={FT_LAUNCHER_WARM_RESTARTS_ENV_VAR: "1"}).warm_restarts is True
    assert options("--no-warm-restarts", environ={FT_LAUNCHER_WARM_RESTARTS_ENV_VAR: "1"}).warm_restarts is False
    with pytest.raises(ConfigError, match=f"{FT_LAUNCHER_WARM_RESTARTS_ENV_VAR} must be 0 or 1, got 'no'"):
        options(environ={FT_LAUNCHER_WARM_RESTARTS_ENV_VAR: "no"})
    assert options("--warm-preload", "torch,,lightning.pytorch").warm_preload == ("torch", "lightning.pytorch")
    assert options("--warm-preload=").warm_preload == ()


def test_warm_start_delay_variable():
    assert options(environ={FT_LAUNCHER_WARM_START_DELAY_ENV_VAR: "0"}).warm_start_delay == 0.0
    assert options(environ={FT_LAUNCHER_WARM_START_DELAY_ENV_VAR: "2.5"}).warm_start_delay == 2.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ConfigError, match=f"{FT_LAUNCHER_WARM_START_DELAY_ENV_VAR}.*'{bad}'"):
            options(environ={FT_LAUNCHER_WARM_START_DELAY_ENV_VAR: bad})


def test_an_invalid_launcher_variable_is_a_usage_error(tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {**os.environ, FT_LAUNCHER_WARM_START_DELAY_ENV_VAR: "soon"}
    out = subprocess.run(FT + ["--standalone", str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stderr
    assert FT_LAUNCHER_WARM_START_DELAY_ENV_VAR in out.stderr and "'soon'" in out.stderr
    assert "Traceback" not in out.stderr and not marker.exists()


# ---------------------------------------------------------------------- config that says what it does


def test_an_unknown_yaml_key_is_a_usage_error_naming_the_closest_valid_one(tmp_path):
    # It used to be logged and ignored: the run went on with the default timeout.
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text("fault_tolerance:\n  rank_heartbeat_timout: 5\n  safety_factor: 2\n  colour: blue\n")
    script = tmp_path / "w.py"
    marker = tmp_path / "started"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = subprocess.run(FT + ["--standalone", "--ft-cfg-path", str(cfg_file), str(script)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"ft_launcher: error: unknown fault tolerance config key(s) in the fault_tolerance "
                            f"section of {cfg_file}: 'colour', 'rank_heartbeat_timout' (did you mean "
                            "'rank_heartbeat_timeout'?)"), first
    assert not marker.exists()


def test_usage_errors_print_the_message_first_not_the_usage(tmp_path):
    out = subprocess.run(FT + ["--standalone", "--nproc-per-node"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert lines == ["ft_launcher: error: argument --nproc-per-node/--nproc_per_node: expected one argument",
                     "Run 'ft_launcher --help' for the options."], lines


def test_a_missing_training_script_is_a_usage_error(tmp_path):
    out = subprocess.run(FT + ["--standalone", "--max-restarts", "3", str(tmp_path / "trian.py")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"ft_launcher: error: training script '{tmp_path / 'trian.py'}' not found "
                                 f"(working directory {tmp_path}); nothing was started")
    assert "cycle 0" not in out.stderr  # no worker was started, nothing restarted


def effective(*argv, environ=None, cfg_file=None) -> list[str]:
    from launcher.cli import effective_config_lines
    from launcher.options import config_sources

    args = parse(*(["--ft-cfg-path", str(cfg_file)] if cfg_file else []), *argv)
    return effective_config_lines(FaultToleranceConfig.from_args(args), config_sources(args),
                                  LauncherOptions.from_args(args, environ or {}), args)


def test_the_effective_config_names_every_non_default_value_and_its_source(tmp_path):
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 50\n  safety_factor: 3\n"
                        "  restart_policy: any-failed\n")  # = the default: not shown
    lines = effective("--ft-param-rank_heartbeat_timeout", "5", "--ft-param-rank_section_timeouts", "step:20",
                      "--term-timeout", "2.5", "--log-dir", str(tmp_path / "logs"), cfg_file=cfg_file)
    assert lines == [
        "effective configuration, non-default values (ft_launcher --help lists the defaults):",
        "  rank_heartbeat_timeout = 5  (command line --ft-param-rank_heartbeat_timeout)",
        "  rank_section_timeouts = step:20  (command line --ft-param-rank_section_timeouts)",
        f"  safety_factor = 3  (file {cfg_file})",
        "  term timeout = 2.5 s  (--term-timeout)",
        f"  event log = {tmp_path / 'logs' / 'ft_events.jsonl'}  (--log-dir)",
    ]


def test_the_effective_config_of_defaults_and_the_other_sources():
    # README: the event log is kept by default, in ft_launcher_logs/ of the working directory
    assert effective() == [
        "effective configuration: every fault tolerance setting has its default (ft_launcher --help)",
        f"  event log = {os.path.join(os.getcwd(), 'ft_launcher_logs', 'ft_events.jsonl')}  (default)",
    ]
    if torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT:  # torchrun < 2.12 has no --shutdown-timeout
        lines = effective("--shutdown-timeout", "7", "--no-warm-restarts", environ={"AUTORESUME_RUN_DIR": "/r"})
        assert lines[1:] == ["  term timeout = 7 s  (--shutdown-timeout)",
                             "  warm restarts = off  (--no-warm-restarts)",
                             "  event log = /r/ft_events.jsonl  (AUTORESUME_RUN_DIR)"]
    else:
        lines = effective("--no-warm-restarts", environ={"AUTORESUME_RUN_DIR": "/r"})
        assert lines[1:] == ["  warm restarts = off  (--no-warm-restarts)",
                             "  event log = /r/ft_events.jsonl  (AUTORESUME_RUN_DIR)"]
    assert effective(environ={"FT_LAUNCHER_EVENT_LOG": "/e.jsonl", "AUTORESUME_RUN_DIR": "/r"})[-1] == \
        "  event log = /e.jsonl  (FT_LAUNCHER_EVENT_LOG)"


def test_the_event_log_precedence_and_none(tmp_path, monkeypatch):
    # docs/launcher.md: --ft-event-log, else FT_LAUNCHER_EVENT_LOG, else --log-dir, else
    # $AUTORESUME_RUN_DIR, else ft_launcher_logs/ in the working directory; "none": memory only.
    logs = tmp_path / "logs"
    assert effective("--log-dir", str(logs), environ={"AUTORESUME_RUN_DIR": "/r"})[-1] == \
        f"  event log = {logs / 'ft_events.jsonl'}  (--log-dir)"
    assert effective("--ft-event-log", "none")[-1] == "  event log: kept in memory only (--ft-event-log none)"
    assert effective(environ={"FT_LAUNCHER_EVENT_LOG": "none"})[-1] == \
        "  event log: kept in memory only (FT_LAUNCHER_EVENT_LOG=none)"
    # a working directory where nothing can be written: kept in memory, said why (not refused)
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o500)
    monkeypatch.chdir(readonly)
    line = effective()[-1]
    if os.access(readonly, os.W_OK):  # root writes anyway
        assert line == f"  event log = {readonly / 'ft_launcher_logs' / 'ft_events.jsonl'}  (default)"
    else:
        assert line.startswith(f"  event log: kept in memory only (the default {readonly}/ft_launcher_logs/"), line
        assert "--ft-event-log PATH keeps it for ft_report" in line
    assert not (readonly / "ft_launcher_logs").exists()  # reading the options creates nothing


def test_term_timeout_and_torchruns_shutdown_timeout_set_the_same_thing(tmp_path):
    # docs/launcher.md: --shutdown-timeout is --term-timeout's default; --term-timeout wins.
    from launcher.launch_config import read_launch_config

    def stop_timeout(*argv):
        args = parse("--standalone", "--log-dir", str(tmp_path), *argv)
        config, _, _ = read_launch_config(args, str(tmp_path))  # supplies shutdown_timeout on torch < 2.12
        return LauncherOptions.from_args(args, {}).stop_timeout(config.shutdown_timeout)

    assert stop_timeout() == 30
    assert stop_timeout("--term-timeout", "0.5") == 0.5
    if torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT:  # torchrun < 2.12 has no --shutdown-timeout
        assert stop_timeout("--shutdown-timeout", "7") == 7
        assert stop_timeout("--shutdown-timeout", "7", "--term-timeout", "0.5") == 0.5


def test_torchrun_accepts_unambiguous_abbreviations_and_ft_launcher_none():
    # docs/launcher.md's claim, both halves.
    from torch.distributed import run as torch_run

    assert torch_run.get_args_parser().parse_args(["--nproc-per", "2", "x.py"]).nproc_per_node == "2"
    with pytest.raises(SystemExit):
        torch_run.get_args_parser().parse_args(["--nproc", "2", "x.py"])  # ambiguous there too
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--nproc-per", "2", "x.py"])  # "unrecognized arguments"
