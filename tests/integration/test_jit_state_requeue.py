"""A requeued job (a new ft_launcher run) resumes from the just-in-time state its predecessor
copied to the checkpoint directory, on every rank at the same step (docs/jit-state.md, "A requeued
job").

The first job (2 ranks, gloo on CPU, periodic checkpoints every 100 steps, ``--max-restarts 0``)
loses rank 1 at step 137 and ends; its survivor copies its state to
``<checkpoint_dir>/ft_jit_state/``. A second ``ft_launcher`` run with the same checkpoint
directory resumes at step 137 with the survivor's parameters and optimizer state, not at 100.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_lightning_launcher import TRAIN_WORKER, reports
from tests.integration.test_lightning_launcher import launcher_args as lightning_launcher_args
from tests.launcher_util import events_of, read_events, run_launcher

PLAIN_WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "jit_plain_train.py")
FAIL_STEP = 137
STATE = f"state-{FAIL_STEP:010d}.pt"

pytestmark = pytest.mark.slow


@pytest.fixture
def short_tmp():
    """A short TMPDIR for the launchers' run directories (socket paths), removed afterwards."""
    path = tempfile.mkdtemp(prefix="jrq")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------- a plain loop


def _plain_job(job: Path, ckpt: Path, short_tmp: str, fault: dict | None):
    job.mkdir()
    cfg = {"ckpt_dir": str(ckpt), "report_dir": str(job), "shared_copy": True, "fault": fault}
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
            "--ft-event-log", str(job / "events.jsonl"),
            "--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null",
            "--ft-param-rank_section_timeouts", "setup:60,step:60,checkpointing:60",
            "--ft-param-rank_out_of_section_timeout", "60", PLAIN_WORKER, json.dumps(cfg)]
    result = run_launcher(args, timeout=150, env={"TMPDIR": short_tmp})
    return result, read_events(job / "events.jsonl")


def _plain_lines(job: Path, rank: int, op: str) -> list[dict]:
    path = job / f"report_rank{rank}_cycle0.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op] if path.exists() else []


def _first_plain_job(tmp_path: Path, short_tmp: str) -> tuple[Path, str]:
    """The job that fails at step 137 and ends; returns the checkpoint directory and the survivor's hash."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    result, events = _plain_job(tmp_path / "job1", ckpt, short_tmp,
                                {"rank": 1, "cycle": 0, "step": FAIL_STEP, "kind": "crash"})
    assert result.returncode != 0, "the first job fails (no restarts left)"
    saved = events_of(events, "state_saved")
    assert [(s["step"], s["source"]) for s in saved] == [(FAIL_STEP, "exception")], saved
    # complete: the payload and its manifest (the rank is stopped once its local manifest is there)
    shared = sorted(p.name for p in (ckpt / "ft_jit_state").iterdir())
    assert STATE in shared and STATE.replace(".pt", ".json") in shared, shared
    survivor = next(r["hash"] for r in _plain_lines(tmp_path / "job1", 0, "step") if r["step"] == FAIL_STEP)
    return ckpt, survivor


def test_a_requeued_plain_loop_resumes_from_the_previous_jobs_state(tmp_path, short_tmp):
    ckpt, survivor = _first_plain_job(tmp_path, short_tmp)
    result, events = _plain_job(tmp_path / "job2", ckpt, short_tmp, None)
    assert result.returncode == 0, result.stderr[-6000:]
    for rank in (0, 1):
        started = _plain_lines(tmp_path / "job2", rank, "started")[0]
        assert started["step"] == FAIL_STEP and started["source"] == "jit", started  # not 100
        assert started["hash"] == survivor, "parameters and optimizer state are the survivor's"
        assert _plain_lines(tmp_path / "job2", rank, "end"), "the requeued job finished"
    resumed = sorted((r["rank"], r["step"], r["source"]) for r in events_of(events, "resumed"))
    assert resumed == [(0, 100, "checkpoint"), (0, FAIL_STEP, "jit_shared"),
                       (1, 100, "checkpoint"), (1, FAIL_STEP, "jit_shared")], resumed
    assert "that the previous job copied to" in result.stderr


def test_a_corrupt_shared_copy_falls_back_to_the_checkpoint_with_a_warning(tmp_path, short_tmp):
    ckpt, _ = _first_plain_job(tmp_path, short_tmp)
    payload = ckpt / "ft_jit_state" / STATE
    data = bytearray(payload.read_bytes())
    data[100] ^= 0xFF
    payload.write_bytes(bytes(data))
    result, events = _plain_job(tmp_path / "job2", ckpt, short_tmp, None)
    assert result.returncode == 0, result.stderr[-6000:]
    for rank in (0, 1):
        started = _plain_lines(tmp_path / "job2", rank, "started")[0]
        assert started["step"] == 100 and started["source"] == "ckpt", started
    # one warning for the job: rank 0 does not offer it, so no other rank reads it
    warning = f"just-in-time state of step {FAIL_STEP} in {ckpt / 'ft_jit_state'} is corrupt"
    assert result.stderr.count(warning) == 1, [line for line in result.stderr.splitlines() if "state" in line]
    resumed = sorted((r["rank"], r["step"], r["source"]) for r in events_of(events, "resumed"))
    assert resumed == [(0, 100, "checkpoint"), (1, 100, "checkpoint")], resumed


# ---------------------------------------------------------------------- Lightning


def _lightning_job(tmp_path: Path, root: Path, events: str, fail: dict | None):
    cfg = {"callback": "heartbeats", "root": str(root), "ddp": True, "max_steps": 150, "ckpt_every": 100,
           "resume": True, "adam": True, "report_steps": True, "hash_steps": True, "fail": fail}
    args = lightning_launcher_args(tmp_path, "--ft-param-initial_rank_heartbeat_timeout", "120",
                                   "--ft-param-rank_heartbeat_timeout", "60", max_restarts=0)
    args[args.index("--ft-event-log") + 1] = str(tmp_path / events)
    result = run_launcher(args + [TRAIN_WORKER, json.dumps(cfg)], timeout=240)
    return result, read_events(tmp_path / events)


def test_a_requeued_lightning_job_resumes_from_the_previous_jobs_state(tmp_path):
    root = tmp_path / "run"
    result, events = _lightning_job(tmp_path, root, "events1.jsonl",
                                    {"step": FAIL_STEP, "exc": "Exit1", "rank": 1, "cycle": 0})
    assert result.returncode != 0, "the first job fails (no restarts left)"
    assert [(s["step"], s["source"]) for s in events_of(events, "state_saved")] == [(FAIL_STEP, "exception")]
    shared = sorted(p.name for p in (root / "ckpt" / "ft_jit_state").iterdir())
    assert STATE in shared and STATE.replace(".pt", ".json") in shared, shared
    survivor = {r["global_step"]: r["hash"] for r in reports(root, 0, 0, "step")}
    job1 = root / "job1"
    job1.mkdir()
    for report in root.glob("report_rank*_cycle*.jsonl"):
        report.rename(job1 / report.name)  # the second job writes the same names

    # The user's script passes ckpt_path=<ckpt>/last.ckpt (step 100): the newer shared state wins.
    result, events = _lightning_job(tmp_path, root, "events2.jsonl", None)
    assert result.returncode == 0, result.stderr[-6000:]
    for rank in (0, 1):
        started = reports(root, rank, 0, "started")[0]
        assert started["global_step"] == FAIL_STEP, started  # not 100, the periodic checkpoint
        assert started["hash"] == survivor[FAIL_STEP], (rank, started["hash"], survivor[FAIL_STEP])
        assert started["ckpt_path"] == str(root / "ckpt" / "ft_jit_state" / STATE), started["ckpt_path"]
        assert reports(root, rank, 0, "fit_end")[0]["global_step"] == 150
    resumed = sorted((r["rank"], r["step"], r["source"]) for r in events_of(events, "resumed"))
    assert resumed == [(0, FAIL_STEP, "jit_shared"), (1, FAIL_STEP, "jit_shared")], resumed
    assert "that a previous job copied to" in result.stderr
