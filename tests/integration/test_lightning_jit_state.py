"""Just-in-time state with the Lightning callbacks under a real ft_launcher: a 2-rank DDP job
(CPU, gloo) with a periodic checkpoint every 100 steps; rank 1 fails at step 137; the restarted
job resumes at step 137 (not 100) with the parameters and optimizer state the survivor had.

Rank 0 reports a hash of its parameters and optimizer state after every step, and both ranks
report it again once the restarted run restored its state (on_train_start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_lightning_launcher import TRAIN_WORKER, launcher_args, reports
from tests.launcher_util import events_of, read_events, run_launcher

pytestmark = pytest.mark.slow

FAIL_STEP = 137
MAX_STEPS = 150


def _config(root: Path, callback: str, exc: str) -> dict:
    return {"callback": callback, "root": str(root), "ddp": True, "max_steps": MAX_STEPS, "ckpt_every": 100,
            "resume": True, "adam": True, "report_steps": True, "hash_steps": True,
            "fail": {"step": FAIL_STEP, "exc": exc, "rank": 1, "cycle": 0}}


def _check_resumed_at_the_survivors_state(root: Path, events: list[dict], source: str,
                                          steps: tuple[int, ...] = (FAIL_STEP,)) -> None:
    """The one state saved (at one of ``steps``) is the survivor's last step, and both restarted
    ranks resumed from it."""
    saved = events_of(events, "state_saved")
    assert [(s["cycle"], s["step"] in steps, s["source"]) for s in saved] == [(0, True, source)], saved
    step = saved[0]["step"]
    survivor = {r["global_step"]: r["hash"] for r in reports(root, 0, 0, "step")}
    # The survivor completed the saved step and never got further (the failed rank held up the next).
    assert max(survivor) == step, sorted(survivor)[-3:]
    for rank in (0, 1):
        started = reports(root, rank, 1, "started")[0]
        assert started["global_step"] == step, started  # not 100: the periodic checkpoint
        assert started["hash"] == survivor[step], (rank, started["hash"], survivor[step])
        assert started["ckpt_path"].endswith(f"state-{step:010d}.pt"), started["ckpt_path"]
        assert reports(root, rank, 1, "fit_end")[0]["global_step"] == MAX_STEPS
    # The periodic checkpoint the user's script passed was there, and older.
    assert (root / "ckpt" / "last.ckpt").exists()
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
    # each rank told the launcher where it resumed from (ft_report's steps redone)
    resumed = sorted((r["cycle"], r["rank"], r["step"], r["source"]) for r in events_of(events, "resumed"))
    assert resumed == [(0, 0, 0, "scratch"), (0, 1, 0, "scratch"), (1, 0, step, "jit"),
                       (1, 1, step, "jit")], resumed
    assert events_of(events, "result")[0]["outcome"] == "succeeded"


def test_a_crash_at_step_137_resumes_at_137_from_the_survivors_exception_path(tmp_path):
    root = tmp_path / "run"
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-initial_rank_heartbeat_timeout", "120",
                      "--ft-param-rank_heartbeat_timeout", "60", max_restarts=1)
        + [TRAIN_WORKER, json.dumps(_config(root, "heartbeats", "Exit1"))],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    failures = events_of(events, "failure")
    assert {(f["cycle"], f["rank"]) for f in failures if f["cause_kind"] == "exit"} >= {(0, 1)}
    _check_resumed_at_the_survivors_state(root, events, "exception")
    survivor_exc = reports(root, 0, 0, "exception")
    assert survivor_exc and survivor_exc[0]["global_step"] == FAIL_STEP  # its backward raised
    assert "resuming from the just-in-time state of step 137" in result.stdout + result.stderr


def test_a_hang_at_step_137_resumes_at_137_from_the_blocked_survivors_copy(tmp_path):
    root = tmp_path / "run"
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-rank_heartbeat_timeout", "null",
                      "--ft-param-initial_rank_heartbeat_timeout", "null",
                      "--ft-param-rank_section_timeouts", "setup:120,step:4,checkpointing:60",
                      "--ft-param-rank_out_of_section_timeout", "60", max_restarts=1)
        + [TRAIN_WORKER, json.dumps(_config(root, "sections", "SIGSTOP"))],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    assert any(f["cycle"] == 0 and f["cause_kind"] == "hang" for f in events_of(events, "failure"))
    # Rank 1's monitor ends it with SIGCONT, then SIGTERM, which Lightning's handler notes while
    # the step goes on: continued, rank 1 may finish its step 138 with the survivor. When the
    # survivor's own request comes after that (CI saw it once), it saves 138, as consistent as 137.
    _check_resumed_at_the_survivors_state(root, events, "blocked", steps=(FAIL_STEP, FAIL_STEP + 1))
    assert not reports(root, 0, 0, "exception")  # the survivor was blocked, then stopped: no exception path


def test_a_real_fsdp2_job_refuses_the_state_with_one_line_and_restarts_from_scratch(tmp_path):
    """Lightning's ModelParallelStrategy with FSDP2 runs on CPU (gloo): each rank holds a shard
    (DTensors), so no survivor can save the job's state. The provider refuses with one line naming
    the strategy, nothing is saved, and the restarted job starts over (no periodic checkpoint)."""
    root = tmp_path / "run"
    cfg = {"callback": "heartbeats", "root": str(root), "fsdp2": True, "max_steps": 12, "adam": True,
           "fail": {"step": 6, "exc": "Exit1", "rank": 1, "cycle": 0}}
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-initial_rank_heartbeat_timeout", "120",
                      "--ft-param-rank_heartbeat_timeout", "60", max_restarts=1)
        + [TRAIN_WORKER, json.dumps(cfg)],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    output = result.stdout + result.stderr
    line = ("just-in-time state is off for this job: the ModelParallelStrategy strategy splits the model across "
            "ranks (tensor parallel, FSDP2)")
    assert line in output, output[-5000:]
    events = read_events(tmp_path / "events.jsonl")
    assert not events_of(events, "state_saved"), events_of(events, "state_saved")
    resumed = sorted((r["cycle"], r["rank"], r["step"], r["source"]) for r in events_of(events, "resumed"))
    assert resumed == [(0, 0, 0, "scratch"), (0, 1, 0, "scratch"), (1, 0, 0, "scratch"),
                       (1, 1, 0, "scratch")], resumed
    assert events_of(events, "result")[0]["outcome"] == "succeeded"
