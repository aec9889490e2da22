"""A failure that repeats without progress stops the restarts (issue 23), with real launchers.

tests/workers/repeat_crash.py: rank 1 raises ValueError("bad shard <random>") at step 30 of every
cycle (a deterministic bug: the message's number differs, the fingerprint does not), or at a
later step each cycle (progress: restarted every time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ft_core import FaultToleranceConfig
from ft_core.wire.config import ConfigError
from launcher import get_args_parser
from launcher.exit_codes import EXIT_FAILURE, EXIT_REPEATED_FAILURE
from tests.launcher_util import events_of, read_events, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "repeat_crash.py")


def launch(tmp_path: Path, *worker_args: str, max_restarts: int = 10, extra: tuple[str, ...] = ()) -> tuple:
    log = tmp_path / "events.jsonl"
    result_file = tmp_path / "result"
    done = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts),
                         "--monitor-interval", "0.1", "--ft-event-log", str(log), *extra, WORKER, *worker_args],
                        timeout=180, env={"FT_LAUNCHER_RESULT_FILE": str(result_file)})
    result = dict(line.split("=", 1) for line in result_file.read_text().splitlines())
    return done, read_events(log), result


def test_the_same_bug_at_the_same_step_stops_after_two_cycles_with_its_own_exit_code(tmp_path: Path) -> None:
    done, events, result = launch(tmp_path)
    assert done.returncode == EXIT_REPEATED_FAILURE, done.stderr[-4000:]
    roots = [e for e in events_of(events, "failure") if e["role"] == "root"]
    assert [e["cycle"] for e in roots] == [0, 1], done.stderr[-4000:]
    assert len({e["fingerprint"] for e in roots}) == 1 and all(e["root_step"] == 30 for e in roots)
    assert "ValueError: bad shard N" in roots[0]["fingerprint_text"]
    assert "repeat_crash.py main" in roots[0]["fingerprint_text"]
    # One line says which failure repeated, where and in which cycles; no restart followed it.
    line = next(line for line in done.stderr.splitlines() if "without progress" in line)
    assert "cycles 0, 1 at step 30" in line and roots[1]["fingerprint"] in line, line
    assert len(events_of(events, "cycle_start")) == 2
    assert events_of(events, "result")[-1]["outcome"] == "repeated_failure"
    assert result["exit_code"] == str(EXIT_REPEATED_FAILURE) and result["outcome"] == "repeated_failure"
    assert result["fingerprint"] == roots[1]["fingerprint"]
    # ft_report names it on each root cause
    report = subprocess.run([sys.executable, "-m", "launcher.events.report", str(tmp_path / "events.jsonl")],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert report.count(f"[fingerprint {roots[0]['fingerprint']}]") == 2, report


def test_failures_with_progress_between_them_are_restarted_every_time(tmp_path: Path) -> None:
    done, events, _ = launch(tmp_path, "--advance", "5", max_restarts=2)
    assert done.returncode == EXIT_FAILURE, done.stderr[-4000:]
    roots = [e for e in events_of(events, "failure") if e["role"] == "root"]
    assert [e["root_step"] for e in roots] == [30, 35, 40]
    assert len({e["fingerprint"] for e in roots}) == 1  # the same bug, but it moved on: not a loop
    assert "without progress" not in done.stderr


def test_the_reference_flags_set_the_rule_and_the_exit_code() -> None:
    cfg = FaultToleranceConfig.from_args(get_args_parser().parse_args(
        ["--ft-max-no-progress-cycles", "3", "--ft-min-progress-iterations", "50", "--ft-no-restart-exit-code", "70",
         "train.py"]))
    assert (cfg.max_no_progress_cycles, cfg.min_progress_iterations, cfg.no_restart_exit_code) == (3, 50, 70)
    with pytest.raises(ConfigError, match="other than 64 and 65"):
        FaultToleranceConfig(no_restart_exit_code=64)  # autoresume.sh gives 64 and 65 their own meaning


# ---------------------------------------------------------------- a plain loop without @record (issue 31)

PLAIN = str(Path(__file__).resolve().parents[1] / "workers" / "plain_loop_crash.py")
PLAIN_FT = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null",
            "--ft-param-rank_section_timeouts", "setup:120,step:120,checkpointing:120",
            "--ft-param-rank_out_of_section_timeout", "120"]


def launch_plain(tmp_path: Path, faults: list[dict], max_restarts: int) -> tuple:
    log = tmp_path / "events.jsonl"
    cfg = {"ckpt_dir": str(tmp_path / "ckpt"), "faults": faults}
    done = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts),
                         "--monitor-interval", "0.1", "--ft-event-log", str(log), *PLAIN_FT, PLAIN, json.dumps(cfg)],
                        timeout=180)
    roots = [e for e in events_of(read_events(log), "failure") if e["role"] == "root"]
    return done, roots


def test_a_plain_loop_without_record_names_its_exception_and_tells_two_bugs_apart(tmp_path: Path) -> None:
    # Issue 31 item 10: without @record the line said "exit code 1" and the fingerprint was
    # "crash: exit code 1" for any bug, so two different bugs stopped the job as a repeat.
    # Item 6: the second bug's message has a fresh temp dir, a UUID and a timestamp every cycle.
    second = {"step": 25, "raise": "KeyError",
              "message": "no shard in {tmpdir}/shard_3.bin (request {uuid} at {time})"}
    done, roots = launch_plain(tmp_path, [{"step": 25, "raise": "ValueError", "message": "bad lr {random}"},
                                          second, second], max_restarts=5)
    assert done.returncode == EXIT_REPEATED_FAILURE, done.stderr[-4000:]
    assert [e["cycle"] for e in roots] == [0, 1, 2], done.stderr[-4000:]
    # The failure line names the exception and its message; the fingerprint its frame.
    lines = [line for line in done.stderr.splitlines() if "rank 1" in line and "failed" in line]
    assert any("ValueError: bad lr" in line for line in lines), done.stderr[-4000:]
    assert "ValueError: bad lr N" in roots[0]["fingerprint_text"], roots[0]
    assert "plain_loop_crash.py main" in roots[0]["fingerprint_text"], roots[0]
    # Two different errors are not a repeat; the same one (its incidental text aside) is.
    assert roots[0]["fingerprint"] != roots[1]["fingerprint"] == roots[2]["fingerprint"]
    assert "<tmp>/shard_3.bin" in roots[1]["fingerprint_text"] and "<uuid>" in roots[1]["fingerprint_text"]
    line = next(line for line in done.stderr.splitlines() if "without progress" in line)
    assert "cycles 1, 2 at step 25" in line, line


def test_kills_from_outside_are_never_a_repeat(tmp_path: Path) -> None:
    # Issue 31 item 5: two SIGKILLs (the OOM killer for another tenant, an operator) at steps 25
    # and 23 stopped the job as a repeated failure (exit 66, never requeued); --max-restarts bounds them.
    kill = [{"step": 25, "kill": "SIGKILL"}, {"step": 23, "kill": "SIGKILL"}, {"step": 24, "kill": "SIGKILL"}]
    done, roots = launch_plain(tmp_path, kill, max_restarts=2)
    assert done.returncode == EXIT_FAILURE, done.stderr[-4000:]
    assert [e["cycle"] for e in roots] == [0, 1, 2], done.stderr[-4000:]
    assert [e["root_step"] for e in roots] == [25, 23, 24]
    assert "without progress" not in done.stderr and "no restarts left" in done.stderr
