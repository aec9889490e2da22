"""The coordinated graceful stop (issue 13.14) and the front ends' console lines (issue 14.4),
under a real ft_launcher with 2 ranks (gloo on CPU): real signals, real Trainer, real loop.

Signals go to the launcher, which forwards SIGUSR1 to every worker and stops them with SIGTERM on
its own SIGTERM (as under SLURM), or a rank sends one to itself (the others must stop with it).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from launcher.events import report
from tests.launcher_util import (
    HEARTBEAT_ARGS,
    SECTION_ARGS,
    events_of,
    read_events,
    run_launcher,
    start_launcher,
    wait_for,
)

WORKERS = Path(__file__).resolve().parents[1] / "workers"
LIGHTNING_WORKER = str(WORKERS / "lightning_train.py")
LOOP_WORKER = str(WORKERS / "integration_train.py")
USER_SCRIPT = str(WORKERS / "user_lightning_script.py")

pytestmark = pytest.mark.slow


def launcher_args(tmp_path: Path, *ft_args: str, nproc: int = 2, term_timeout: float = 10) -> list[str]:
    return ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0", "--monitor-interval", "0.05",
            "--term-timeout", str(term_timeout), "--ft-event-log", str(tmp_path / "events.jsonl"), *ft_args]


def reports(root: Path, rank: int, op: str, cycle: int = 0) -> list[dict]:
    path = root / f"report_rank{rank}_cycle{cycle}.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == op]


def training_reached(root: Path, step: int, ranks: tuple[int, ...] = (0, 1)) -> bool:
    return all(any(r.get("global_step", r.get("step", -1)) >= step for r in reports(root, rank, "step"))
               for rank in ranks)


def finish(proc, timeout: float = 60) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except Exception:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"ft_launcher did not finish in {timeout} s:\n{err[-5000:]}") from None
    return proc.returncode, out + err


def checkpoint_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


# ---------------------------------------------------------------------- Lightning


@pytest.mark.parametrize("kind", ["heartbeats", "sections"])
def test_sigusr1_stops_every_rank_after_the_same_step_with_a_checkpoint_and_the_next_run_resumes_there(
        tmp_path, kind):
    flag = tmp_path / "finished.flag"
    root = tmp_path / "run"
    cfg = {"callback": kind, "root": str(root), "ddp": True, "max_steps": 100_000, "step_sleep": 0.02,
           "ckpt_every": 100_000, "resume": True, "report_steps": True,
           "cb": {"autoresume": True, "calculate_timeouts": True, "graceful_stop": True}}
    ft_args = HEARTBEAT_ARGS if kind == "heartbeats" else SECTION_ARGS
    proc = start_launcher(launcher_args(tmp_path, *ft_args) + [LIGHTNING_WORKER, json.dumps(cfg)],
                          env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)})
    wait_for(lambda: training_reached(root, 5) or proc.poll() is not None, 90, "both ranks training")
    proc.send_signal(signal.SIGUSR1)  # ft_launcher forwards it to every worker
    code, out = finish(proc)
    assert code == 0, out[-6000:]

    saves = {rank: [r["global_step"] for r in reports(root, rank, "save")] for rank in (0, 1)}
    assert len(saves[0]) == 1 and saves[0] == saves[1], saves  # every rank took part in the one save
    stop_step = saves[0][0]
    for rank in (0, 1):
        assert "GracefulStopExit" in reports(root, rank, "exception")[0]["exc"]
        assert max(r["global_step"] for r in reports(root, rank, "step")) <= stop_step  # nothing trained after it
    assert checkpoint_step(root / "ckpt" / "last.ckpt") == stop_step
    assert not flag.exists()  # stopped, not finished
    assert f"every rank stops after global step {stop_step}" in out and "graceful stop: SIGUSR1" in out
    # every rank's stop is recorded with the global step; the result is "stopped", not "succeeded"
    events = read_events(tmp_path / "events.jsonl")
    assert sorted((r["rank"], r["step"], r["signal"]) for r in events_of(events, "graceful_stop")) == [
        (0, stop_step, "SIGUSR1"), (1, stop_step, "SIGUSR1")]
    assert events_of(events, "result")[0]["outcome"] == (f"stopped: graceful stop after step {stop_step} on "
                                                         "SIGUSR1, not finished")

    # The next run resumes at the stop step and finishes.
    cfg["max_steps"] = stop_step + 4
    result = run_launcher(launcher_args(tmp_path, *ft_args) + [LIGHTNING_WORKER, json.dumps(cfg)], timeout=110,
                          env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)})
    assert result.returncode == 0, result.stderr[-6000:]
    assert [reports(root, rank, "started")[-1]["global_step"] for rank in (0, 1)] == [stop_step, stop_step]
    assert json.loads(flag.read_text())["global_step"] == stop_step + 4


def test_sigterm_to_the_launcher_stops_the_ranks_gracefully_within_the_term_timeout(tmp_path):
    flag = tmp_path / "finished.flag"
    root = tmp_path / "run"
    cfg = {"callback": "heartbeats", "root": str(root), "ddp": True, "max_steps": 100_000, "step_sleep": 0.02,
           "ckpt_every": 100_000, "report_steps": True, "cb": {"autoresume": True, "graceful_stop": True}}
    proc = start_launcher(
        launcher_args(tmp_path, *HEARTBEAT_ARGS, term_timeout=15) + [LIGHTNING_WORKER, json.dumps(cfg)],
        env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)})
    wait_for(lambda: training_reached(root, 5) or proc.poll() is not None, 90, "both ranks training")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # the launcher stops its workers with SIGTERM
    code, out = finish(proc)
    took = time.monotonic() - sent
    saves = {rank: [r["global_step"] for r in reports(root, rank, "save")] for rank in (0, 1)}
    assert len(saves[0]) == 1 and saves[0] == saves[1], out[-6000:]
    for rank in (0, 1):  # each rank left fit through the graceful stop, not killed
        assert "GracefulStopExit" in reports(root, rank, "exception")[0]["exc"], out[-6000:]
    assert checkpoint_step(root / "ckpt" / "last.ckpt") == saves[0][0]
    assert not flag.exists()
    assert took < 15, f"the ranks took {took:.1f} s to stop"
    # The launcher's own code after SIGTERM: 128+15 today; 0 once it reports workers that all exited 0
    # (issue 12.4, Contract 4). The ranks' side is what this test is about.
    assert code in (0, 128 + signal.SIGTERM), out[-6000:]


def test_sigterm_without_graceful_stop_does_not_count_as_completed_training(tmp_path):
    # Lightning turns SIGTERM into SIGTERMException, a SystemExit() that exits 0: before the fix
    # the callback took it for a clean end and wrote the finished flag, so autoresume.sh stopped.
    flag = tmp_path / "finished.flag"
    root = tmp_path / "run"
    cfg = {"callback": "heartbeats", "root": str(root), "max_steps": 100_000, "step_sleep": 0.02,
           "report_steps": True, "cb": {"autoresume": True}}
    proc = start_launcher(launcher_args(tmp_path, *HEARTBEAT_ARGS, nproc=1) + [LIGHTNING_WORKER, json.dumps(cfg)],
                          env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)})
    wait_for(lambda: training_reached(root, 5, ranks=(0,)) or proc.poll() is not None, 90, "training")
    proc.send_signal(signal.SIGTERM)
    _, out = finish(proc)
    assert "SIGTERMException" in reports(root, 0, "exception")[0]["exc"], out[-6000:]
    assert not flag.exists(), out[-6000:]
    assert "training did not complete" in out


# ---------------------------------------------------------------------- ft_core.client.integration


def test_a_signal_to_one_rank_of_a_loop_stops_both_after_the_same_step_and_the_next_run_resumes_there(tmp_path):
    ckpt = tmp_path / "ckpt"
    cfg = {"ckpt_dir": str(ckpt), "report_dir": str(tmp_path), "steps": 100_000, "ckpt_every": 100_000,
           "step_sleep": 0.01, "graceful_stop": {"signals": ["SIGUSR1"], "check_interval": 0.2},
           "signal_self": {"rank": 1, "step": 30, "signal": "SIGUSR1"}}
    result = run_launcher(launcher_args(tmp_path, *SECTION_ARGS) + [LOOP_WORKER, json.dumps(cfg)], timeout=110)
    assert result.returncode == 0, result.stderr[-6000:]
    stopped = {rank: reports(tmp_path, rank, "stopped")[0] for rank in (0, 1)}
    assert stopped[0]["step"] == stopped[1]["step"], stopped
    stop_step = stopped[0]["step"]
    assert 30 <= stop_step <= 30 + 100, stopped  # the next check after the signal (0.2 s of 10 ms steps)
    assert stopped[1]["received"] == "SIGUSR1" and stopped[0]["received"] is None  # only rank 1 got it
    assert stopped[0]["signal"] == stopped[1]["signal"] == "SIGUSR1"
    assert stopped[0]["checks"] < stop_step / 4  # a collective every ~20 steps, not every step
    assert json.loads((ckpt / "checkpoint.json").read_text())["step"] == stop_step
    assert "graceful stop: SIGUSR1 (received by another rank)" in result.stderr

    cfg.update(steps=stop_step + 3, signal_self=None)
    again = run_launcher(launcher_args(tmp_path, *SECTION_ARGS) + [LOOP_WORKER, json.dumps(cfg)], timeout=110)
    assert again.returncode == 0, again.stderr[-6000:]
    assert [reports(tmp_path, rank, "started")[-1]["step"] for rank in (0, 1)] == [stop_step, stop_step]
    assert [reports(tmp_path, rank, "end")[-1]["step"] for rank in (0, 1)] == [stop_step + 3] * 2


# ---------------------------------------------------------------------- the stop in words and records


RESUMED_AT = 400  # the loop resumes from a checkpoint at this (global) step: its own count starts at 0


def resumed_loop_cfg(tmp_path: Path, **extra) -> dict:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint.json").write_text(json.dumps({"step": RESUMED_AT}))
    return {"ckpt_dir": str(ckpt), "report_dir": str(tmp_path), "steps": 100_000, "ckpt_every": 100_000,
            "step_sleep": 0.01, "report_steps": True, "graceful_stop": {"check_interval": 0.2}, **extra}


def check_stop_is_named_and_recorded(tmp_path: Path, stderr: str, code: int, signal_name: str) -> None:
    """The stop line names the user's step; every rank's graceful_stop record holds it; the result
    and ft_report say "stopped", not "succeeded"."""
    stopped = {rank: reports(tmp_path, rank, "stopped")[0] for rank in (0, 1)}
    stop_step = stopped[0]["step"]
    assert stopped[1]["step"] == stop_step > RESUMED_AT, stopped
    assert code == 0, stderr[-6000:]  # autoresume.sh continues a run that exited 0 without the flag
    # issue 29 item 10: the line named "training step 30 of this run" while the loop counts 430
    assert (f"every rank stops after training step {stop_step} (step {stop_step - RESUMED_AT} of this run)"
            in stderr), stderr[-6000:]
    events = read_events(tmp_path / "events.jsonl")
    stops = sorted(events_of(events, "graceful_stop"), key=lambda r: r["rank"])
    assert [(r["rank"], r["step"], r["run_steps"], r["signal"]) for r in stops] == [
        (rank, stop_step, stop_step - RESUMED_AT, signal_name) for rank in (0, 1)], stops
    outcome = f"stopped: graceful stop after step {stop_step} on {signal_name}, not finished"
    assert events_of(events, "result")[0]["outcome"] == outcome
    assert f"result: {outcome} (exit code 0)" in stderr
    lines = report.timeline_lines(report.load(tmp_path / "events.jsonl"))
    assert any(f"graceful stop on {signal_name}: ranks 0, 1 stopped after step {stop_step}" in line for line in lines)


def test_a_stop_names_the_users_step_in_its_line_its_records_and_its_result(tmp_path):
    # rank 1 signals itself 30 steps after the resume: both ranks stop, the launcher's result says so
    cfg = resumed_loop_cfg(tmp_path, signal_self={"rank": 1, "step": RESUMED_AT + 30, "signal": "SIGUSR1"})
    result = run_launcher(launcher_args(tmp_path, *SECTION_ARGS) + [LOOP_WORKER, json.dumps(cfg)], timeout=110)
    check_stop_is_named_and_recorded(tmp_path, result.stderr, result.returncode, "SIGUSR1")


def test_sigterm_to_the_launcher_ends_in_a_stopped_result_not_a_plain_signal(tmp_path):
    cfg = resumed_loop_cfg(tmp_path)
    proc = start_launcher(launcher_args(tmp_path, *SECTION_ARGS, term_timeout=20) + [LOOP_WORKER, json.dumps(cfg)])
    wait_for(lambda: training_reached(tmp_path, RESUMED_AT + 5) or proc.poll() is not None, 90, "both ranks training")
    proc.send_signal(signal.SIGTERM)  # the launcher stops its workers with SIGTERM: a graceful stop
    code, out = finish(proc)
    check_stop_is_named_and_recorded(tmp_path, out, code, "SIGTERM")


# ---------------------------------------------------------------------- what reaches the console


def test_a_users_script_without_logging_setup_shows_the_important_lines_once(tmp_path):
    flag = tmp_path / "finished.flag"
    result = run_launcher(launcher_args(tmp_path, *SECTION_ARGS) + [USER_SCRIPT, str(tmp_path / "run"), "40"],
                          timeout=110, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)})
    assert result.returncode == 0, result.stderr[-6000:]
    err = result.stderr
    lines = err.splitlines()
    connected = [line for line in lines if "connected to the rank monitor" in line]
    assert len(connected) == 1 and connected[0].startswith("[rank 0]"), err[-6000:]  # rank 0 only
    assert "section timeouts in force: checkpointing 60.0 s (configured)" in connected[0]
    assert any("FaultToleranceSectionsCallback set up: timeouts file" in line for line in lines)
    in_force = [line for line in lines if "section timeouts in force (calculated)" in line]
    # 4 checkpoint saves (and the final update) calculate timeouts; they changed twice
    # (checkpointing, then step once 16 iterations ran): two lines, not one per checkpoint.
    assert len(in_force) == 2, err[-6000:]
    assert "raised to the minimum 60.0 s" in in_force[0]
    assert len([line for line in lines if "saved calculated timeouts to" in line]) == 2
    assert any(f"created {flag}" in line for line in lines)
    assert not [line for line in lines if line.startswith("[rank 1]")]  # other ranks are quiet at INFO

    quiet = run_launcher(launcher_args(tmp_path, *SECTION_ARGS, "--ft-param-log_level", "WARNING")
                         + [USER_SCRIPT, str(tmp_path / "run2"), "20"],
                         timeout=110, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(tmp_path / "flag2")})
    assert quiet.returncode == 0, quiet.stderr[-6000:]
    assert "connected to the rank monitor" not in quiet.stderr and "set up: timeouts file" not in quiet.stderr
