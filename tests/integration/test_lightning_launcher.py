"""The Lightning callbacks under a real ft_launcher: 2-rank DDP on CPU (gloo), restarts, resume,
workload control and timeouts that all ranks agree on."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from launcher.exit_codes import EXIT_SHUTDOWN_REQUESTED
from tests.launcher_util import events_of, read_events, run_launcher

TRAIN_WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "lightning_train.py")
NULL_HEARTBEATS = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null"]
SECTIONS_60 = ["--ft-param-rank_section_timeouts", "setup:60,step:60,checkpointing:60",
               "--ft-param-rank_out_of_section_timeout", "60"]

pytestmark = pytest.mark.slow


def launcher_args(tmp_path: Path, *ft_args: str, max_restarts: int = 0) -> list[str]:
    # A rank blocked in a gloo collective does not act on SIGTERM (Lightning only sets a flag):
    # a short --term-timeout makes the launcher SIGKILL it soon.
    return ["--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.05", "--term-timeout", "3",
            "--ft-event-log", str(tmp_path / "events.jsonl"), *ft_args]


def reports(root: Path, rank: int, cycle: int, op: str) -> list[dict]:
    path = root / f"report_rank{rank}_cycle{cycle}.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op]


def test_simulated_hang_restarts_and_resumes_to_completion_with_the_flag(tmp_path):
    flag = tmp_path / "finished.flag"
    root = tmp_path / "run"
    cfg = {
        "callback": "heartbeats", "root": str(root), "ddp": True, "max_steps": 60, "step_sleep": 0.05,
        "ckpt_every": 5, "resume": True, "cb": {"autoresume": True, "calculate_timeouts": True},
        # rank 1 freezes (SIGSTOP) 1.5 s after setup, in the first cycle only
        "fault": {"params": {"fault_type": "rank_hung", "base_delay": 1.5, "rank_to_fail": 1}, "cycle": 0},
    }
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-initial_rank_heartbeat_timeout", "60",
                      "--ft-param-rank_heartbeat_timeout", "3", max_restarts=2)
        + [TRAIN_WORKER, json.dumps(cfg)],
        timeout=110, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    # Rank 0 waits for the frozen rank 1 in DDP's all-reduce, so its heartbeats stop within
    # milliseconds of rank 1's: both monitors report a hang, in either order.
    failures = events_of(events, "failure")
    assert {f["cycle"] for f in failures} == {0}
    assert failures[0]["cause_kind"] == "hang" and failures[0]["hang_kind"] == "heartbeat"
    hung = [f for f in failures if f["rank"] == 1]
    assert hung and hung[0]["cause_kind"] == "hang" and hung[0]["timeout"] == 3.0
    assert hung[0]["exit_code"] == -signal.SIGKILL
    assert "[rank 1] simulated fault rank_hung: sending SIGSTOP" in result.stdout + result.stderr
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
    assert events_of(events, "result")[0]["outcome"] == "succeeded"

    # Cycle 1 resumed from the just-in-time state rank 0 saved while blocked by the hung rank 1
    # (on by default), else from the last checkpoint of cycle 0, and ran to max_steps on both ranks.
    resumed = {rank: reports(root, rank, 1, "started")[0]["global_step"] for rank in (0, 1)}
    saved = events_of(events, "state_saved")
    assert resumed[0] == resumed[1] and resumed[0] > 0
    assert resumed[0] == saved[0]["step"] if saved else resumed[0] % 5 == 0, (resumed, saved)
    assert [reports(root, rank, 1, "fit_end")[0]["global_step"] for rank in (0, 1)] == [60, 60]
    assert not reports(root, 1, 0, "fit_end")  # the hung rank never finished cycle 0
    assert json.loads(flag.read_text())["reason"] == "max_steps=60 reached"
    # Cycle 1 loaded and saved checkpoints: heartbeat timeouts were calculated and saved by rank 0.
    state = json.loads((root / "ft_state" / "_ft_state.json").read_text())
    assert state["hb_timeouts"]["were_calculated"] is True


def test_exc_handling_policy_shutdown_stops_the_launcher_without_restart(tmp_path):
    flag = tmp_path / "finished.flag"
    root = tmp_path / "run"
    cfg = {"callback": "sections", "policy": "shutdown", "root": str(root), "ddp": True, "max_steps": 30,
           "cb": {"autoresume": True}, "fail": {"step": 3, "exc": "RuntimeError", "rank": 0}}
    result = run_launcher(
        launcher_args(tmp_path, *NULL_HEARTBEATS, *SECTIONS_60, max_restarts=3) + [TRAIN_WORKER, json.dumps(cfg)],
        timeout=110, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)},
    )
    assert result.returncode == EXIT_SHUTDOWN_REQUESTED, result.stderr[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    assert len(events_of(events, "cycle_start")) == 1
    request = events_of(events, "control_request")[0]
    assert request["action"] == "ShutdownWorkload" and request["rank"] == 0
    assert request["description"] == "unrecoverable: training step failed on purpose"
    assert events_of(events, "result")[0]["outcome"] == "shutdown_requested"
    assert not flag.exists()


def test_section_timeouts_are_calculated_identically_on_all_ranks(tmp_path):
    flag = tmp_path / "finished.flag"
    root = tmp_path / "run"
    # Rank 1's steps are slower; both ranks must still end up with the very same timeouts.
    cfg = {"callback": "sections", "root": str(root), "ddp": True, "max_steps": 20, "ckpt_every": 10,
           "step_sleep_by_rank": {"1": 0.05}, "probe_collectives": True,
           "cb": {"autoresume": True, "calculate_timeouts": True}}
    result = run_launcher(
        launcher_args(tmp_path, *NULL_HEARTBEATS, *SECTIONS_60) + [TRAIN_WORKER, json.dumps(cfg)],
        timeout=110, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    # After the save at iteration 20 (>= 16), the update ran on both ranks before training ended.
    at_end = [reports(root, rank, 0, "train_end")[0]["sections"] for rank in (0, 1)]
    assert at_end[0] == at_end[1]
    assert at_end[0]["calculated_sections"] == ["checkpointing", "step"]
    assert at_end[0]["section"]["step"] >= 5 * 0.05  # the slowest rank's steps, times the safety factor
    state = json.loads((root / "ft_state" / "_ft_state.json").read_text())
    assert state["section_timeouts"]["calculated_sections"] == ["checkpointing", "step"]
    assert json.loads(flag.read_text())["reason"] == "max_steps=20 reached"
    # The callbacks' collectives go through the DDP strategy: what they return on each rank.
    for rank in (0, 1):
        probe = reports(root, rank, 0, "collectives")[0]
        assert probe["world_size"] == 2 and probe["rank"] == rank
        assert probe["all_true"] == [True, False] and probe["all_max"] == [1.0, 0.0]
        assert probe["text"] == "from rank 0" and probe["none"] is None
