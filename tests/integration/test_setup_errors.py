"""Don't burn allocations: a setup error no restart can fix stops the job (real ft_launcher runs).

Our ``ConfigError`` in a Lightning callback or in ``ft_core.client.integration`` becomes a
``ShutdownWorkload`` request: no restart although ``--max-restarts`` allows them, exit code 64
(which autoresume.sh does not requeue), and the error's message in the launcher's failure line.
A missing training script is a usage error (exit 2) before anything starts; autoresume.sh stops
on it after one attempt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from launcher.exit_codes import EXIT_REPEATED_FAILURE
from tests.launcher_util import events_of, read_events, run_launcher
from tests.workers.autoresume_common import (
    FT_LAUNCHER,
    SCRIPT,
    AutoresumeRun,
    assert_no_leftovers,
    read_history,
)

WORKERS = Path(__file__).resolve().parents[1] / "workers"
LIGHTNING_WORKER = WORKERS / "lightning_train.py"


def test_a_config_error_in_a_lightning_callback_stops_the_job(tmp_path):
    # autoresume=True without FAULT_TOL_FINISHED_FLAG_FILE: every restart would fail the same way.
    events = tmp_path / "events.jsonl"
    cfg = {"callback": "heartbeats", "root": str(tmp_path / "train"), "max_steps": 4, "cb": {"autoresume": True}}
    out = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "3", "--monitor-interval", "0.1",
                        "--ft-event-log", str(events), str(LIGHTNING_WORKER), json.dumps(cfg)], timeout=180)
    assert out.returncode == 64, out.stderr
    records = read_events(events)
    assert len(events_of(records, "cycle_start")) == 1  # not restarted
    [request] = events_of(records, "control_request")
    assert request["action"] == "ShutdownWorkload"
    assert request["description"].startswith("ConfigError: FaultToleranceCallback(autoresume=True) needs "
                                             "FAULT_TOL_FINISHED_FLAG_FILE")
    # One line says it all: the request (or, when the rank died first, its failure) with the error.
    [line] = [line for line in out.stderr.splitlines() if line.startswith("[ft_launcher] cycle 0: rank 0")]
    assert "ConfigError: FaultToleranceCallback(autoresume=True) needs FAULT_TOL_FINISHED_FLAG_FILE" in line, line
    assert line.endswith("ShutdownWorkload requested: stopping all workers, no restart"), line


INTEGRATION_SCRIPT = """
import sys
from ft_core.client.integration import FaultToleranceIntegration

FaultToleranceIntegration().setup(checkpoint_dir=sys.argv[1])
"""


def test_a_config_error_in_the_loop_integration_stops_the_job(tmp_path):
    # ft_launcher's default config (finite initial heartbeat timeout, no sections) cannot serve
    # ft_core.client.integration, which sends no heartbeats: whichever check fails first stops the job.
    script = tmp_path / "loop.py"
    script.write_text(INTEGRATION_SCRIPT)
    events = tmp_path / "events.jsonl"
    out = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "--monitor-interval", "0.1",
                        "--ft-event-log", str(events), str(script), str(tmp_path / "ckpt")], timeout=120)
    assert out.returncode == 64, out.stderr
    records = read_events(events)
    assert len(events_of(records, "cycle_start")) == 1
    requests = events_of(records, "control_request")
    assert requests and all(r["action"] == "ShutdownWorkload" for r in requests)
    description = requests[0]["description"]
    assert description.startswith("ConfigError: ft_core.client.integration: "), description


DEVICES_SCRIPT = """
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from ptl_resiliency import FaultToleranceCallback

# devices=2 while ft_launcher runs one worker (no --nproc-per-node): Lightning refuses in every
# rank before the first step, the same way after every restart.
trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     callbacks=[FaultToleranceCallback(autoresume=False, calculate_timeouts=False)])
trainer.fit(BoringModel())
"""


@pytest.mark.timeout(300)
def test_the_same_setup_error_in_consecutive_cycles_stops_as_a_crash_loop(tmp_path):
    # Issue 29 item 3: before, every restart failed alike (4 cycles with --max-restarts 3, exit 1).
    script = tmp_path / "devices.py"
    script.write_text(DEVICES_SCRIPT)
    events = tmp_path / "events.jsonl"
    out = run_launcher(["--standalone", "--max-restarts", "3", "--monitor-interval", "0.1",
                        "--ft-event-log", str(events), str(script)], timeout=240)
    assert out.returncode == EXIT_REPEATED_FAILURE, out.stderr[-4000:]
    records = read_events(events)
    assert len(events_of(records, "cycle_start")) == 2  # the guard's cycle count, not --max-restarts
    roots = [e for e in events_of(records, "failure") if e["role"] == "root"]
    assert [e["cycle"] for e in roots] == [0, 1] and len({e["fingerprint"] for e in roots}) == 1
    assert all(e.get("root_step") is None for e in roots)  # no step made: none recorded
    assert events_of(records, "result")[-1]["outcome"] == "repeated_failure"
    lines = [line for line in out.stderr.splitlines() if line.startswith("[ft_launcher] ")]
    stop = next(line for line in lines if "ended cycles 0, 1 before the first step" in line)
    assert "ValueError: You set `devices=N`" in stop and "not restarting" in stop, stop
    [summary] = [line for line in lines if line.startswith("[ft_launcher] summary:")]
    assert "ValueError: You set `devices=2` and `num_nodes=1`" in summary, summary
    assert summary.endswith(f"result: repeated_failure (exit code {EXIT_REPEATED_FAILURE})"), summary


def test_autoresume_stops_after_one_attempt_on_a_missing_script(tmp_path):
    private_tmp = Path(tempfile.mkdtemp(prefix="se-"))
    run = AutoresumeRun(tmp_path, private_tmp)
    try:
        out = subprocess.run(
            ["bash", str(SCRIPT), "--launcher", str(FT_LAUNCHER), "--run-dir", str(run.run_dir), "--max-failures",
             "5", "--", "trian.py"],
            env=run._script_env(dict(os.environ)), cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=120, start_new_session=True)
        assert out.returncode == 2, out.stderr
        [attempt] = read_history(run.run_dir)
        assert attempt.decision.startswith("stop: ft_launcher usage error")
        assert "ft_launcher: error: training script 'trian.py' not found" in out.stderr
        assert_no_leftovers(run.token, private_tmp)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def test_the_setup_error_helpers_never_raise_without_a_launcher(monkeypatch):
    import logging

    from ft_core.client.run_errors import record_error_for_launcher
    from ft_core.client.setup_errors import stop_job_for_setup_error
    from ft_core.wire.config import ConfigError

    monkeypatch.delenv("FT_LAUNCHER_IPC_SOCKET", raising=False)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    log = logging.getLogger("test")
    assert stop_job_for_setup_error(ConfigError("x"), log) is False
    assert stop_job_for_setup_error(ValueError("x"), log) is False
    assert record_error_for_launcher(ValueError("x"), log) is False


def test_an_interrupted_recording_of_the_error_is_one_quiet_line(monkeypatch, tmp_path, caplog):
    # Issue 29 item 7: the survivor of a killed peer records its gloo error for the launcher when
    # the launcher's SIGTERM comes; Lightning's SIGTERM handler raises inside the recording. That
    # was a WARNING with the whole gloo message; now one DEBUG line.
    import logging

    from ft_core.client.run_errors import record_error_for_launcher

    class Interrupted(RuntimeError):
        def __str__(self) -> str:  # torch formats the exception: the handler fires there
            raise RuntimeError("Connection closed by peer [127.0.0.1]:54485.\nCheck the logs")

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    log = logging.getLogger("tests.record_error")
    with caplog.at_level(logging.DEBUG, logger="tests.record_error"):
        assert record_error_for_launcher(Interrupted(), log) is False
    [record] = caplog.records
    assert record.levelno == logging.DEBUG and record.exc_info is None
    assert record.getMessage() == ("fault tolerance: recording Interrupted for the launcher was interrupted: "
                                   "RuntimeError: Connection closed by peer [127.0.0.1]:54485.")
