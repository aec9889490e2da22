"""A deeply nested state file (issue 21.6): one warning, then the configured timeouts apply.

``[`` x 200 000 is far under the state file's size limit, but a recursive JSON decoder gives up on
it with RecursionError (not a ValueError). Every rank reads the file at setup, in every cycle:
it must be the one documented "ignoring fault tolerance state file ...; configured timeouts are
used" warning, not a crash.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ft_core.client.integration import STATE_FILE_NAME
from ft_core.client.state_file import MAX_STATE_FILE_BYTES
from tests.launcher_util import events_of, read_events, run_launcher

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "integration_train.py")
NESTED = "[" * 200_000

pytestmark = pytest.mark.timeout(180)


def test_a_deeply_nested_state_file_is_one_warning_and_the_run_goes_on(tmp_path):
    assert len(NESTED) < MAX_STATE_FILE_BYTES  # refused for its nesting, not for its size
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state = ckpt / STATE_FILE_NAME
    state.write_text(NESTED)
    cfg = {"ckpt_dir": str(ckpt), "report_dir": str(tmp_path), "steps": 4, "ckpt_every": 2,
           "calculate": True}
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
            "--ft-event-log", str(tmp_path / "events.jsonl"),
            "--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null",
            "--ft-param-rank_section_timeouts", "setup:60,step:60,checkpointing:60",
            "--ft-param-rank_out_of_section_timeout", "60", WORKER, json.dumps(cfg)]
    result = run_launcher(args, timeout=120)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "RecursionError" not in result.stderr and "Traceback" not in result.stderr
    # Rank 0 reads the file and broadcasts its text; each rank parses it: one warning per rank.
    warnings = [line for line in result.stderr.splitlines()
                if "ignoring fault tolerance state file" in line and str(state) in line]
    assert len(warnings) == 2, result.stderr[-5000:]
    assert all("not valid JSON" in w and "configured timeouts are used" in w for w in warnings)
    assert events_of(read_events(tmp_path / "events.jsonl"), "result")[0]["outcome"] == "succeeded"
    # The configured timeouts applied from the start.
    started = json.loads((tmp_path / "report_rank0_cycle0.jsonl").read_text().splitlines()[0])
    assert started["op"] == "started" and started["sections"]["calculated_sections"] == []
    # Rank 0's save after a checkpoint replaced the unusable file (its merge read did not crash).
    saved = json.loads(state.read_text())
    assert saved["section_timeouts"]["calculated_sections"]
