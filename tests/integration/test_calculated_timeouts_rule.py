"""What the logs say when calculated timeouts replace configured ones, or cannot be kept (issue 29.4, 29.5).

Real ``ft_launcher`` runs of a Lightning job with ``FaultToleranceCallback(calculate_timeouts=True)``
that resume one another in the same ``exp_dir``. A run calculates heartbeat timeouts when it both
loads and saves a checkpoint, so the first run of each test only leaves a checkpoint behind.

The rule (the reference's, docs/lightning.md): calculated timeouts replace the configured ones,
also one typed on the command line. The line that lists the timeouts in force must say so: the
value in force, the configured value it replaces, the state file it came from, and how to run
with the configured value instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launcher_util import run_launcher

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "lightning_train.py")

pytestmark = pytest.mark.timeout(420)


def run(tmp_path: Path, exp_dir: Path, max_steps: int, calculate: bool = True, extra: tuple[str, ...] = ()) -> str:
    """One launcher run of one rank that resumes from ``<tmp_path>/ckpt``; its log (stdout + stderr)."""
    cfg = {"callback": "heartbeats", "cb": {"calculate_timeouts": calculate, "exp_dir": str(exp_dir)},
           "root": str(tmp_path), "max_steps": max_steps, "ckpt_every": 2, "resume": True}
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", *extra, WORKER,
                           json.dumps(cfg)], timeout=180)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    return log


def lines_with(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


def test_calculated_timeouts_that_replace_a_command_line_value_say_so_with_the_state_file(tmp_path):
    exp = tmp_path / "exp"
    state = exp / "_ft_state.json"
    typed = ("--ft-param-rank_heartbeat_timeout=5",)
    run(tmp_path, exp, 2, extra=typed)  # leaves a checkpoint: the next run loads and saves one
    log = run(tmp_path, exp, 4, extra=typed)
    # The calculation replaces the typed 5 s (raised to the 120 s minimum): the line says both.
    [calculated] = lines_with(log, "heartbeat timeouts in force (calculated)")
    assert "between heartbeats 120 s (calculated: longest observed" in calculated, calculated
    assert "raised to the minimum 120 s of min_calculated_heartbeat_timeout; replaces the configured 5.00 s" \
        in calculated, calculated
    assert state.exists()

    log = run(tmp_path, exp, 6, extra=typed)
    # The launcher still lists what was typed ...
    assert lines_with(log, "rank_heartbeat_timeout = 5  (command line --ft-param-rank_heartbeat_timeout")
    # ... and the rank's line says what is in force instead, from which file, and how to undo it.
    [connected] = lines_with(log, "heartbeat timeouts in force:")
    assert "between heartbeats 120 s (calculated; replaces the configured 5.00 s)" in connected, connected
    assert f"calculated timeouts restored from {state} replace the configured ones" in connected, connected
    assert "set calculate_timeouts=False" in connected, connected

    # What the line says to do gives the typed value.
    log = run(tmp_path, exp, 8, calculate=False, extra=typed)
    [connected] = lines_with(log, "heartbeat timeouts in force:")
    assert "between heartbeats 5.00 s (configured)" in connected and "restored from" not in connected, connected


def test_an_exp_dir_that_cannot_hold_the_state_file_is_one_warning_and_no_false_update(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    run(tmp_path, blocker, 2)  # leaves a checkpoint: the next run calculates
    # (A path under a file, and a directory another user cannot write: tests/unit/test_state_file.py.)
    log = run(tmp_path, blocker, 4)
    state = blocker / "_ft_state.json"
    complaints = [line for line in log.splitlines() if str(state) in line and ("WARNING" in line or "ERROR" in line)]
    assert len(complaints) == 1, "\n".join(complaints)
    assert "cannot be used" in complaints[0], complaints[0]
    assert f"{blocker} is a file, not the directory it should be" in complaints[0], complaints[0]
    assert "writable directory" in complaints[0] and "exp_dir" in complaints[0], complaints[0]
    assert lines_with(log, "heartbeat timeouts in force (calculated)")  # the run calculated ...
    assert not lines_with(log, "Updated FT timeouts. New values")  # ... and does not claim a saved update
    [updated] = lines_with(log, "Updated FT timeouts for this run only")
    assert f"not saved to {state}" in updated, updated
    assert blocker.read_text() == "not a directory\n"
