"""Bad input gets a clear error naming what is wrong (or a documented fallback), and nothing already
saved is lost.

- the configuration file and ``--ft-param-*`` values, through the real ``ft_launcher`` entry point
  (in-process: it stops before starting anything);
- client misuse: sections that are not configured, ``end_section`` without ``start_section``,
  saved state with the wrong schema (against a real monitor);
- the Lightning callbacks' files: a truncated state file, a finished flag that cannot be
  written, a failed write that must leave the old file intact;
- a ``TMPDIR`` too deep for Unix socket paths (a real ft_launcher run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ft_core import FaultToleranceConfig, RankMonitorClient, RankMonitorClientError
from ft_core.wire.atomic import atomic_write_text
from ft_core.wire.config import ConfigError
from ft_core.wire.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from tests.launcher_util import run_launcher

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "faults_worker.py")

# ---------------------------------------------------------------------- configuration


def launcher_usage_error(argv: list[str], capsys) -> str:
    """Run ft_launcher's entry point; it must stop with exit code 2. Returns its stderr."""
    from launcher.cli import main

    with pytest.raises(SystemExit) as info:
        main([*argv, "--standalone", "train.py"])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    return err


CONFIG_FILES = [
    pytest.param(None, ["cannot read", "No such file or directory"], id="missing"),
    pytest.param("<dir>", ["cannot read", "Is a directory"], id="unreadable-directory"),
    pytest.param(b"fault_tolerance: [1, 2\n", ["is not valid YAML"], id="not-yaml"),
    pytest.param(b"fault_tolerance:\n  safety_factor: \xff\xfe\n", ["is not UTF-8 text"], id="not-utf8"),
    pytest.param(b"training:\n  lr: 0.1\n", ["no 'fault_tolerance' section"], id="no-section"),
    pytest.param(b"fault_tolerance: 5\n", ["must be a mapping", "int"], id="section-not-a-mapping"),
    pytest.param(b"fault_tolerance:\n  1: 2\n", ["keys must be strings", "1"], id="key-not-a-string"),
    pytest.param(b"fault_tolerance:\n  safety_factor: fast\n", ["safety_factor", "'fast'"], id="wrong-type"),
    pytest.param(b"fault_tolerance:\n  rank_heartbeat_timeout: -5\n", ["rank_heartbeat_timeout", "-5"],
                 id="negative-timeout"),
    pytest.param(b"fault_tolerance:\n  rank_heartbeat_timeout: " + b"9" * 400 + b"\n",
                 ["rank_heartbeat_timeout", "-bit int"], id="timeout-beyond-float-range"),
    pytest.param(b"fault_tolerance:\n  rank_section_timeouts: [1, 2]\n", ["rank_section_timeouts", "[1, 2]"],
                 id="sections-not-a-mapping"),
    pytest.param(b"fault_tolerance:\n  rank_section_timeouts: {step: -1}\n", ["rank_section_timeouts[step]", "-1"],
                 id="section-timeout-negative"),
    pytest.param(b"fault_tolerance:\n  rank_termination_signal: SIGFOO\n", ["rank_termination_signal", "SIGFOO"],
                 id="unknown-signal"),
    pytest.param(b"fault_tolerance:\n  log_level: 99\n", ["log_level", "99"], id="log-level-out-of-range"),
    pytest.param(b"fault_tolerance:\n  restart_policy: sometimes\n", ["restart_policy", "'sometimes'"],
                 id="unknown-restart-policy"),
]


@pytest.mark.parametrize(("content", "fragments"), CONFIG_FILES)
def test_a_bad_config_file_is_a_usage_error_naming_the_file(content, fragments, tmp_path, capsys):
    path = tmp_path / "ft.yaml"
    if content == "<dir>":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    err = launcher_usage_error(["--fault-tol-cfg-path", str(path)], capsys)
    assert str(path) in err
    for fragment in fragments:
        assert fragment in err, err


def test_an_empty_config_section_means_the_defaults(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text("fault_tolerance:\n  # everything commented out\n")
    assert FaultToleranceConfig.from_yaml_file(path) == FaultToleranceConfig()


def test_a_config_file_with_recursive_aliases_is_searched_without_hanging(tmp_path):
    # YAML aliases can make a document refer to itself; the search for the section used to loop.
    path = tmp_path / "ft.yaml"
    path.write_text("model: &m [*m, {layers: *m}]\ntraining:\n  fault_tolerance:\n    safety_factor: 2\n")
    assert FaultToleranceConfig.from_yaml_file(path).safety_factor == 2.0
    path.write_text("model: &m [*m, {layers: *m}]\ntraining: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match="no 'fault_tolerance' section"):
        FaultToleranceConfig.from_yaml_file(path)


BAD_FLAGS = [
    ("--ft-param-rank_heartbeat_timeout", "soon"),
    ("--ft-param-initial_rank_heartbeat_timeout", "0"),
    ("--ft-param-rank_out_of_section_timeout", "1e400"),
    ("--ft-param-rank_section_timeouts", "step:10,step:20"),
    ("--ft-param-rank_section_timeouts", "step=10"),
    ("--ft-param-safety_factor", "0.5"),
    ("--ft-param-workload_check_interval", "-1"),
    ("--ft-param-workload_check_interval", "2e6"),  # crashed the monitor (OverflowError)
    ("--ft-param-workload_check_interval", "1e-300"),  # spun the monitor at 81 % CPU
    ("--ft-param-safety_factor", "1e308"),  # wrote inf into the state file
    ("--ft-param-rank_termination_signal", "999"),
    ("--ft-param-rank_termination_signal", "²"),
    ("--ft-param-log_level", "LOUD"),
    ("--ft-param-log_level", "-1"),
    ("--ft-param-restart_policy", "never"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_FLAGS, ids=[f"{f[11:]}={v}" for f, v in BAD_FLAGS])
def test_a_bad_ft_param_is_a_usage_error_naming_flag_and_value(flag, value, capsys):
    err = launcher_usage_error([flag, value], capsys)
    assert flag in err and repr(value) in err, err


def test_an_unknown_ft_param_is_a_usage_error(capsys):
    err = launcher_usage_error(["--ft-param-rank_heartbeat_timeot", "5"], capsys)
    assert "unrecognized arguments: --ft-param-rank_heartbeat_timeot" in err
    assert "(did you mean --ft-param-rank_heartbeat_timeout?)" in err, err  # as for a YAML key (issue 29.12)
    err = launcher_usage_error(["--ft-param-no_such_thing=5"], capsys)
    assert "unrecognized arguments: --ft-param-no_such_thing=5\n" in err, err  # nothing close: no guess


def test_a_log_level_without_a_name_reaches_a_monitor(run_dir):
    # 15 has no name; ft_launcher hands monitors their config as JSON, which they must parse back
    # (it used to go as "Level 15" and every monitor refused to start).
    from ft_core.monitor.process import MonitorProcess

    monitor = MonitorProcess.start(FaultToleranceConfig(log_level=15), os.path.join(run_dir, "m.sock"))
    try:
        assert monitor.is_alive()
    finally:
        monitor.terminate()
        monitor.join(10)


# ---------------------------------------------------------------------- client misuse


@pytest.fixture
def client(start_monitor, monkeypatch):
    """A client in this process, attached to a real monitor with sections step and setup."""
    _, path = start_monitor(FaultToleranceConfig(rank_section_timeouts={"setup": 60, "step": 60}))
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    yield client
    client.shutdown_workload_monitoring()


def test_sections_that_are_not_configured_are_named(client):
    with pytest.raises(RankMonitorClientError, match=r"section 'validation' is not configured \(configured "
                                                     r"sections: setup, step\).*rank_section_timeouts=validation:600"):
        client.start_section("validation")
    with pytest.raises(RankMonitorClientError, match="'validation' is not configured"):
        client.end_section("validation")
    with pytest.raises(RankMonitorClientError, match="'validation' is not configured"):
        client.calculate_and_set_section_timeouts(selected_sections=["validation"])
    client.start_section("step")  # nothing was left half-done
    client.end_section("step")
    assert client.open_sections == ()


def test_end_section_without_start_section_is_named(client):
    with pytest.raises(RankMonitorClientError, match=r"end_section\('step'\) without a matching start_section"):
        client.end_section("step")
    client.start_section("step")
    client.end_section("step")
    with pytest.raises(RankMonitorClientError, match="without a matching"):
        client.end_section("step")


BAD_STATES = [
    pytest.param([1, 2], "state must be a dict", id="not-a-dict"),
    pytest.param({"version": 2}, "unsupported state version 2", id="future-version"),
    pytest.param({"hb_timeouts": [60, 30]}, "hb_timeouts must be a mapping", id="hb-not-a-mapping"),
    pytest.param({"hb_timeouts": {"initial": "60", "were_calculated": True}}, "hb_timeouts.initial", id="hb-string"),
    pytest.param({"hb_timeouts": {"initial": 10**400, "were_calculated": True}}, "hb_timeouts.initial",
                 id="hb-beyond-float-range"),
    pytest.param({"hb_timeouts": {"subsequent": 5, "were_calculated": "yes"}}, "were_calculated", id="bool-string"),
    pytest.param({"section_timeouts": {"section": {"step": -1}}}, "section_timeouts.section[step]",
                 id="section-negative"),
    pytest.param({"section_timeouts": {"calculated_sections": "step"}}, "calculated_sections", id="names-not-a-list"),
]


@pytest.mark.parametrize(("state", "fragment"), BAD_STATES)
def test_saved_state_with_the_wrong_schema_is_refused_and_changes_nothing(client, state, fragment):
    before = client.state_dict()
    with pytest.raises(RankMonitorClientError, match="invalid fault tolerance state") as info:
        client.load_state_dict(state)
    assert fragment in str(info.value)
    assert client.state_dict() == before


# ---------------------------------------------------------------------- the callbacks' files


@pytest.fixture
def trainer():
    """A real (idle) Lightning Trainer: the state file is read through its strategy's collectives."""
    from ptl_resiliency._lightning import pl

    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def test_a_truncated_state_file_is_ignored_with_a_warning_and_kept(trainer, tmp_path, caplog):
    import logging

    from ft_core.client.state_file import PART_HEARTBEATS, StateFile
    from ptl_resiliency._collectives import StrategyCollectives

    client = RankMonitorClient()
    client.load_state_dict({"hb_timeouts": {"initial": 60.0, "subsequent": 30.0, "were_calculated": True}})
    log = logging.getLogger("tests.bad_input")
    state_file = StateFile(str(tmp_path / "exp" / "_ft_state.json"), PART_HEARTBEATS, log)
    assert state_file.save({"version": 1, "hb_timeouts": client._loaded_state.hb.to_dict()})
    full = Path(state_file.path).read_bytes()
    Path(state_file.path).write_bytes(full[: len(full) // 2])  # the node died mid-write (no atomic rename)
    with caplog.at_level(logging.WARNING, logger="tests.bad_input"):
        assert state_file.read_agreed(StrategyCollectives(trainer.strategy)) is None
    assert "not valid JSON" in caplog.text and state_file.path in caplog.text
    assert Path(state_file.path).read_bytes() == full[: len(full) // 2]  # evidence kept


FAILING_WRITE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))  # the disk is "full" after 64 bytes
from ft_core.wire.atomic import atomic_write_text
try:
    atomic_write_text(sys.argv[1], "new" * 1000)
except OSError as err:
    print(type(err).__name__, err.errno)
"""


def test_a_failed_state_write_leaves_the_old_file_intact(tmp_path):
    path = tmp_path / "_ft_state.json"
    atomic_write_text(path, '{"version": 1}\n')
    out = subprocess.run([sys.executable, "-c", FAILING_WRITE, str(path)], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split()[0] == "OSError" and out.stdout.split()[1] == "27", out  # EFBIG
    assert path.read_text() == '{"version": 1}\n'
    assert os.listdir(tmp_path) == ["_ft_state.json"]  # no temporary file left


def test_a_missing_flag_directory_is_created(trainer, tmp_path):
    from ptl_resiliency._training_state import create_finished_flag

    flag = tmp_path / "not" / "there" / "yet" / "finished.flag"
    create_finished_flag(str(flag), "max_steps=3 reached", trainer)
    assert json.loads(flag.read_text())["completed"] is True


def test_a_flag_that_cannot_be_written_fails_the_run_naming_the_path(tmp_path, monkeypatch, start_monitor):
    # Training completed, but the auto-resume loop would never see the flag: teardown raises.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    flag = blocker / "finished.flag"
    _, path = start_monitor(FaultToleranceConfig(initial_rank_heartbeat_timeout=60, rank_heartbeat_timeout=60))
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
    monkeypatch.setenv(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, str(flag))
    from tests.workers.lightning_train import run

    with pytest.raises(OSError) as info:
        run({"callback": "heartbeats", "root": str(tmp_path / "root"), "max_steps": 2, "ckpt_every": 0,
             "cb": {"autoresume": True}})
    assert str(blocker) in str(info.value)
    assert blocker.read_text() == "not a directory"


# ---------------------------------------------------------------------- deep TMPDIR


def test_a_tmpdir_too_deep_for_socket_paths_falls_back_to_tmp(tmp_path):
    deep = tempfile.mkdtemp(prefix="ftt-deep-", dir="/tmp")
    tmpdir = os.path.join(deep, *(["d" * 40] * 3))
    os.makedirs(tmpdir)
    try:
        result = run_launcher(["--standalone", "--nproc-per-node", "2", "--warm-preload=",
                               WORKER, "--dir", str(tmp_path), "--steps", "2"], env={"TMPDIR": tmpdir}, timeout=90)
        assert result.returncode == 0, result.stderr
        assert (f"not using TMPDIR for the launcher's sockets: {tmpdir} is too long for Unix socket paths; "
                "using /tmp instead") in result.stderr
        sockets = [json.loads((tmp_path / f"cycle0_rank{r}.json").read_text())["monitor_socket"] for r in (0, 1)]
        run_dir = os.path.dirname(sockets[0])
        assert os.path.dirname(run_dir) == "/tmp" and os.path.basename(run_dir).startswith("ft-")
        assert not os.path.exists(run_dir)  # removed at exit
        assert os.listdir(tmpdir) == []  # and nothing was put in the deep TMPDIR either
    finally:
        shutil.rmtree(deep, ignore_errors=True)


# ---------------------------------------------------------------------- the launcher's own input

# Runs each ft_launcher command line of a JSON list in a process of its own, forked from one
# interpreter that imported the launcher (and torch) once: each case is a real ft_launcher process
# (its entry point, environment, working directory, TMPDIR, exit code and stderr of its own, and
# whatever it starts), without paying torch's import per case. A case still running after its
# deadline is killed with its process group and reported as timed out.
FORKED_LAUNCHERS = r"""
import json, os, signal, sys, tempfile, time, traceback
import launcher.cli

results = []
for case in json.load(open(sys.argv[1])):
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.environ["TMPDIR"] = case["tmpdir"]
        tempfile.tempdir = None  # torch's import may have cached the server's
        os.chdir(case["cwd"])
        out = os.open(case["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        code = 1
        try:
            launcher.cli.main(case["argv"])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()  # as the interpreter does for python -m launcher
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    rc = None
    while time.monotonic() - started < case["timeout"]:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.02)
    if rc is None:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    results.append({"rc": rc, "seconds": round(time.monotonic() - started, 2)})
print(json.dumps(results))
"""


def run_launchers(tmp_path: Path, cases: dict[str, list[str]], timeout: float = 20.0) -> dict[str, dict]:
    """Run ``ft_launcher ARGV`` for each case (see :data:`FORKED_LAUNCHERS`), each with a TMPDIR of
    its own; returns per case its exit code (None: killed after ``timeout``), stderr and the
    entries its TMPDIR holds afterwards."""
    from tests.launcher_util import launcher_env

    specs = []
    for name, argv in cases.items():
        (tmp_path / f"tmp-{name}").mkdir()
        specs.append({"argv": argv, "tmpdir": str(tmp_path / f"tmp-{name}"), "cwd": str(tmp_path),
                      "stderr": str(tmp_path / f"{name}.stderr"), "timeout": timeout})
    (tmp_path / "cases.json").write_text(json.dumps(specs))
    out = subprocess.run([sys.executable, "-c", FORKED_LAUNCHERS, str(tmp_path / "cases.json")],
                         env=launcher_env(), capture_output=True, text=True, timeout=60 + timeout * len(cases))
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout.splitlines()[-1])
    return {name: {**result, "stderr": Path(spec["stderr"]).read_text(), "tmpdir": os.listdir(spec["tmpdir"])}
            for name, result, spec in zip(cases, results, specs, strict=True)}


@pytest.fixture(scope="module")
def launcher_runs(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """Every launcher case of the tests below, run once (one import of torch for all of them)."""
    tmp_path = tmp_path_factory.mktemp("launcher-input")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    (tmp_path / "big.yaml").write_text("fault_tolerance:\n  rank_heartbeat_timeout: " + "9" * 5000 + "\n")
    (tmp_path / "job.sh").write_text("#!/bin/sh\nexit 0\n")  # not executable
    (tmp_path / "ft.yaml").write_text("fault_tolerance:\n  rank_heartbeat_timeout: 30\n")
    (tmp_path / "records").mkdir()
    (tmp_path / "reference").mkdir()
    base = ["--standalone", "--nproc-per-node", "1", "--no-warm-restarts", "--monitor-interval", "0.05"]
    worker = [WORKER, "--dir", str(tmp_path / "records"), "--steps", "1"]
    cases = {
        "event-log-directory": [*base, "--ft-event-log", str(tmp_path), *worker],
        "event-log-unreachable": [*base, "--ft-event-log", str(a_file / "events.jsonl"), *worker],
        # access(2) lets root write in /proc, where nothing can be made: was a FileNotFoundError traceback
        "event-log-in-proc": [*base, "--ft-event-log", "/proc/nope/x.jsonl", *worker],
        "log-dir-a-file": [*base, "--log-dir", str(a_file), *worker],
        "yaml-5000-digits": [*base, "--fault-tol-cfg-path", str(tmp_path / "big.yaml"), *worker],
        "no-python-not-executable": [*base, "--no-python", str(tmp_path / "job.sh")],
        "keep-alive-negative": [*base, "--rdzv-conf", "keep_alive_interval=-1",
                                "--ft-event-log", str(tmp_path / "events.jsonl"), *worker],
        "rdzv-timeout-not-a-number": [*base, "--rdzv-conf", "timeout=abc", *worker],
        "empty-heartbeat-timeout": [*base, "--ft-param-rank_heartbeat_timeout", "", *worker],
        # what a user of the reference types: a real run
        "reference-spellings": [*base, "--ft-cfg_path", str(tmp_path / "ft.yaml"),
                                "--ft-initial-rank-heartbeat-timeout", "40", "--ft-restart-check-interval", "5",
                                WORKER, "--dir", str(tmp_path / "reference"), "--steps", "1"],
    }
    return tmp_path, run_launchers(tmp_path, cases, timeout=30)


BAD_LAUNCHER_INPUT = {
    "event-log-directory": ["--ft-event-log {tmp}", "is a directory"],
    "event-log-unreachable": ["{tmp}/a-file is not a directory"],
    "event-log-in-proc": ["the event log /proc/nope/x.jsonl cannot be created", "--ft-event-log"],
    "log-dir-a-file": ["--log-dir {tmp}/a-file", "is not a directory"],
    "yaml-5000-digits": ["{tmp}/big.yaml", "line 2", "5000 characters"],
    "no-python-not-executable": ["{tmp}/job.sh", "is not executable", "--no-python"],
    "keep-alive-negative": ["--rdzv-conf keep_alive_interval='-1'", "whole number of seconds"],
    "rdzv-timeout-not-a-number": ["--rdzv-conf timeout='abc'", "whole number"],
    "empty-heartbeat-timeout": ["--ft-param-rank_heartbeat_timeout=''", "empty", "null"],
}


@pytest.mark.parametrize("case", BAD_LAUNCHER_INPUT)
def test_bad_launcher_input_is_one_line_exit_2_and_nothing_left(launcher_runs, case):
    # Issue 21 item 11: each of these was a traceback (exit 1), a silent acceptance, or a
    # rendezvous spinning at 100 % CPU.
    tmp_path, results = launcher_runs
    result = results[case]
    err = result["stderr"]
    assert result["rc"] == 2, result
    assert "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if "error" in line.lower()]
    assert line.startswith("ft_launcher: error: "), err
    for fragment in BAD_LAUNCHER_INPUT[case]:
        assert fragment.format(tmp=tmp_path) in line, (fragment, line)
    assert result["tmpdir"] == []  # no run directory left
    assert not list((tmp_path / "records").iterdir())  # no worker ran
    if case == "keep-alive-negative":
        # refused before torch's rendezvous: launcher_start, recorded just before it, never was
        assert not (tmp_path / "events.jsonl").exists()
        assert "rendezvous" not in err.replace("--rdzv-conf", "")


def test_what_a_user_of_the_reference_types_is_accepted_and_named_as_typed(launcher_runs):
    # Issue 22 item 5: --ft-cfg_path (the reference's help) was an unrecognized argument; the
    # effective-config log named --ft-param-initial_rank_heartbeat_timeout for what the user typed
    # as --ft-initial-rank-heartbeat-timeout; an ignored option's warning read "ptl-resiliency has
    # no the interval of the in-process restart check".
    tmp_path, results = launcher_runs
    result = results["reference-spellings"]
    err = result["stderr"]
    assert result["rc"] == 0, err
    assert f"rank_heartbeat_timeout = 30  (file {tmp_path / 'ft.yaml'})" in err
    assert "initial_rank_heartbeat_timeout = 40  (command line --ft-initial-rank-heartbeat-timeout)" in err
    [warning] = [line for line in err.splitlines() if "ignoring --ft-restart-check-interval='5'" in line]
    assert warning.endswith("ignoring --ft-restart-check-interval='5': an option of nvidia-resiliency-ext for the "
                            "interval of the in-process restart check; ptl-resiliency has no such setting, and "
                            "the value asks for nothing, so the run is unaffected"), warning
    assert (tmp_path / "reference" / "cycle0_rank0.done.json").exists()
    assert result["tmpdir"] == []


def test_every_option_of_the_reference_help_is_accepted_with_its_meaning():
    # The reference's (nvidia-resiliency-ext 0.4.1) ft_launcher --help, option by option: each
    # spelling reaches the same setting here (a torchrun option, a config field's --ft-param-*, a
    # reference-only option, --ft-ignore-missing-cfg).
    from ft_core.wire.reference_options import REFERENCE_LAUNCHER_OPTIONS
    from launcher.cli import get_args_parser

    actions = get_args_parser()._option_string_actions
    fields = set(FaultToleranceConfig.field_names())
    for dest, flags in REFERENCE_LAUNCHER_OPTIONS:
        ours = f"ft_param_{dest[3:]}" if dest.startswith("ft_") and dest[3:] in fields else dest
        for flag in flags:
            assert flag in actions, f"{flag} is not accepted"
            assert actions[flag].dest == ours, (flag, actions[flag].dest, ours)


# ---------------------------------------------------------------------- run without ft_launcher (issue 29.12)

NOT_UNDER_LAUNCHER = {
    "lightning": """
import sys
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from ptl_resiliency import FaultToleranceCallback
Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        callbacks=[FaultToleranceCallback(autoresume=False, calculate_timeouts=True, exp_dir=sys.argv[1])]
        ).fit(BoringModel())
""",
    "integration": """
import sys
import ft_core.client.integration as ft
ft.setup(sys.argv[1], calculate_timeouts=True)
""",
}


def run_script(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python script.py DIR`` as a user runs it, with no ft_launcher variable set."""
    script = tmp_path / "script.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FT_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, str(script), str(tmp_path / "exp")], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("kind", sorted(NOT_UNDER_LAUNCHER))
def test_a_script_run_without_ft_launcher_prints_the_message_alone(kind, tmp_path):
    result = run_script(NOT_UNDER_LAUNCHER[kind], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]  # was ~60 lines of Lightning's loops
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"{FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR} is not set" in last, last
    assert "not started by ft_launcher" in last and "ft_launcher [torchrun options] script.py" in last, last


def test_other_uncaught_errors_keep_their_traceback(tmp_path):
    # The hook is installed once the not-under-ft_launcher error was created (here: caught); every
    # other exception, a RankMonitorClientError too, is shown by the hook that was there before.
    result = run_script("""
from ft_core import RankMonitorClient, RankMonitorClientError
try:
    RankMonitorClient().init_workload_monitoring()
except RankMonitorClientError as err:
    print("caught:", type(err).__name__)
raise RankMonitorClientError("something else went wrong")
""", tmp_path)
    assert result.returncode == 1 and "caught: NotStartedByLauncherError" in result.stdout, result.stderr
    assert "Traceback (most recent call last)" in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        "ft_core.wire.errors.RankMonitorClientError: something else went wrong", result.stderr
