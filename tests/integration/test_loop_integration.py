"""ft_core.client.integration under a real ft_launcher: 2 ranks with gloo on CPU, real monitors.

The worker (tests/workers/integration_train.py) is a loop that all-reduces every step, so a rank
that hangs makes the other wait, as in DDP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ft_core.client.integration import STATE_FILE_NAME
from tests.launcher_util import events_of, read_events, run_launcher

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "integration_train.py")
NULL_HEARTBEATS = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null"]

pytestmark = pytest.mark.slow


def sections(setup: float = 60, step: float = 60, checkpointing: float = 60, oos: float = 60) -> list[str]:
    return ["--ft-param-rank_section_timeouts", f"setup:{setup},step:{step},checkpointing:{checkpointing}",
            "--ft-param-rank_out_of_section_timeout", str(oos)]


def launch(tmp_path: Path, cfg: dict, *ft_args: str, max_restarts: int = 0, timeout: float = 100):
    cfg = {"ckpt_dir": str(tmp_path / "ckpt"), "report_dir": str(tmp_path), **cfg}
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.05", "--ft-event-log", str(tmp_path / "events.jsonl"),
            *NULL_HEARTBEATS, *ft_args, WORKER, json.dumps(cfg)]
    return run_launcher(args, timeout=timeout)


def reports(tmp_path: Path, rank: int, cycle: int, op: str) -> list[dict]:
    path = tmp_path / f"report_rank{rank}_cycle{cycle}.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op]


def test_hung_step_is_detected_and_training_resumes_from_its_checkpoint(tmp_path):
    cfg = {"steps": 12, "ckpt_every": 5, "hang": {"where": "step", "rank": 1, "cycle": 0, "step": 7}}
    result = launch(tmp_path, cfg, *sections(step=2), max_restarts=1)
    assert result.returncode == 0, result.stderr[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    hung = [f for f in events_of(events, "failure") if f["rank"] == 1]
    assert len(hung) == 1 and hung[0]["cycle"] == 0
    assert hung[0]["cause_kind"] == "hang" and hung[0]["hang_kind"] == "section"
    assert hung[0]["section"] == "step" and hung[0]["timeout"] == 2.0
    assert reports(tmp_path, 1, 0, "hanging")[0]["step"] == 7
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
    assert events_of(events, "result")[0]["outcome"] == "succeeded"
    # Cycle 1 resumed from the checkpoint of step 5 and finished on both ranks.
    for rank in (0, 1):
        assert reports(tmp_path, rank, 1, "started")[0]["step"] == 5
        end = reports(tmp_path, rank, 1, "end")[0]
        assert end["step"] == 12 and end["train_iters"] == 7 and end["initialized"] is False
    assert not reports(tmp_path, 1, 0, "end")


@pytest.mark.parametrize("where, step, timeouts, hang_kind, section", [
    ("setup", None, {"setup": 2}, "section", "setup"),
    ("checkpointing", 5, {"checkpointing": 2}, "section", "checkpointing"),
    ("between", 5, {"oos": 2}, "out_of_section", None),
    # The run's first step is a warm-up step, out of any section (as in the Lightning callback).
    ("step", 1, {"oos": 2}, "out_of_section", None),
], ids=["setup", "checkpointing", "between", "warm-up-step"])
def test_a_hang_is_reported_in_the_phase_where_it_happened(tmp_path, where, step, timeouts, hang_kind, section):
    hang = {"where": where, "rank": 0} if step is None else {"where": where, "rank": 0, "step": step}
    cfg = {"steps": 30, "ckpt_every": 5, "hang": hang}
    result = launch(tmp_path, cfg, *sections(**timeouts))
    assert result.returncode == 1, result.stderr[-5000:]
    assert reports(tmp_path, 0, 0, "hanging"), "the worker never reached the hang"
    failure = next(f for f in events_of(read_events(tmp_path / "events.jsonl"), "failure") if f["rank"] == 0)
    assert failure["cause_kind"] == "hang" and failure["hang_kind"] == hang_kind
    assert failure["section"] == section and failure["timeout"] == 2.0
    # The hang was caught on its deadline, not at the end of the 600 s sleep.
    assert 2.0 <= failure["elapsed"] < 4.0


def test_timeouts_are_calculated_agreed_saved_and_reloaded(tmp_path):
    ckpt = tmp_path / "ckpt"
    # A large safety factor keeps the calculated timeouts well above scheduling noise here; small
    # minimums (the defaults are 60-120 s) let the calculated values show.
    ft_args = [*sections(), "--ft-param-safety_factor", "20", "--ft-param-min_calculated_section_timeout", "0.1",
               "--ft-param-min_calculated_out_of_section_timeout", "0.1"]
    first = launch(tmp_path / "run1", {"ckpt_dir": str(ckpt), "steps": 20, "ckpt_every": 10, "calculate": True,
                                       "eval_every": 10}, *ft_args)
    assert first.returncode == 0, first.stderr[-5000:]
    ends = [reports(tmp_path / "run1", rank, 0, "end")[0]["sections"] for rank in (0, 1)]
    assert ends[0] == ends[1]  # every rank got the same timeouts
    # A first run loaded no checkpoint: setup and the out-of-section time keep their config.
    assert ends[0]["calculated_sections"] == ["checkpointing", "step"]
    assert ends[0]["is_out_of_section_calculated"] is False
    assert ends[0]["section"]["setup"] == 60 and ends[0]["out_of_section"] == 60
    assert ends[0]["section"]["step"] >= 20 * 0.02  # the slowest step times the safety factor
    saved = json.loads((ckpt / STATE_FILE_NAME).read_text())["section_timeouts"]
    assert saved == ends[0]

    second = launch(tmp_path / "run2", {"ckpt_dir": str(ckpt), "steps": 40, "ckpt_every": 10, "calculate": True},
                    *ft_args)
    assert second.returncode == 0, second.stderr[-5000:]
    for rank in (0, 1):
        started = reports(tmp_path / "run2", rank, 0, "started")[0]
        assert started["step"] == 20 and started["open"] == ["setup"]
        assert started["sections"] == saved  # loaded at setup, before the first step
    ends = [reports(tmp_path / "run2", rank, 0, "end")[0]["sections"] for rank in (0, 1)]
    assert ends[0] == ends[1]
    # This run loaded a persistent checkpoint: setup and the out-of-section time are calculated.
    assert ends[0]["calculated_sections"] == ["checkpointing", "setup", "step"]
    assert ends[0]["is_out_of_section_calculated"] is True
    assert ends[0]["section"]["setup"] < 60 and ends[0]["out_of_section"] < 60
    assert json.loads((ckpt / STATE_FILE_NAME).read_text())["section_timeouts"] == ends[0]
