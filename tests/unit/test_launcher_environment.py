"""The launcher's environment set-up (launcher.node.environment) and what a usage error leaves behind
(launcher.launch): one function changes the environment, and nothing is left of a run that could
not start."""

from __future__ import annotations

import os
import tempfile

import pytest

from ft_core import FaultToleranceConfig
from ft_core.wire.env import (
    FT_LAUNCHER_KEEP_FD_ENV_VAR,
    FT_LAUNCHER_PARENT_PID_ENV_VAR,
    FT_LAUNCHER_RESULT_FILE_ENV_VAR,
    FT_LAUNCHER_RUN_ENV_VAR,
)
from launcher import get_args_parser
from launcher.exit_codes import LauncherUsageError
from launcher.node.environment import SHARE_STORE_ENV, SIGNALS_TO_HANDLE_ENV, set_up_environment
from launcher.options import LauncherOptions

SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


def test_autoresume_variables_are_taken_out_and_the_runs_are_set(tmp_path):
    read_fd, write_fd = os.pipe()
    try:
        environ = {FT_LAUNCHER_PARENT_PID_ENV_VAR: str(os.getppid()), FT_LAUNCHER_KEEP_FD_ENV_VAR: str(read_fd),
                   FT_LAUNCHER_RESULT_FILE_ENV_VAR: str(tmp_path / "result.json"), "OTHER": "x"}
        env = set_up_environment(SIGNALS, environ)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert (env.parent_pid, env.keep_fd, env.result_file) == (os.getppid(), read_fd, str(tmp_path / "result.json"))
    assert environ == {"OTHER": "x", FT_LAUNCHER_RUN_ENV_VAR: env.token, SHARE_STORE_ENV: "1",
                       SIGNALS_TO_HANDLE_ENV: "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}  # USR1/2 are passed on by us
    assert env.token.startswith(f"{os.getpid()}-")
    assert set_up_environment(SIGNALS, {}).token != env.token  # one per run


def test_the_users_choice_of_a_shared_store_is_kept():
    environ = {SHARE_STORE_ENV: "0"}
    set_up_environment("SIGTERM", environ)
    assert environ[SHARE_STORE_ENV] == "0"


@pytest.mark.parametrize(("name", "value", "fragment"), [
    (FT_LAUNCHER_PARENT_PID_ENV_VAR, "1", "must be a process id, got '1'"),
    (FT_LAUNCHER_PARENT_PID_ENV_VAR, "me", "must be a process id, got 'me'"),
    (FT_LAUNCHER_KEEP_FD_ENV_VAR, "2", "must be an open file descriptor >= 3, got '2'"),
    (FT_LAUNCHER_KEEP_FD_ENV_VAR, "987654", "must be an open file descriptor >= 3, got '987654'"),
    (FT_LAUNCHER_RESULT_FILE_ENV_VAR, "/nonexistent/dir/result.json", "must be in an existing directory"),
])
def test_an_invalid_variable_is_a_usage_error_and_changes_nothing(name, value, fragment):
    environ = {name: value}
    with pytest.raises(LauncherUsageError, match=f"{name} {fragment}"):
        set_up_environment(SIGNALS, environ)
    assert environ == {name: value}


@pytest.fixture
def tmpdir_base(monkeypatch):
    """A fresh, private $TMPDIR for the launcher's run directory."""
    path = tempfile.mkdtemp(prefix="ftt-base-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    os.rmdir(path)


@pytest.mark.parametrize(("argv", "environ", "fragment"), [
    (["--nproc-per-node", "0"], {}, "--nproc-per-node must be a whole number"),
    ([], {FT_LAUNCHER_KEEP_FD_ENV_VAR: "2"}, FT_LAUNCHER_KEEP_FD_ENV_VAR),
])
def test_a_run_that_cannot_start_leaves_no_run_directory(tmpdir_base, monkeypatch, argv, environ, fragment):
    from launcher.launch import launch

    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(FT_LAUNCHER_RUN_ENV_VAR, raising=False)
    args = get_args_parser().parse_args(["--standalone", *argv, "train.py"])
    with pytest.raises(LauncherUsageError, match=fragment):
        launch(args, FaultToleranceConfig(), LauncherOptions.from_args(args, {}))
    assert os.listdir(tmpdir_base) == []  # the run directory was made, then removed again
    assert FT_LAUNCHER_RUN_ENV_VAR not in os.environ  # nothing set for a run that never started
