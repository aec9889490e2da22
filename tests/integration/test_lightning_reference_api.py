"""Details of the Lightning callbacks that code and habits formed with the reference rely on, with
a real Trainer (in this process) and a real rank monitor.

- The sections callback refuses a ``rank_section_timeouts`` that names a section it never opens
  (a typo would leave the real section without the intended timeout), and one without ``step``.
- When a callback applies and saves calculated timeouts it logs "Updated FT timeouts", the
  reference's phrase, next to its own lines.
"""

from __future__ import annotations

import json
import logging

import pytest

from ft_core.wire import protocol
from ft_core.wire.config import MIN_CALCULATED_DEFAULTS, ConfigError
from tests.integration.test_lightning_callbacks import LONG, fixed_cfg, monitor, train  # noqa: F401  (fixtures)
from tests.monitor_events import wait_event

# The default minimums: calculated timeouts are at least a minute, so a run in this process
# cannot be stopped by one of them.
DEFAULT_MINIMUMS = {f"min_calculated_{kind}_timeout": seconds for kind, seconds in MIN_CALCULATED_DEFAULTS.items()}


@pytest.mark.parametrize(
    ("sections", "text"),
    [
        pytest.param({"setup": LONG, "step": LONG, "checkpointing": LONG, "checkpoint": LONG},
                     "configures 'checkpoint' (did you mean 'checkpointing'?), which this front end never opens",
                     id="typo-next-to-the-real-one"),
        pytest.param({"setup": LONG, "step": LONG, "checkpointing": LONG, "eval": LONG},
                     "configures 'eval', which this front end never opens", id="unknown"),
        pytest.param({"setup": LONG, "checkpointing": LONG}, "missing: step", id="no-step"),
    ],
)
def test_the_sections_callback_refuses_sections_it_never_opens_or_a_missing_step(
        sections, text, monitor, train, tmp_path):  # noqa: F811  (fixtures)
    mon = monitor(fixed_cfg("sections", rank_section_timeouts=sections))
    with pytest.raises(ValueError) as info:  # a ConfigError, as the reference's ValueError
        train({"callback": "sections", "root": str(tmp_path), "max_steps": 2})
    assert isinstance(info.value, ConfigError) and text in str(info.value)
    wait_event(mon.link, protocol.MSG_RANK_CONNECTED)
    mon.assert_released()


def updated_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("ptl_resiliency.") and r.levelno == logging.INFO
            and "Updated FT timeouts" in r.getMessage()]


@pytest.mark.parametrize("kind", ["heartbeats", "sections"])
def test_applying_and_saving_calculated_timeouts_logs_the_references_phrase(
        kind, monitor, train, tmp_path, caplog):  # noqa: F811  (fixtures)
    monitor(fixed_cfg(kind, **DEFAULT_MINIMUMS))
    caplog.set_level(logging.INFO, logger="ptl_resiliency")
    run = {"callback": kind, "root": str(tmp_path), "ckpt_every": 2, "cb": {"calculate_timeouts": True}}
    state = tmp_path / "ft_state" / "_ft_state.json"
    if kind == "heartbeats":  # the heartbeat timeouts need a run that loaded and saved a checkpoint
        train({**run, "max_steps": 2})
        assert not updated_lines(caplog) and not state.exists()
        train({**run, "max_steps": 4, "resume": True})
        expected = "between heartbeats 120 s (calculated)"
    else:  # the checkpointing timeout after the save at step 2
        train({**run, "max_steps": 4})
        expected = "checkpointing 60.0 s (calculated)"
    lines = updated_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("[rank 0] Updated FT timeouts. New values: "), lines
    assert expected in lines[0]
    assert json.loads(state.read_text())  # applied and saved
    # next to the client's own line
    assert any("timeouts in force (calculated)" in r.getMessage() for r in caplog.records)
