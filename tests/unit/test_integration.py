"""ft_core.client.integration in one process against a real rank monitor (no process group).

The rank is this pytest process, so no monitor here may ever act on a hang: timeouts are long,
calculated ones are made long too (a huge safety factor: microsecond sections would otherwise
give millisecond timeouts), and the termination signal is one that is ignored by default.
Hang detection itself is covered by tests/integration/test_loop_integration.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ft_core.client.integration as ft_integration
from ft_core import FaultToleranceConfig, RankMonitorClientError
from ft_core.client.integration import FaultToleranceIntegration
from ft_core.wire.config import ConfigError
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from tests.conftest import HARMLESS_TERMINATION

LONG = 600.0
SECTIONS = {"setup": LONG, "step": LONG, "checkpointing": LONG}
SAFETY_FACTOR = 1e9  # a 1 us section gives a 1000 s timeout


def config(**overrides) -> FaultToleranceConfig:
    values = dict(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                  rank_section_timeouts=SECTIONS, rank_out_of_section_timeout=LONG,
                  safety_factor=SAFETY_FACTOR, **HARMLESS_TERMINATION)
    values.update(overrides)
    return FaultToleranceConfig(**values)


@pytest.fixture
def monitor(start_monitor, monkeypatch, harmless_termination):
    """Factory: start a monitor with ``config(**overrides)`` and point this process at it."""

    def factory(**overrides) -> None:
        _handle, path = start_monitor(config(**overrides))
        monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
        monkeypatch.delenv("WORLD_SIZE", raising=False)

    return factory


@pytest.fixture
def ft() -> Iterator[FaultToleranceIntegration]:
    integration = FaultToleranceIntegration()
    yield integration
    integration.shutdown(update_timeouts=False)


def run_steps(ft: FaultToleranceIntegration, count: int) -> None:
    for _ in range(count):
        ft.on_training_step_start()
        ft.on_training_step_end()


def save(ft: FaultToleranceIntegration, is_async_finalization: bool = False) -> None:
    ft.on_checkpointing_start()
    ft.on_checkpointing_end(is_async_finalization=is_async_finalization)


def read_state(ckpt_dir: Path) -> dict:
    return json.loads((ckpt_dir / ft_integration.STATE_FILE_NAME).read_text())


# ---------------------------------------------------------------------- not initialised


def test_every_call_is_a_noop_before_setup_and_after_shutdown(monitor, ft, tmp_path):
    def all_calls() -> None:
        ft.on_training_step_start()
        ft.on_training_step_end()
        ft.on_eval_step_start()
        ft.on_eval_step_end()
        ft.on_checkpointing_start()
        ft.on_checkpointing_end(is_async_finalization=False)
        ft.on_checkpoint_loaded(is_local_chkpt=False)
        assert ft.maybe_setup_simulated_fault({"fault_type": "rank_killed", "base_delay": 0}) is None
        ft.shutdown()

    all_calls()
    assert not ft.is_initialized and ft.client is None and ft.train_iters == 0
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    assert ft.is_initialized
    ft.shutdown()
    all_calls()
    assert not ft.is_initialized and ft.train_iters == 0
    assert not (tmp_path / ft_integration.STATE_FILE_NAME).exists()


@pytest.mark.parametrize("value", [None, "", "  "])
def test_setup_without_a_checkpoint_dir_is_a_clear_error(ft, value):
    with pytest.raises(ValueError, match=r"checkpoint_dir is not set \(got " + repr(value).replace("(", r"\(") + r"\)"):
        ft.setup(value)
    assert not ft.is_initialized


@pytest.mark.parametrize("kwargs, message", [
    ({"calculate_timeouts": "yes"}, "calculate_timeouts must be True or False, got 'yes'"),
    ({"num_warmup_iters": -1}, "num_warmup_iters must be a whole number >= 0, got -1"),
    ({"num_warmup_iters": 1.5}, "num_warmup_iters must be a whole number >= 0, got 1.5"),
    ({"state_file_name": "a/b.json"}, "state_file_name must be a plain file name, got 'a/b.json'"),
])
def test_setup_rejects_invalid_arguments(ft, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ft.setup(tmp_path, **kwargs)
    assert not ft.is_initialized


def test_setup_outside_ft_launcher_names_the_missing_variable(ft, tmp_path, monkeypatch):
    monkeypatch.delenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, raising=False)
    with pytest.raises(RankMonitorClientError, match=FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR):
        ft.setup(tmp_path)
    assert not ft.is_initialized


@pytest.mark.parametrize("overrides, calculate, message", [
    ({"rank_section_timeouts": {"setup": LONG, "step": LONG}}, True, "missing: checkpointing"),
    ({"rank_out_of_section_timeout": None}, False, "rank_out_of_section_timeout=None"),
    ({"rank_section_timeouts": {**SECTIONS, "step": None}}, False, "'step': None"),
], ids=["missing-section", "infinite-oos", "infinite-step"])
def test_setup_refuses_a_config_it_cannot_watch(monitor, ft, tmp_path, overrides, calculate, message):
    monitor(**overrides)
    with pytest.raises(ConfigError, match=message):
        ft.setup(tmp_path, calculate_timeouts=calculate)
    assert not ft.is_initialized
    # Infinite timeouts are fine when they are to be calculated.
    if not calculate:
        ft.setup(tmp_path, calculate_timeouts=True)
        assert ft.is_initialized


def test_a_finite_initial_heartbeat_timeout_is_refused_at_setup(monitor, ft, tmp_path):
    # No heartbeats are sent, and sections are not heartbeats (seed 002): the monitor would stop
    # the rank an hour in. Said at setup instead.
    monitor(initial_rank_heartbeat_timeout=3600.0, rank_heartbeat_timeout=2700.0)
    with pytest.raises(ConfigError,
                       match="initial_rank_heartbeat_timeout=3600.0 is finite.*sections are not heartbeats"):
        ft.setup(tmp_path, calculate_timeouts=True)
    assert not ft.is_initialized


def test_setup_twice_is_an_error(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path)
    with pytest.raises(RuntimeError, match="called twice"):
        ft.setup(tmp_path)


# ---------------------------------------------------------------------- sections


def test_sections_follow_the_loop_with_one_warmup_step(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path)
    client = ft.client
    assert client.open_sections == ("setup",)

    ft.on_training_step_start()  # warm-up: setup closes, no step section
    assert client.open_sections == ()
    ft.on_training_step_end()
    ft.on_training_step_start()
    assert client.open_sections == ("step",)
    ft.on_training_step_end()
    assert client.open_sections == ()

    for expected in [(), ("step",), ("step",)]:  # every evaluation run warms up again
        ft.on_eval_step_start()
        assert client.open_sections == expected
        ft.on_eval_step_end()
    run_steps(ft, 1)
    ft.on_eval_step_start()
    assert client.open_sections == ()
    ft.on_eval_step_end()

    ft.on_checkpointing_start()
    ft.on_checkpointing_start()  # nested: the outermost pair owns the section
    ft.on_checkpointing_end(is_async_finalization=False)
    assert client.open_sections == ("checkpointing",)
    ft.on_checkpointing_end(is_async_finalization=False)
    assert client.open_sections == ()
    ft.on_checkpointing_end(is_async_finalization=False)  # unmatched: ignored
    assert ft.train_iters == 3


@pytest.mark.parametrize("warmup", [0, 3])
def test_warmup_steps_are_out_of_section(monitor, ft, tmp_path, warmup):
    monitor()
    ft.setup(tmp_path, num_warmup_iters=warmup)
    wrapped = []
    for _ in range(warmup + 2):
        ft.on_training_step_start()
        wrapped.append(ft.client.open_sections == ("step",))
        ft.on_training_step_end()
    assert wrapped == [False] * warmup + [True, True]


def test_eval_first_closes_setup(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path)
    ft.on_eval_step_start()
    assert ft.client.open_sections == ()
    ft.on_eval_step_end()


def test_shutdown_closes_open_sections_and_disconnects(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path)
    client = ft.client
    run_steps(ft, 1)
    ft.on_training_step_start()
    ft.on_checkpointing_start()
    assert set(client.open_sections) == {"step", "checkpointing"}
    ft.shutdown()
    assert not client.is_initialized and not ft.is_initialized
    ft.shutdown()  # again: nothing happens


# ---------------------------------------------------------------------- timeouts


def test_checkpoint_save_updates_what_the_run_has_data_for(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    run_steps(ft, 5)
    save(ft)
    state = read_state(tmp_path)["section_timeouts"]
    assert state["calculated_sections"] == ["checkpointing"]
    assert state["is_out_of_section_calculated"] is False
    assert state["section"]["step"] == LONG and state["section"]["setup"] == LONG

    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE - 5)
    save(ft)
    state = read_state(tmp_path)["section_timeouts"]
    assert state["calculated_sections"] == ["checkpointing", "step"]
    # No checkpoint was loaded: setup and the out-of-section time stay as configured.
    assert state["section"]["setup"] == LONG and state["out_of_section"] == LONG
    assert state["is_out_of_section_calculated"] is False
    assert state["section"]["step"] != LONG
    assert ft.client.section_timeouts.to_dict() == state


def test_persistent_checkpoint_load_allows_setup_and_out_of_section(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    ft.on_checkpoint_loaded(is_local_chkpt=False)
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    save(ft)
    state = read_state(tmp_path)["section_timeouts"]
    assert state["calculated_sections"] == ["checkpointing", "setup", "step"]
    assert state["is_out_of_section_calculated"] is True
    assert state["out_of_section"] != LONG


def test_local_checkpoint_load_does_not(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    ft.on_checkpoint_loaded(is_local_chkpt=True)
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    save(ft)
    state = read_state(tmp_path)["section_timeouts"]
    assert state["calculated_sections"] == ["checkpointing", "step"]
    assert state["is_out_of_section_calculated"] is False


def test_async_finalization_does_not_count_as_a_save(monitor, ft, tmp_path, caplog):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    save(ft, is_async_finalization=True)
    assert not (tmp_path / ft_integration.STATE_FILE_NAME).exists()
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    with caplog.at_level(logging.INFO, logger="ft_core.client.integration"):
        save(ft)
    # The checkpointing section mixes saves and asynchronous finalisations: not calculated.
    assert read_state(tmp_path)["section_timeouts"]["calculated_sections"] == ["step"]
    assert "asynchronous checkpoint finalisation" in caplog.text


def test_no_calculation_without_calculate_timeouts(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path)
    ft.on_checkpoint_loaded(is_local_chkpt=False)
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    save(ft)
    ft.shutdown()
    assert not (tmp_path / ft_integration.STATE_FILE_NAME).exists()


def test_shutdown_runs_the_final_update(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    assert not (tmp_path / ft_integration.STATE_FILE_NAME).exists()
    ft.shutdown()
    assert read_state(tmp_path)["section_timeouts"]["calculated_sections"] == ["step"]


def test_shutdown_without_update_only_disconnects(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    ft.shutdown(update_timeouts=False)
    assert not ft.is_initialized
    assert not (tmp_path / ft_integration.STATE_FILE_NAME).exists()


def test_saved_timeouts_are_loaded_by_the_next_setup_that_calculates(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path, calculate_timeouts=True)
    run_steps(ft, ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE)
    save(ft)
    saved = ft.client.section_timeouts.to_dict()
    ft.shutdown(update_timeouts=False)

    second = FaultToleranceIntegration()
    try:
        second.setup(tmp_path, calculate_timeouts=True)
        assert second.client.section_timeouts.to_dict() == saved
        assert second.state_file_path == str(tmp_path / ft_integration.STATE_FILE_NAME)
    finally:
        second.shutdown(update_timeouts=False)
    # Without calculate_timeouts the configured timeouts are used as they are (as the callbacks do).
    third = FaultToleranceIntegration()
    try:
        third.setup(tmp_path, calculate_timeouts=False)
        assert third.client.section_timeouts.section == SECTIONS
        assert not third.client.section_timeouts.calculated_sections
    finally:
        third.shutdown()
    assert read_state(tmp_path)["section_timeouts"] == saved  # and the file is left alone


@pytest.mark.parametrize("content, message", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b"\xff\xfe", "not UTF-8 text"),
    (json.dumps({"section_timeouts": {"section": {"step": -1}}}).encode(), "section_timeouts.section"),
], ids=["json", "list", "utf8", "negative"])
def test_a_bad_state_file_is_ignored_with_a_warning(monitor, ft, tmp_path, caplog, content, message):
    (tmp_path / ft_integration.STATE_FILE_NAME).write_bytes(content)
    monitor()
    with caplog.at_level(logging.WARNING, logger="ft_core.client.integration"):
        ft.setup(tmp_path, calculate_timeouts=True)
    assert ft.client.section_timeouts.section == SECTIONS
    assert message in caplog.text and "ignoring fault tolerance state file" in caplog.text


def test_an_unwritable_state_file_is_logged_and_training_goes_on(monitor, ft, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should be\n")
    monitor()
    with caplog.at_level(logging.WARNING, logger="ft_core.client.integration"):
        ft.setup(blocker, calculate_timeouts=True)
        run_steps(ft, 2)
        save(ft)
    # One warning, at setup, that says what is wrong; the save is not a second complaint.
    assert [r.levelno for r in caplog.records] == [logging.WARNING], caplog.text
    assert f"{blocker} is a file" in caplog.text and "cannot be used" in caplog.text
    assert ft.client.section_timeouts.calculated_sections == {"checkpointing"}
    run_steps(ft, 1)
    assert ft.is_initialized


# ---------------------------------------------------------------------- simulated faults


def test_simulated_fault_is_armed_and_cancelled_by_shutdown(monitor, ft, tmp_path):
    monitor()
    ft.setup(tmp_path)
    assert ft.maybe_setup_simulated_fault(None) is None
    with pytest.raises(ValueError, match="fault_type must be one of"):
        ft.maybe_setup_simulated_fault({"fault_type": "explode", "base_delay": 1})
    fault = ft.maybe_setup_simulated_fault({"fault_type": "rank_killed", "base_delay": LONG})
    assert fault is not None and fault.is_armed and fault.plan.rank_to_fail == 0
    ft.shutdown()
    assert not fault.is_armed


# ---------------------------------------------------------------------- module level


def test_module_functions_drive_the_default_instance(monitor, tmp_path):
    monitor()
    try:
        ft_integration.setup(tmp_path, calculate_timeouts=True)
        assert ft_integration.is_initialized()
        client = ft_integration.get_rank_monitor_client()
        assert client is ft_integration.get_integration().client
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
        for _ in range(ft_integration.MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE):
            ft_integration.on_training_step_start()
            ft_integration.on_training_step_end()
        ft_integration.on_eval_step_start()
        ft_integration.on_eval_step_end()
        ft_integration.on_checkpointing_start()
        assert client.open_sections == ("checkpointing",)
        ft_integration.on_checkpointing_end(is_async_finalization=False)
        assert read_state(tmp_path)["section_timeouts"]["is_out_of_section_calculated"] is True
        assert ft_integration.maybe_setup_simulated_fault(None) is None
    finally:
        ft_integration.shutdown()
    assert not ft_integration.is_initialized() and ft_integration.get_rank_monitor_client() is None


def test_importing_the_integration_does_not_import_torch():
    code = "import sys, ft_core.client.integration; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
