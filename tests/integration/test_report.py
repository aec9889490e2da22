"""What happened in my run: a real job under scripts/autoresume.sh and ft_launcher, then ft_report.

One run (module fixture; 2 ranks of tests/workers/report_worker.py, stdlib + ft_core): attempt 1
has a hang in cycle 0 and a ``ValueError`` in cycle 1 (no restarts left), attempt 2 finishes.
Nothing tells the launcher where to keep its event log: the default under autoresume.sh is
``$AUTORESUME_RUN_DIR/ft_events.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.autoresume_common import (
    FT_LAUNCHER,
    SCRIPT,
    AutoresumeRun,
    assert_no_leftovers,
    read_history,
)

WORKER = Path(__file__).resolve().parents[1] / "workers" / "report_worker.py"
FT_REPORT = Path(sys.executable).parent / "ft_report"
LAUNCHER_ARGS = ("--standalone --nproc-per-node 2 --max-restarts 1 --monitor-interval 0.1 "
                 "--ft-param-initial_rank_heartbeat_timeout 30 --ft-param-rank_heartbeat_timeout 3")


class Job:
    def __init__(self, run: AutoresumeRun, returncode: int, output: str) -> None:
        self.run = run
        self.returncode = returncode
        self.output = output

    @property
    def events_path(self) -> Path:
        return self.run.run_dir / "ft_events.jsonl"

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.events_path.read_text().splitlines()]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Iterator[Job]:
    base = tmp_path_factory.mktemp("report")
    private_tmp = Path(tempfile.mkdtemp(prefix="rp-"))
    run = AutoresumeRun(base, private_tmp)
    try:
        out = subprocess.run(
            ["bash", str(SCRIPT), "--launcher", str(FT_LAUNCHER), "--run-dir", str(run.run_dir),
             "--launcher-args", LAUNCHER_ARGS, "--", str(WORKER)],
            env=run._script_env(dict(os.environ)), cwd=base, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=150, start_new_session=True)
        yield Job(run, out.returncode, out.stdout + out.stderr)
        assert_no_leftovers(run.token, private_tmp)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def ft_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FT_REPORT), *args], capture_output=True, text=True, timeout=60)


def test_the_job_ran_as_planned(job):
    assert job.returncode == 0, job.output
    assert [row.decision.split(":")[0] for row in read_history(job.run.run_dir)] == ["continue", "finished"]


def test_the_event_log_is_kept_in_autoresumes_run_dir_by_default(job):
    assert job.events_path.exists(), job.output
    assert f"event log: {job.events_path}" in job.output
    assert f"event log = {job.events_path}  (AUTORESUME_RUN_DIR)" in job.output  # the effective config says so


def test_every_record_carries_its_run_id_and_both_attempts_share_the_file(job):
    events = job.events()
    starts = [e for e in events if e["event"] == "launcher_start"]
    assert [s["attempt"] for s in starts] == ["1", "2"]
    assert len({s["run_id"] for s in starts}) == 2
    assert all(e.get("run_id") for e in events)
    for start in starts:  # each launcher's records carry its own run id, up to its summary
        own = [e for e in events if e["run_id"] == start["run_id"]]
        assert own[0]["event"] == "launcher_start" and own[-1]["event"] == "summary"


def test_the_failure_line_carries_the_exceptions_last_line(job):
    [line] = [line for line in job.output.splitlines() if "failed: exit code 1: ValueError: bad batch 7;" in line]
    assert line.endswith("no restarts left (--max-restarts=1); stopping"), line
    [failure] = [e for e in job.events() if e["event"] == "failure" and e["cycle"] == 1 and e["rank"] == 0]
    assert failure["cause"] == "exit code 1: ValueError: bad batch 7"
    assert failure["error"] == "ValueError: bad batch 7"


def test_ft_report_tells_the_story_root_cause_first(job):
    out = ft_report(str(job.run.run_dir))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()

    def index(fragment: str, start: int = 0) -> int:
        return next(i for i, line in enumerate(lines) if i >= start and fragment in line)

    order = [index("autoresume attempt 1 starts")]
    order.append(index("cycle 0: workers started", order[-1]))
    order.append(index("cycle 0: all workers ready", order[-1]))
    order.append(index("cycle 0: ROOT CAUSE: rank 1", order[-1]))
    assert "hang: no heartbeat" in lines[order[-1]]
    order.append(index("cycle 0: decision: restarting the worker group", order[-1]))
    order.append(index("cycle 1: workers started", order[-1]))
    order.append(index("cycle 1: ROOT CAUSE: rank 0", order[-1]))
    assert "ValueError: bad batch 7" in lines[order[-1]]
    order.append(index("cycle 1: collateral: rank 1", order[-1]))
    order.append(index("ft_launcher ended: failed (exit code 1)", order[-1]))
    order.append(index("autoresume attempt 1 ended", order[-1]))
    assert "continue: failure 1 of at most" in lines[order[-1]]
    order.append(index("autoresume attempt 2 starts", order[-1]))
    order.append(index("ft_launcher ended: succeeded (exit code 0)", order[-1]))
    assert order == sorted(order)
    summary = "\n".join(lines[order[-1]:])
    assert "2 attempt(s), 2 launcher run(s), 3 cycle(s); finished: yes" in summary
    assert "failures: 2 root cause(s), 1 worker(s) stopped as a consequence" in summary
    assert "mean time to recover" in summary and "over 2 recover(ies)" in summary
    # what each failure cost: the ranks' steps against where the restart resumed (report_resumed)
    assert "cost of the cycle 0 failure: failed in step 19, resumed from step 15 (periodic checkpoint" in out.stdout
    assert "cost of the cycle 1 failure: failed in step 34, resumed from step 30 (just-in-time state" in out.stdout
    assert "work redone: 8 step(s) over 2 of 2 failure(s) (1 from a periodic checkpoint, 1 from just-in-time state)" \
        in summary


def test_ft_report_figures_as_json(job):
    out = ft_report(str(job.events_path), "--json")
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["failures"] == 2 and figures["recoveries"] == 2 and figures["finished"] is True
    assert 0 < figures["goodput"] < 1
    assert set(figures["mttr_by_kind_s"]) == {"hang (heartbeat)", "exit"}
    # the hang's recovery is in-job (one launcher); the crash's spans a new autoresume attempt
    assert figures["mttr_by_kind_s"]["hang (heartbeat)"] < figures["mttr_by_kind_s"]["exit"]
    assert [(c["failed_step"], c["resumed_step"], c["source"]) for c in figures["failure_costs"]] == [
        (19, 15, "checkpoint"), (34, 30, "jit")]
    # 4 steps each at the median step time (50 ms of sleep and a heartbeat per step; loaded machine: < 0.2 s)
    assert figures["redone_steps"] == 8 and 0.04 <= figures["step_s"] < 0.2
    assert figures["redone_s"] == pytest.approx(8 * figures["step_s"], abs=0.01)


def test_ft_report_plots_the_timeline(job, tmp_path):
    png = tmp_path / "timeline.png"
    out = ft_report(str(job.run.run_dir), "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000  # a drawn chart, not an empty canvas


def test_a_line_left_incomplete_is_closed_before_the_next_record(tmp_path):
    # A launcher killed in the middle of a write leaves a partial line; the next launcher's
    # records must still be whole lines.
    log = tmp_path / "events.jsonl"
    log.write_text('{"event": "failure", "ts": 1')
    worker = Path(__file__).resolve().parents[1] / "workers" / "ft_worker.py"
    from tests.launcher_util import run_launcher

    out = run_launcher(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1",
                        "--ft-event-log", str(log), str(worker), "--steps", "2"])
    assert out.returncode == 0, out.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == '{"event": "failure", "ts": 1'
    records = [json.loads(line) for line in lines[1:]]
    assert records[0]["event"] == "launcher_start" and records[-1]["event"] == "summary"


def test_odd_lines_are_counted_as_unreadable_not_a_traceback(tmp_path):
    # issue 21 item 12: every odd line of tests/unit/test_records.py in one log between whole records
    from tests.unit.test_records import ODD_LINES

    records = [{"event": "launcher_start", "ts": 1000.0, "node": "n1", "pid": 5, "run_id": "r1"},
               {"event": "cycle_start", "ts": 1001.0, "node": "n1", "pid": 5, "run_id": "r1", "cycle": 0},
               {"event": "workers_ready", "ts": 1002.0, "node": "n1", "pid": 5, "run_id": "r1", "cycle": 0},
               {"event": "result", "ts": 1010.0, "node": "n1", "pid": 5, "run_id": "r1", "outcome": "succeeded"}]
    log = tmp_path / "ft_events.jsonl"
    log.write_text("\n".join([json.dumps(r) for r in records[:3]] + list(ODD_LINES.values())
                             + [json.dumps(records[3])]) + "\n")
    out = ft_report(str(log))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"({len(ODD_LINES)} unreadable line(s) skipped)" in out.stdout
    assert "1 launcher run(s), 1 cycle(s)" in out.stdout and "goodput <= 0.800" in out.stdout
    figures = json.loads(ft_report(str(log), "--json").stdout)
    assert figures["wall_s"] == 10.0 and figures["cycles"] == 1


def test_a_flag_file_named_outside_autoresume_is_reported(tmp_path):
    # issue 22 item 5: a run without autoresume.sh (no history.tsv) said "finished: -"; the
    # launcher records whether FAULT_TOL_FINISHED_FLAG_FILE existed at its end (the "no" case:
    # tests/unit/test_records.py)
    from tests.launcher_util import events_of, read_events, run_launcher

    behaviour = "finish"

    log, flag = tmp_path / "logs" / "ft_events.jsonl", tmp_path / "done.flag"
    log.parent.mkdir()
    worker = Path(__file__).resolve().parents[1] / "workers" / "autoresume_worker.py"
    out = run_launcher(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1",
                        "--ft-event-log", str(log), str(worker), str(tmp_path), behaviour],
                       env={**os.environ, "FAULT_TOL_FINISHED_FLAG_FILE": str(flag)})
    assert out.returncode == 0, out.stderr
    [result] = events_of(read_events(log), "result")
    assert (result["finished_flag_file"], result["finished"]) == (str(flag), behaviour == "finish")
    report = ft_report(str(log.parent))
    assert report.returncode == 0, report.stderr
    assert f"finished: yes (flag file present: {flag})" in report.stdout
    assert json.loads(ft_report(str(log), "--json").stdout)["finished_flag_file"] == str(flag)


def test_the_plot_of_a_long_run_is_reduced_to_what_it_can_show(tmp_path):
    # issue 21 item 12: one matplotlib artist per cycle, failure and label made a 100 000-record
    # log take minutes and gigabytes (bench/report_scale.py measures it); the chart now draws each
    # row's bars as one collection per colour and writes per-item labels only while they are few
    cycles, lines = 300, []
    for node in ("n0", "n1"):
        envelope = {"node": node, "pid": 7, "run_id": node}
        lines.append({"event": "launcher_start", "ts": 1000.0, **envelope})
        for cycle in range(cycles):
            ts = 1001.0 + 10 * cycle
            lines += [{"event": "cycle_start", "ts": ts, "cycle": cycle, **envelope},
                      {"event": "workers_ready", "ts": ts + 1, "cycle": cycle, **envelope},
                      {"event": "failure", "ts": ts + 9, "cycle": cycle, "cause": "exit code 1", "rank": 0,
                       "cause_kind": "exit" if node == "n0" else "terminated", **envelope}]
        lines.append({"event": "result", "ts": 1001.0 + 10 * cycles, "outcome": "failed", **envelope})
    log, svg = tmp_path / "ft_events.jsonl", tmp_path / "timeline.svg"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = ft_report(str(log), "--plot", str(svg))
    assert out.returncode == 0, out.stderr
    drawing = svg.read_text()
    assert drawing.count('id="PolyCollection_') == 4  # two rows, two colours
    assert drawing.count('id="patch_') < 20  # the axes and the legend; no bar of its own per cycle
    assert drawing.count('id="text_') < 30  # the ticks, title and legend; no "cycle N" or failure labels
    assert "2 launcher run(s), 600 cycle(s)" in out.stdout


@pytest.mark.parametrize("attempt", ["²", "٣", "-1", True, 1.5])
def test_an_odd_attempt_number_is_an_unknown_attempt_not_a_traceback(tmp_path, attempt):
    # issue 31 item 11: "²" passed str.isdigit() and then int() raised a ValueError traceback
    records = [{"event": "launcher_start", "ts": 1000.0, "node": "n1", "pid": 5, "run_id": "r1", "attempt": attempt},
               {"event": "cycle_start", "ts": 1001.0, "node": "n1", "pid": 5, "run_id": "r1", "cycle": 0},
               {"event": "result", "ts": 1010.0, "node": "n1", "pid": 5, "run_id": "r1", "outcome": "succeeded"}]
    log = tmp_path / "ft_events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = ft_report(str(log))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "1 launcher run(s), 1 cycle(s)" in out.stdout
    figures = json.loads(ft_report(str(log), "--json").stdout)
    assert figures["wall_s"] == 10.0 and figures["attempts"] == 1
