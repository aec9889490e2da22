"""The Lightning callbacks with a real Trainer and a real rank monitor (one rank, no launcher).

Runs that may be killed (hangs, simulated faults) or that calculate timeouts (which could be tight
enough to catch a slow pytest process) run in a child process (tests/workers/lightning_train.py);
the others run in-process, which is faster. The monitor reports to a ``MonitorLink``, as it does
to ft_launcher, so tests see what the monitor enforced.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ft_core import FaultToleranceConfig, RankMonitorClientError
from ft_core.client.simulated_fault import SimulatedFaultParams, plan_simulated_fault
from ft_core.monitor.link import MonitorLink
from ft_core.wire import protocol
from ft_core.wire.config import ConfigError
from ft_core.wire.env import FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from tests.monitor_events import received, wait_event

WORKERS = Path(__file__).resolve().parents[1] / "workers"
TRAIN_WORKER = WORKERS / "lightning_train.py"
KINDS = ["heartbeats", "sections"]
LONG = 60.0


# Minimums of calculated timeouts far below the safe defaults (60-600 s), so that the tests see
# the calculated values themselves and a hang is caught by them in seconds.
SMALL_MINIMUMS = dict(min_calculated_initial_heartbeat_timeout=0.1, min_calculated_heartbeat_timeout=0.1,
                      min_calculated_section_timeout=0.1, min_calculated_out_of_section_timeout=0.1)


def fixed_cfg(kind: str, **overrides) -> FaultToleranceConfig:
    """Long fixed timeouts for the API of callback ``kind`` (the other API's are off), so that
    only what a test shortens can fire."""
    if kind == "heartbeats":
        values = dict(initial_rank_heartbeat_timeout=LONG, rank_heartbeat_timeout=LONG)
    else:
        values = dict(
            initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
            rank_section_timeouts={"setup": LONG, "step": LONG, "checkpointing": LONG},
            rank_out_of_section_timeout=LONG,
        )
    values.update(SMALL_MINIMUMS)
    values.update(overrides)
    return FaultToleranceConfig(**values)


def reports(root: Path, rank: int = 0, cycle: int = 0) -> list[dict]:
    path = root / f"report_rank{rank}_cycle{cycle}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def report(root: Path, op: str, index: int = -1, **where) -> dict:
    found = [r for r in reports(root, **where) if r["op"] == op]
    assert found, f"no {op!r} report in {root}: {reports(root, **where)}"
    return found[index]


class Monitor:
    def __init__(self, handle, path: str, link: MonitorLink, spawn_rank) -> None:
        self.handle = handle
        self.path = path
        self.link = link
        self._spawn_rank = spawn_rank

    def events(self, kind: str) -> list[dict]:
        """Events of ``kind`` received so far and not yet returned by :func:`wait_event`."""
        return received(self.link, kind)

    def assert_released(self) -> None:
        """The trainer let go of the monitor: another process is now accepted as its rank (a
        monitor refuses a second live rank while the first is attached)."""
        rank = self._spawn_rank([["init"], ["shutdown"]], self.path)
        assert rank.wait(30) == 0, rank.stderr()


@pytest.fixture
def monitor(start_monitor, spawn_rank, monkeypatch):
    """Factory ``monitor(cfg) -> Monitor``: a real monitor this process is pointed at."""
    monkeypatch.delenv(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, raising=False)
    links = []

    def factory(cfg: FaultToleranceConfig) -> Monitor:
        handle, path = start_monitor(cfg)
        link = MonitorLink(path)
        links.append(link)
        monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
        return Monitor(handle, path, link, spawn_rank)

    yield factory
    for link in links:
        link.close()


class TrainerProcess:
    """``lightning_train.py`` in its own session; output goes to a log file."""

    def __init__(self, cfg: dict, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(TRAIN_WORKER), json.dumps(cfg)], env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"trainer did not finish in {timeout} s:\n{self.output()}") from None

    def output(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def spawn_trainer(tmp_path):
    """Factory ``spawn_trainer(cfg, monitor=None, flag=None) -> TrainerProcess`` (killed at teardown)."""
    procs: list[TrainerProcess] = []

    def factory(cfg: dict, monitor: Monitor | None = None, flag: Path | None = None) -> TrainerProcess:
        env = {k: v for k, v in os.environ.items()
               if k not in (FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR)}
        env["OMP_NUM_THREADS"] = "1"
        if monitor is not None:
            env[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = monitor.path
        if flag is not None:
            env[FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR] = str(flag)
        proc = TrainerProcess(cfg, tmp_path / f"trainer{len(procs)}.log", env)
        procs.append(proc)
        return proc

    yield factory
    for proc in procs:
        proc.kill()


@pytest.fixture
def train():
    """In-process ``run(cfg)`` of the worker (imported lazily: Lightning takes seconds)."""
    from tests.workers.lightning_train import run

    return run


# ---------------------------------------------------------------------- setup errors


@pytest.mark.parametrize("kind", KINDS)
def test_not_started_by_ft_launcher_is_a_clear_error_that_is_not_masked(kind, train, tmp_path, monkeypatch):
    monkeypatch.delenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, raising=False)
    with pytest.raises(RankMonitorClientError) as info:
        train({"callback": kind, "root": str(tmp_path), "max_steps": 2})
    message = str(info.value)
    assert FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR in message and "not started by ft_launcher" in message
    assert "not initialised" not in message and "not initialized" not in message


@pytest.mark.parametrize("kind", KINDS)
def test_autoresume_without_the_flag_variable_is_a_clear_error(kind, monitor, train, tmp_path):
    mon = monitor(fixed_cfg(kind))
    with pytest.raises(ConfigError, match=FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR):
        train({"callback": kind, "root": str(tmp_path), "max_steps": 2, "cb": {"autoresume": True}})
    assert not mon.events(protocol.MSG_RANK_CONNECTED)  # refused before connecting


@pytest.mark.parametrize(
    ("kind", "cfg", "text"),
    [
        pytest.param("heartbeats", fixed_cfg("heartbeats", rank_heartbeat_timeout=None),
                     "rank_heartbeat_timeout=None) and calculate_timeouts=False", id="heartbeats-infinite"),
        pytest.param("sections",
                     fixed_cfg("sections", rank_section_timeouts={"setup": 5, "step": None, "checkpointing": 5}),
                     "'step': None", id="sections-infinite"),
        pytest.param("sections", fixed_cfg("sections", rank_out_of_section_timeout=None),
                     "rank_out_of_section_timeout=None) and calculate_timeouts=False", id="out-of-section-infinite"),
        pytest.param("heartbeats", fixed_cfg("heartbeats", rank_out_of_section_timeout=30),
                     "rank_out_of_section_timeout=30.0 is set, but this callback opens no sections",
                     id="heartbeats-with-out-of-section-timeout"),
        pytest.param("sections",
                     fixed_cfg("sections", initial_rank_heartbeat_timeout=3600, rank_heartbeat_timeout=2700),
                     "initial_rank_heartbeat_timeout=3600.0 is finite, but this front end sends no heartbeats "
                     "and sections are not heartbeats", id="sections-with-finite-heartbeat-timeouts"),
    ],
)
def test_timeouts_that_cannot_work_are_a_clear_error(kind, cfg, text, monitor, train, tmp_path):
    mon = monitor(cfg)
    with pytest.raises(ConfigError) as info:
        train({"callback": kind, "root": str(tmp_path), "max_steps": 2})
    assert text in str(info.value)
    # It connected to find out, and disconnected again: nothing left behind.
    wait_event(mon.link, protocol.MSG_RANK_CONNECTED)
    mon.assert_released()


def test_sections_missing_from_the_config_are_named(monitor, train, tmp_path):
    monitor(fixed_cfg("sections", rank_section_timeouts={"step": 5}))
    with pytest.raises(ConfigError, match="missing: setup, checkpointing"):
        train({"callback": "sections", "root": str(tmp_path), "max_steps": 2,
               "cb": {"calculate_timeouts": True}})


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_in_model_setup_after_connecting_reaches_the_user_unmasked(
        kind, monitor, train, tmp_path, monkeypatch):
    flag = tmp_path / "finished.flag"
    monkeypatch.setenv(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, str(flag))
    mon = monitor(fixed_cfg(kind))
    with pytest.raises(ValueError, match="model setup failed on purpose"):
        train({"callback": kind, "root": str(tmp_path), "max_steps": 2, "fail_in_setup": True,
               "cb": {"autoresume": True}})
    wait_event(mon.link, protocol.MSG_RANK_CONNECTED)
    mon.assert_released()
    assert not flag.exists()


def test_invalid_constructor_arguments_are_named():
    from ptl_resiliency import FaultToleranceCallback, FaultToleranceSectionsCallback

    with pytest.raises(ValueError, match="autoresume must be True or False, got 'yes'"):
        FaultToleranceCallback(autoresume="yes", calculate_timeouts=False)
    with pytest.raises(ValueError, match="fault_type must be one of .* got 'crash'"):
        FaultToleranceCallback(False, False, simulated_fault_params={"fault_type": "crash", "base_delay": 1})
    with pytest.raises(ValueError, match="exc_handling_policy must be a callable"):
        FaultToleranceSectionsCallback(False, False, exc_handling_policy="shutdown")


# ---------------------------------------------------------------------- completion and the flag


COMPLETION_CASES = [
    pytest.param({"max_steps": 6}, "max_steps=6 reached", id="max-steps"),
    pytest.param({"max_epochs": 2, "limit_train_batches": 3}, "max_epochs=2 reached", id="max-epochs"),
    pytest.param({"max_time": 1, "max_epochs": 10000, "limit_train_batches": 4, "step_sleep": 0.02},
                 "max_time reached", id="max-time"),
    pytest.param({"max_epochs": 100, "limit_train_batches": 3, "early_stop": True},
                 "stopped by EarlyStopping", id="early-stopping"),
    pytest.param({"max_steps": 50, "fail": {"step": 2, "exc": "SystemExit0"}},
                 "clean SystemExit(0)", id="systemexit-0"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("extra", "reason"), COMPLETION_CASES)
def test_completed_training_creates_the_flag(kind, extra, reason, monitor, train, tmp_path, monkeypatch):
    flag = tmp_path / "sub" / "finished.flag"
    monkeypatch.setenv(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, str(flag))
    mon = monitor(fixed_cfg(kind))
    cfg = {"callback": kind, "root": str(tmp_path), "cb": {"autoresume": True}, **extra}
    if "SystemExit0" in json.dumps(extra):
        with pytest.raises(SystemExit) as info:
            train(cfg)
        assert info.value.code == 0
    else:
        train(cfg)
    content = json.loads(flag.read_text())
    assert content["completed"] is True and content["reason"] == reason
    assert not [p for p in flag.parent.iterdir() if p.name != flag.name]  # no temp file left
    mon.assert_released()
    assert not mon.events(protocol.MSG_RANK_HANG)


NOT_COMPLETED_CASES = [
    pytest.param({"fail": {"step": 2, "exc": "RuntimeError"}}, RuntimeError, id="exception"),
    pytest.param({"fail": {"step": 2, "exc": "SystemExit1"}}, SystemExit, id="systemexit-1"),
    pytest.param({"fail": {"step": 2, "exc": "ShouldStop"}}, None, id="stopped-by-user"),
    # Lightning counts the cut-short epoch as processed: "max_epochs=1 reached" was written.
    pytest.param({"max_steps": -1, "max_epochs": 1, "fail": {"step": 5, "exc": "ShouldStop"}}, None,
                 id="stopped-by-user-in-the-last-epoch"),
    # A smoke test: Lightning sets max_steps=1, which the user never asked for.
    pytest.param({"max_steps": -1, "fast_dev_run": True}, None, id="fast-dev-run"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("extra", "raises"), NOT_COMPLETED_CASES)
def test_interrupted_training_leaves_no_flag(kind, extra, raises, monitor, train, tmp_path, monkeypatch, caplog):
    flag = tmp_path / "finished.flag"
    monkeypatch.setenv(FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR, str(flag))
    mon = monitor(fixed_cfg(kind))
    cfg = {"callback": kind, "root": str(tmp_path), "max_steps": 20, "cb": {"autoresume": True}, **extra}
    caplog.set_level(logging.INFO, logger="ptl_resiliency")
    if raises is None:
        train(cfg)
    else:
        with pytest.raises(raises):
            train(cfg)
    assert not flag.exists()
    assert "training did not complete" in caplog.text
    mon.assert_released()


def test_keyboard_interrupt_leaves_no_flag(monitor, spawn_trainer, tmp_path):
    # In a child: Lightning ignores SIGINT for good after a KeyboardInterrupt.
    flag = tmp_path / "finished.flag"
    mon = monitor(fixed_cfg("heartbeats"))
    proc = spawn_trainer({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 20,
                          "cb": {"autoresume": True}, "fail": {"step": 2, "exc": "KeyboardInterrupt"}},
                         mon, flag)
    assert proc.wait() == 1, proc.output()
    assert not flag.exists()
    assert "training did not complete" in proc.output()


# ---------------------------------------------------------------------- the state file


BAD_VALUE = {
    # Each callback reads only its own part of the file.
    "heartbeats": ({"version": 1, "hb_timeouts": {"initial": -5, "subsequent": 3, "were_calculated": True}},
                   "hb_timeouts.initial must be a number of seconds > 0"),
    "sections": ({"version": 1, "section_timeouts": {"section": {"step": -5}, "calculated_sections": ["step"]}},
                 "section_timeouts.section[step] must be a number of seconds > 0"),
}


@pytest.mark.parametrize(
    ("content", "text"),
    [
        pytest.param("{not json", "not valid JSON", id="not-json"),
        pytest.param("[1, 2]", "expected a JSON object", id="not-an-object"),
        pytest.param(None, None, id="bad-value"),
        pytest.param("\udcff", "not UTF-8", id="binary"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_corrupt_state_file_is_ignored_with_a_warning(kind, content, text, monitor, train, tmp_path, caplog):
    if content is None:
        content, text = json.dumps(BAD_VALUE[kind][0]), BAD_VALUE[kind][1]
    state = tmp_path / "exp" / "_ft_state.json"
    state.parent.mkdir()
    state.write_bytes(content.encode("utf-8", "surrogateescape"))
    monitor(fixed_cfg(kind))
    caplog.set_level(logging.INFO, logger="ptl_resiliency")
    trainer = train({"callback": kind, "root": str(tmp_path), "max_steps": 3,
                     "cb": {"calculate_timeouts": True, "exp_dir": str(state.parent)}})
    assert trainer.global_step == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and str(state) in r.getMessage()]
    assert len(warnings) == 1 and text in warnings[0].getMessage()
    started = report(tmp_path, "started")
    assert started["hb"]["were_calculated"] is False and started["sections"]["calculated_sections"] == []
    assert state.read_bytes() == content.encode("utf-8", "surrogateescape")  # too little data: untouched


@pytest.mark.parametrize("logger", ["none", "csv"])
def test_default_state_file_is_under_the_default_root_dir(logger, monitor, train, tmp_path):
    # Not under trainer.log_dir: a CSV or TensorBoard logger's version_N changes with every run
    # (the next run would not find the timeouts), and loggers without a save_dir make it None.
    monitor(fixed_cfg("heartbeats"))
    train({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2, "cb": {"calculate_timeouts": True},
           "logger": logger})
    started = report(tmp_path, "started")
    assert started["state_file"] == str(tmp_path / "ft_state" / "_ft_state.json")
    if logger == "csv":
        assert started["log_dir"] == str(tmp_path / "lightning_logs" / "version_0")
    else:
        assert started["log_dir"] == str(tmp_path)  # logger=False: Lightning's log_dir is the root


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_too_little_data_skips_the_update_with_a_log_line(kind, monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg(kind))
    base = {"callback": kind, "root": str(tmp_path), "ckpt_every": 1, "cb": {"calculate_timeouts": True}}
    first = spawn_trainer({**base, "max_steps": 2}, mon)
    assert first.wait() == 0, first.output()
    # The resumed run loads and saves a checkpoint but does a single iteration.
    proc = spawn_trainer({**base, "max_steps": 3, "resume": True}, mon)
    assert proc.wait() == 0, proc.output()
    out = proc.output()
    if kind == "heartbeats":
        assert "heartbeat timeouts not updated: too little data (1 training iterations" in out
        assert not (tmp_path / "ft_state" / "_ft_state.json").exists()
    else:
        # checkpointing and setup durations were seen; the step needs 16 iterations
        assert "section timeouts in force (calculated): checkpointing " in out
        state = json.loads((tmp_path / "ft_state" / "_ft_state.json").read_text())
        assert state["section_timeouts"]["calculated_sections"] == ["checkpointing", "setup"]
        assert state["section_timeouts"]["section"]["step"] == LONG
    assert "Traceback" not in out
    assert not mon.events(protocol.MSG_RANK_HANG)


# ---------------------------------------------------------------------- hangs


def test_heartbeat_hang_is_detected(monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg("heartbeats", rank_heartbeat_timeout=1.0))
    proc = spawn_trainer({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 50,
                          "hang": {"where": "step", "step": 5}}, mon)
    event = wait_event(mon.link, protocol.MSG_RANK_HANG)
    assert proc.wait() == -signal.SIGKILL
    assert event["kind"] == "heartbeat" and event["timeout"] == 1.0
    assert event["pid"] == proc.proc.pid
    assert event["heartbeats"] >= 6  # train start + 5 batch ends


SECTION_HANGS = [
    pytest.param("setup", {"where": "setup"}, "section", "setup", id="setup"),
    pytest.param("step", {"where": "step", "step": 3}, "section", "step", id="step"),
    pytest.param("checkpointing", {"where": "checkpoint", "save": 2}, "section", "checkpointing",
                 id="checkpointing"),
    pytest.param(None, {"where": "epoch_end"}, "out_of_section", None, id="out-of-section"),
    # The first batch is a warm-up batch, out of any section (as in ft_core.client.integration).
    pytest.param(None, {"where": "step", "step": 0}, "out_of_section", None, id="warm-up-step"),
]


@pytest.mark.parametrize(("short", "hang", "kind", "section"), SECTION_HANGS)
def test_a_hang_is_reported_with_its_section_and_that_sections_timeout(
        short, hang, kind, section, monitor, spawn_trainer, tmp_path):
    sections = {"setup": LONG, "step": LONG, "checkpointing": LONG}
    oos = LONG
    if short is None:
        oos = 1.0
    else:
        sections[short] = 1.0
    cfg = fixed_cfg("sections", rank_section_timeouts=sections, rank_out_of_section_timeout=oos)
    mon = monitor(cfg)
    proc = spawn_trainer({"callback": "sections", "root": str(tmp_path), "max_epochs": 3,
                          "limit_train_batches": 4, "ckpt_every": 2, "hang": hang}, mon)
    event = wait_event(mon.link, protocol.MSG_RANK_HANG)
    assert proc.wait() == -signal.SIGKILL
    assert event["kind"] == kind and event["section"] == section
    assert event["timeout"] == 1.0
    assert (f"section {section!r} open" if section else "out of any section") in event["cause"]


def test_a_hang_in_async_checkpoint_finalisation_is_reported_as_checkpointing(monitor, spawn_trainer, tmp_path):
    # The write hangs in AsyncCheckpointIO's thread; training goes on, and the wait for the
    # pending write at teardown (its finalisation) is what hangs, inside 'checkpointing'.
    cfg = fixed_cfg("sections", rank_section_timeouts={"setup": LONG, "step": LONG, "checkpointing": 1.0})
    mon = monitor(cfg)
    proc = spawn_trainer({"callback": "sections", "root": str(tmp_path), "max_steps": 8, "ckpt_every": 2,
                          "async_ckpt": True, "hang": {"where": "checkpoint", "save": 1}}, mon)
    event = wait_event(mon.link, protocol.MSG_RANK_HANG)
    assert proc.wait() == -signal.SIGKILL
    assert event["kind"] == "section" and event["section"] == "checkpointing"
    assert report(tmp_path, "train_end")["global_step"] == 8  # training itself went on


def test_async_checkpointing_completes_and_saves(monitor, train, tmp_path):
    mon = monitor(fixed_cfg("sections"))
    train({"callback": "sections", "root": str(tmp_path), "max_steps": 6, "ckpt_every": 2, "async_ckpt": True})
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} >= {"last.ckpt", "epoch=0-step=6.ckpt"}
    assert not mon.events(protocol.MSG_RANK_HANG)


# ---------------------------------------------------------------------- calculated timeouts


@pytest.mark.slow
def test_heartbeat_timeouts_are_calculated_after_a_load_and_a_save_and_enforced_next_run(
        monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg("heartbeats", safety_factor=10.0))
    state_path = tmp_path / "ft_state" / "_ft_state.json"
    base = {"callback": "heartbeats", "root": str(tmp_path), "ckpt_every": 5, "step_sleep": 0.05,
            "cb": {"calculate_timeouts": True}}
    first = spawn_trainer({**base, "max_steps": 10}, mon)
    assert first.wait() == 0, first.output()
    assert "heartbeat timeouts not updated: a run must both load and save" in first.output()
    assert not state_path.exists()

    second = spawn_trainer({**base, "max_steps": 20, "resume": True}, mon)
    assert second.wait() == 0, second.output()
    saved = json.loads(state_path.read_text())["hb_timeouts"]
    assert saved["were_calculated"] is True
    assert 0.5 <= saved["subsequent"] < LONG and 0 < saved["initial"] < LONG  # >= 10 x 0.05 s steps

    third = spawn_trainer({**base, "max_steps": 40, "resume": True, "hang": {"where": "step", "step": 24}}, mon)
    event = wait_event(mon.link, protocol.MSG_RANK_HANG)
    assert third.wait() == -signal.SIGKILL
    assert report(tmp_path, "started", index=-1)["hb"] == saved  # loaded at setup
    assert event["kind"] == "heartbeat"
    assert event["timeout"] == pytest.approx(saved["subsequent"])


@pytest.mark.slow
def test_section_timeouts_are_calculated_after_16_iterations_and_enforced_next_run(monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg("sections", safety_factor=10.0))
    state_path = tmp_path / "ft_state" / "_ft_state.json"
    base = {"callback": "sections", "root": str(tmp_path), "ckpt_every": 6, "step_sleep": 0.02,
            "between_steps_sleep": 0.02, "cb": {"calculate_timeouts": True}}
    # 12 iterations: too few for 'step'; at the end only 'checkpointing' is calculated.
    first = spawn_trainer({**base, "max_steps": 12}, mon)
    assert first.wait() == 0, first.output()
    # ... and already after the save at iteration 6: each save updates what there is data for.
    assert report(tmp_path, "train_end")["sections"]["calculated_sections"] == ["checkpointing"]
    sections = json.loads(state_path.read_text())["section_timeouts"]
    assert sections["calculated_sections"] == ["checkpointing"]
    assert sections["is_out_of_section_calculated"] is False
    assert sections["section"]["step"] == LONG and sections["out_of_section"] == LONG

    # Resumed (so 'setup' includes a checkpoint load): after the save at iteration 18 all sections.
    second = spawn_trainer({**base, "max_steps": 30, "resume": True}, mon)
    assert second.wait() == 0, second.output()
    sections = json.loads(state_path.read_text())["section_timeouts"]
    assert sections["calculated_sections"] == ["checkpointing", "setup", "step"]
    assert sections["is_out_of_section_calculated"] is True
    assert 0.2 <= sections["section"]["step"] < LONG  # >= 10 x 0.02 s
    assert 0.2 <= sections["out_of_section"] < LONG
    # the update after the save was in force before the run ended
    calculated = report(tmp_path, "train_end", index=-1)["sections"]["calculated_sections"]
    assert calculated == ["checkpointing", "setup", "step"]

    third = spawn_trainer({**base, "max_steps": 60, "resume": True, "hang": {"where": "step", "step": 33}}, mon)
    event = wait_event(mon.link, protocol.MSG_RANK_HANG)
    assert third.wait() == -signal.SIGKILL, third.output()
    assert report(tmp_path, "started", index=-1)["sections"] == sections
    assert event["kind"] == "section" and event["section"] == "step"
    assert event["timeout"] == pytest.approx(sections["section"]["step"])


# ------------------------------------------------------- the rules shared with ft_core.client.integration


def test_warm_up_batches_are_out_of_section(monitor, train, tmp_path):
    # The first batch of the run and the first of each validation run (the sanity check's
    # included) are not wrapped in 'step', as in ft_core.client.integration (seed 004).
    monitor(fixed_cfg("sections"))
    train({"callback": "sections", "root": str(tmp_path), "max_steps": 4, "limit_val_batches": 3,
           "val_check_interval": 2, "num_sanity_val_steps": 2, "record_sections": True})
    batches = [(r["kind"], r["index"], r["open"]) for r in reports(tmp_path) if r["op"] == "batch"]
    step, none = ["step"], []
    assert batches == [
        ("sanity", 0, none), ("sanity", 1, step),
        ("train", 0, none), ("train", 1, step),
        ("validation", 0, none), ("validation", 1, step), ("validation", 2, step),
        ("train", 2, step), ("train", 3, step),
        ("validation", 0, none), ("validation", 1, step), ("validation", 2, step),
    ]


@pytest.mark.slow
def test_asynchronous_checkpointing_leaves_the_checkpointing_timeout_alone(monitor, spawn_trainer, tmp_path):
    # With an asynchronous checkpoint IO the section's duration varies too much between runs
    # (a save may finish in the background or be waited for): it is not calculated, as after an
    # asynchronous finalisation in ft_core.client.integration.
    mon = monitor(fixed_cfg("sections", safety_factor=10.0))
    proc = spawn_trainer({"callback": "sections", "root": str(tmp_path), "max_steps": 20, "ckpt_every": 5,
                          "async_ckpt": True, "cb": {"calculate_timeouts": True}}, mon)
    assert proc.wait() == 0, proc.output()
    sections = json.loads((tmp_path / "ft_state" / "_ft_state.json").read_text())["section_timeouts"]
    assert sections["calculated_sections"] == ["step"]
    assert sections["section"]["checkpointing"] == LONG
    out = proc.output()
    assert "asynchronous checkpoint IO: the checkpointing timeout is not calculated" in out
    assert "checkpointing timeout not calculated: asynchronous checkpoint finalisation" in out
    assert not mon.events(protocol.MSG_RANK_HANG)


def test_runs_of_both_callbacks_share_an_exp_dir_without_taking_each_others_timeouts(monitor, train, tmp_path):
    # A sections run calculated an out-of-section timeout; a heartbeats run with the same exp_dir
    # must neither load it (it opens no section: the monitor would stop it) nor wipe it.
    exp = tmp_path / "exp"
    exp.mkdir()
    sections = {"section": {"setup": 20.0, "step": 5.0, "checkpointing": 9.0}, "out_of_section": 7.0,
                "calculated_sections": ["checkpointing", "setup", "step"], "is_out_of_section_calculated": True}
    (exp / "_ft_state.json").write_text(json.dumps({"version": 1, "section_timeouts": sections}))
    monitor(fixed_cfg("heartbeats"))
    trainer = train({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 3,
                     "cb": {"calculate_timeouts": True, "exp_dir": str(exp)}})
    assert trainer.global_step == 3
    started = report(tmp_path, "started")
    assert started["sections"]["out_of_section"] is None and started["sections"]["calculated_sections"] == []
    assert json.loads((exp / "_ft_state.json").read_text())["section_timeouts"] == sections


# ---------------------------------------------------------------------- workload control


def test_a_failing_exc_handling_policy_delivery_does_not_mask_the_error(monitor, train, tmp_path, monkeypatch, caplog):
    # No launcher here: the request cannot be delivered; that is logged, the original error raised.
    monkeypatch.delenv("FT_LAUNCHER_IPC_SOCKET", raising=False)
    monitor(fixed_cfg("sections"))
    caplog.set_level(logging.INFO, logger="ptl_resiliency")
    with pytest.raises(RuntimeError, match="training step failed on purpose"):
        train({"callback": "sections", "root": str(tmp_path), "max_steps": 20, "policy": "shutdown",
               "fail": {"step": 2, "exc": "RuntimeError"}})
    assert "could not send ShutdownWorkload" in caplog.text


# ---------------------------------------------------------------------- simulated faults


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"fault_type": "crash", "base_delay": 1},
         "fault_type must be one of rank_killed, rank_hung, random, got 'crash'"),
        ({"fault_type": "rank_killed", "base_delay": -1}, "base_delay must be a finite number of seconds >= 0, got -1"),
        ({"fault_type": "rank_killed", "base_delay": 1, "rand_delay": float("nan")}, "rand_delay"),
        ({"fault_type": "rank_killed", "base_delay": 1, "rank_to_fail": -2},
         "rank_to_fail must be a rank number >= 0 or None, got -2"),
        ({"fault_type": "rank_killed", "base_delay": 1, "delay": 3}, "unknown key(s) delay"),
        ({"fault_type": "rank_killed"}, "missing key(s) base_delay"),
        ("rank_killed", "must be a SimulatedFaultParams or a dict"),
    ],
)
def test_simulated_fault_params_are_validated(value, text):
    with pytest.raises(ValueError) as info:
        SimulatedFaultParams.from_value(value)
    assert text in str(info.value)


def test_simulated_fault_plan_in_one_process(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    plan = plan_simulated_fault({"fault_type": "random", "base_delay": 1, "rand_delay": 2}, random.Random(3))
    assert plan.rank_to_fail == 0 and plan.fault_type in ("rank_killed", "rank_hung")
    assert 1.0 <= plan.delay <= 3.0
    with pytest.raises(ValueError, match="rank_to_fail=1 but the world has only 1 rank"):
        plan_simulated_fault(SimulatedFaultParams("rank_hung", 1, rank_to_fail=1))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="cannot agree on a random rank; set rank_to_fail"):
        plan_simulated_fault(SimulatedFaultParams("rank_hung", 1))


def test_ranks_agree_on_the_simulated_fault_over_gloo(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = json.dumps({"fault_type": "random", "base_delay": 1.0, "rand_delay": 5.0})
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKERS / "lightning_fault_plan.py"), params],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    try:
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    assert [p.returncode for p in procs] == [0, 0], outputs
    plans = [json.loads(out) for out, _ in outputs]
    assert [p["rank"] for p in plans] == [0, 1]
    first, second = ({k: v for k, v in p.items() if k not in ("rank", "pid")} for p in plans)
    assert first == second
    assert first["rank_to_fail"] in (0, 1) and first["fault_type"] in ("rank_killed", "rank_hung")
    assert 1.0 <= first["delay"] <= 6.0


def test_simulated_rank_killed(monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg("heartbeats"))
    started = time.monotonic()
    proc = spawn_trainer({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2000, "step_sleep": 0.01,
                          "fault": {"params": {"fault_type": "rank_killed", "base_delay": 0.5}}}, mon)
    assert proc.wait() == -signal.SIGKILL
    assert time.monotonic() - started < 30
    assert "simulated fault rank_killed: sending SIGKILL" in proc.output()
    mon.assert_released()  # the monitor noticed the death and serves the next rank...
    assert not mon.events(protocol.MSG_RANK_HANG)  # ...and saw no hang


def test_simulated_rank_hung_is_caught_by_the_monitor(monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg("heartbeats", rank_heartbeat_timeout=1.0))
    proc = spawn_trainer({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2000, "step_sleep": 0.01,
                          "fault": {"params": {"fault_type": "rank_hung", "base_delay": 0.5}}}, mon)
    event = wait_event(mon.link, protocol.MSG_RANK_HANG)
    assert proc.wait() == -signal.SIGKILL  # SIGCONT, then the termination signal
    assert event["kind"] == "heartbeat" and event["timeout"] == 1.0
    assert "simulated fault rank_hung: sending SIGSTOP" in proc.output()


def test_simulated_fault_is_cancelled_when_training_ends_first(monitor, spawn_trainer, tmp_path):
    mon = monitor(fixed_cfg("heartbeats"))
    proc = spawn_trainer({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2, "linger": 2.0,
                          "fault": {"params": {"fault_type": "rank_killed", "base_delay": 1.0}}}, mon)
    assert proc.wait() == 0, proc.output()  # still alive 1 s after the planned fault
    assert "simulated fault rank_killed scheduled on this rank in 1.00 s" in proc.output()
    assert "sending SIGKILL" not in proc.output()


def test_one_fault_tolerance_callback_per_trainer(monitor, train, tmp_path):
    monitor(fixed_cfg("heartbeats"))
    with pytest.raises(ConfigError,
                       match="one fault tolerance callback, but it also has FaultToleranceSectionsCallback"):
        train({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2, "both_callbacks": True})


def test_ft_core_simulated_fault_does_not_import_torch():
    code = "import sys, ft_core.client.simulated_fault; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_the_same_callback_instance_twice_is_named(monitor, train, tmp_path):
    monitor(fixed_cfg("heartbeats"))
    with pytest.raises(ConfigError, match="the same instance is in the Trainer's callbacks 2 times; pass it once"):
        train({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2, "duplicate_callback": True})


def csv_metrics(root: Path) -> list[dict[str, str]]:
    import csv

    [path] = root.glob("lightning_logs/version_*/metrics.csv")
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def logged(rows: list[dict[str, str]], name: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[name])) for row in rows if row.get(name)]


@pytest.mark.slow
def test_callbacks_log_the_cycle_and_the_timeouts_in_force_when_they_change(monitor, spawn_trainer, tmp_path,
                                                                            monkeypatch):
    # In a child: the run calculates timeouts. The cycle comes from ft_launcher's variable.
    monkeypatch.setenv("FT_LAUNCHER_CYCLE", "2")
    mon = monitor(fixed_cfg("sections"))
    proc = spawn_trainer({"callback": "sections", "root": str(tmp_path), "max_steps": 24, "ckpt_every": 20,
                          "logger": "csv", "cb": {"calculate_timeouts": True}}, mon)
    assert proc.wait() == 0, proc.output()
    rows = csv_metrics(tmp_path)
    assert logged(rows, "ft/cycle") == [(0, 2.0)]  # once: it did not change
    steps = logged(rows, "ft/section_timeout/step")
    assert steps[0] == (0, LONG), steps  # the configured one, at the start
    assert len(steps) >= 2 and steps[-1][1] < LONG and steps[-1][0] >= 20, steps  # calculated after the save
    assert logged(rows, "ft/out_of_section_timeout")[0] == (0, LONG)
    assert not logged(rows, "ft/heartbeat_timeout")  # the heartbeats callback's figures


def test_heartbeat_callback_logs_its_timeouts(monitor, train, tmp_path):
    monitor(fixed_cfg("heartbeats"))
    train({"callback": "heartbeats", "root": str(tmp_path), "max_steps": 3, "logger": "csv"})
    rows = csv_metrics(tmp_path)
    assert logged(rows, "ft/heartbeat_timeout") == [(0, LONG)]
    assert logged(rows, "ft/initial_heartbeat_timeout") == [(0, LONG)]
