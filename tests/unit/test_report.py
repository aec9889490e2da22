"""ft_report's reading and figures, and the goodput arithmetic it shares with bench/goodput.py.

The timeline of real runs (event logs written by real launchers) is tested in
tests/integration/test_report.py; here: the arithmetic, torn lines, roles, grouping.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import goodput as bench_goodput
from launcher.events import report
from launcher.events.goodput import Recovery, run_figures


def test_run_figures_arithmetic():
    figures = run_figures(100.0, 200.0, 60.0, [
        Recovery("hang", failed_at=110.0, recovered_at=114.0, restarted_at=111.0),
        Recovery("kill", failed_at=150.0, recovered_at=152.0, restarted_at=150.5),
        Recovery("hang", failed_at=170.0, recovered_at=172.0),
    ], kinds=("hang", "kill", "exit"))
    assert figures["wall_s"] == 100.0 and figures["useful_s"] == 60.0 and figures["goodput"] == 0.6
    assert figures["recoveries"] == 3
    assert figures["mttr_s"] == pytest.approx((4 + 2 + 2) / 3, abs=1e-3)
    assert figures["mttr_by_kind_s"] == {"hang": 3.0, "kill": 2.0, "exit": None}
    assert figures["to_restart_by_kind_s"] == {"hang": 1.0, "kill": 0.5, "exit": None}  # unknown restarts left out


def test_an_empty_run_has_no_goodput():
    assert run_figures(5.0, 5.0, 0.0, [])["goodput"] is None


def test_bench_goodput_uses_the_shared_computation(tmp_path):
    # Rank 0's progress log of two processes and one fault, as bench/goodput_train.py writes them.
    bench = tmp_path / "bench"
    bench.mkdir()
    lines = ["start 1 100.0", "step 1 1 101.0", "step 1 2 102.0", "step 1 3 103.0",
             "start 2 105.0", "step 2 3 107.0", "step 2 4 108.0", "end 2 4 108.5"]
    (bench / "progress.log").write_text("\n".join(lines) + "\n")
    (bench / "fault_1.json").write_text(json.dumps({"fault": 1, "kind": "kill", "step": 3, "time": 103.5}))
    result = bench_goodput.analyse(tmp_path, started=99.0, ended=109.0, max_steps=4)
    # steps 1..4, last completions: 1,2 by pid 1 (1 s each; the first at the median), 3,4 by pid 2
    assert result["useful_step_s"] == 4.0 and result["wall_s"] == 10.0 and result["goodput"] == 0.4
    assert result["mttr_s"] == 3.5  # 103.5 -> 107.0
    assert result["mttr_by_kind_s"] == {"hang": None, "kill": 3.5}
    assert result["fault_to_process_started_by_kind_s"] == {"hang": None, "kill": 1.5}


def record(event: str, ts: float, **fields) -> dict:
    return {"event": event, "ts": ts, "node": "n1", "pid": 10, "run_id": "r1", **fields}


def write_log(path: Path, records: list[dict], extra_lines: tuple[str, ...] = ()) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(extra_lines))


RUN = [
    record("launcher_start", 0.0, nnodes="1:1", nproc_per_node=2, max_restarts=3),
    record("cycle_start", 1.0, cycle=0, warm_start=False),
    record("workers_ready", 2.0, cycle=0),
    record("warm_template_started", 2.5, cycle=0, pid=99),  # another process's pid in "pid"
    record("failure", 10.0, cycle=0, rank=1, local_rank=1, worker_pid=21, cause="hang: ...", cause_kind="hang",
           hang_kind="heartbeat", detected_at=10.0, decision="restarting the worker group (restart 1/3)"),
    record("failure", 10.1, cycle=0, rank=0, local_rank=0, worker_pid=20, cause="stopped after another worker failed",
           cause_kind="terminated", detected_at=10.1, decision="stopped by the launcher"),
    record("cycle_start", 10.5, cycle=1, since_failure_s=0.5, warm_start=True),
    record("workers_ready", 11.0, cycle=1),
    record("result", 20.0, outcome="succeeded", exit_code=0, cycles=2),
]


def test_timeline_and_figures_of_one_launcher(tmp_path):
    write_log(tmp_path / "ft_events.jsonl", RUN)
    loaded = report.load(tmp_path)
    assert len(loaded.runs) == 1 and [c.index for c in loaded.runs[0].cycles] == [0, 1]
    figures = report.figures(loaded)
    assert figures["failures"] == 1 and figures["collateral"] == 1 and figures["cycles"] == 2
    assert figures["useful_s"] == 17.0  # (10 - 2) + (20 - 11)
    assert figures["mttr_s"] == 1.0 and figures["mttr_by_kind_s"] == {"hang (heartbeat)": 1.0}
    lines = report.timeline_lines(loaded)
    root = next(i for i, line in enumerate(lines) if "ROOT CAUSE" in line)
    assert "rank 1" in lines[root] and "decision: restarting" in lines[root + 1]
    assert "collateral: rank 0" in lines[root + 2]


def test_the_role_field_wins_when_the_launcher_gives_it(tmp_path):
    records = [dict(r) for r in RUN]
    records[4]["role"] = "collateral"  # the launcher says rank 1's hang was a consequence
    records[5]["role"] = "root"
    write_log(tmp_path / "ft_events.jsonl", records)
    lines = report.timeline_lines(report.load(tmp_path))
    assert "ROOT CAUSE: rank 0" in "\n".join(lines) and "collateral: rank 1" in "\n".join(lines)


def test_torn_and_foreign_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "events.jsonl"
    write_log(path, RUN[:3], extra_lines=('{"event": "failure", "ts": 5', "\n", "[1, 2]\n", "not json\n"))
    with open(path, "a") as stream:
        stream.write(json.dumps(RUN[-1]) + "\n")
    loaded = report.load(path)
    assert loaded.skipped_lines == 3
    assert loaded.runs[0].result is not None


def test_nothing_to_read_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no event log (*.jsonl with event records) in" in capsys.readouterr().err
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def lost_node_run(node: str, pid: int, detected: float) -> list[dict]:
    """A survivor's log: its rank stopped waiting for node2, which sent no report."""
    cause = ("node node2 (group rank 1) sent no report within 2.0 s: lost or cut off from the rendezvous store; "
             "every rank that reported was waiting in a collective")
    records = [
        record("launcher_start", 0.0, nnodes="2:3", nproc_per_node=1, max_restarts=3),
        record("cycle_start", 1.0, cycle=0, warm_start=False),
        record("workers_ready", 2.0, cycle=0),
        record("failure", detected + 2.5, cycle=0, rank=0, local_rank=0, worker_pid=20, cause="hang: no heartbeat",
               cause_kind="hang", hang_kind="heartbeat", detected_at=detected, role="collateral",
               root_rank=None, root_node="node2", root_group_rank=1, root_outcome="lost", root_cause=cause,
               decision="restarting the worker group (restart 1/3)"),
        record("cycle_start", detected + 6.0, cycle=1, since_failure_s=6.0, warm_start=True),
        record("workers_ready", detected + 8.0, cycle=1),
        record("result", 40.0, outcome="succeeded", exit_code=0, cycles=2),
    ]
    for r in records:
        r.update(node=node, pid=pid)
    return records


def test_a_lost_node_is_the_root_cause_of_the_survivors_cycle_and_one_incident(tmp_path):
    write_log(tmp_path / "ft_events_node1.jsonl", lost_node_run("node1", 10, 10.0))
    write_log(tmp_path / "ft_events_node3.jsonl", lost_node_run("node3", 30, 10.2))
    loaded = report.load(tmp_path)
    lines = "\n".join(report.timeline_lines(loaded))
    assert "[node1] cycle 0: ROOT CAUSE: node node2 (group rank 1) sent no report within 2.0 s" in lines
    assert "[node3] cycle 0: decision: restarting the worker group" in lines
    assert "[node1] cycle 0: collateral: rank 0" in lines
    figures = report.figures(loaded)
    assert figures["failures"] == 1 and figures["collateral"] == 2  # one incident seen by two nodes
    assert figures["mttr_by_kind_s"] == {"lost node": 8.0}
    assert figures["useful_s"] == 8.0 + 40.0 - 18.0  # the first node's cycles: 2 -> 10, 18 -> 40


# ---------------------------------------------------------------------- per-node logs, graceful stops


def node_log(node: str, pid: int, step_of_rank: dict[int, int], start: float) -> list[dict]:
    """One node's launcher of autoresume attempt 1 (run id r1): one cycle, a graceful stop on SIGUSR1."""
    records = [
        record("launcher_start", start, nnodes="2:2", nproc_per_node=2, max_restarts=0, attempt=1),
        record("cycle_start", start + 1.0, cycle=0, warm_start=False),
        record("workers_ready", start + 2.0, cycle=0),
        *(record("graceful_stop", start + 9.0, cycle=0, rank=rank, local_rank=rank % 2, worker_pid=pid + rank,
                 step=step, run_steps=step - 400, signal="SIGUSR1") for rank, step in step_of_rank.items()),
        record("result", start + 10.0, outcome="stopped: graceful stop after step 447 on SIGUSR1, not finished",
               exit_code=0, cycles=1),
    ]
    for r in records:
        r.update(node=node, pid=pid)
    return records


def per_node_run(tmp_path: Path, n2_steps: dict[int, int]) -> Path:
    """autoresume's run dir with per-node logs in events/ (docs/multinode.md's sbatch example)."""
    run = tmp_path / "run1"
    events = run / "events"
    events.mkdir(parents=True)
    write_log(events / "n1.jsonl", node_log("n1", 100, {0: 447, 1: 447}, 1000.0))
    write_log(events / "n2.jsonl", node_log("n2", 200, n2_steps, 1000.2))
    (events / "n1.jsonl.lock").write_text("")
    (events / "metrics.jsonl").write_text('{"loss": 0.5}\n')  # another program's JSON lines: left out
    (run / "history.tsv").write_text(
        "attempt\tjob_id\tstart\tend\texit_code\tflag\tfailures\tdecision\n"
        f"1\t7\t{_iso(999.0)}\t{_iso(1012.0)}\t0\tno\t0\tcontinue: not finished\n")
    return run


def _iso(ts: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z")


def test_per_node_logs_in_a_directory_are_read_as_one_run_with_the_autoresume_history(tmp_path, capsys):
    # issue 29 item 11: `ft_report run1/events` failed (no ft_events*.jsonl) and two files were
    # "unrecognized arguments"; every node's log and history.tsv now make one timeline.
    run = per_node_run(tmp_path, {2: 447, 3: 447})
    assert report.main([str(run / "events")]) == 0
    out = capsys.readouterr().out
    assert "n1.jsonl" in out and "n2.jsonl" in out and "metrics.jsonl" not in out
    assert "unreadable" not in out
    assert "[n1] ft_launcher started" in out and "[n2] ft_launcher started" in out
    assert "== autoresume attempt 1 ended (ft_launcher exit 0, flag no): continue: not finished" in out
    assert "[n1] cycle 0: graceful stop on SIGUSR1: ranks 0, 1 stopped after step 447" in out
    assert "[n2] cycle 0: graceful stop on SIGUSR1: ranks 2, 3 stopped after step 447" in out
    assert ("graceful stop (attempt 1, run id r1): every rank that reported (4 on 2 node(s)) stopped after "
            "step 447 on SIGUSR1") in out
    assert "ft_launcher ended: stopped: graceful stop after step 447 on SIGUSR1, not finished (exit code 0)" in out

    # the same from the two files, and from the run directory (its events/ subdirectory)
    assert report.main([str(run / "events" / "n1.jsonl"), str(run / "events" / "n2.jsonl")]) == 0
    assert "[n2] cycle 0: graceful stop" in capsys.readouterr().out
    loaded = report.load(run)
    assert {r.node for r in loaded.runs} == {"n1", "n2"} and len(loaded.attempts) == 1
    assert len(report.load([run / "events", run / "events" / "n1.jsonl"]).sources) == 2  # each file once


def test_ranks_that_stopped_after_different_steps_are_shown(tmp_path, capsys):
    run = per_node_run(tmp_path, {2: 446, 3: 447})
    assert report.main([str(run / "events"), "--json"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["graceful_stops"] == [{"run_id": "r1", "attempt": 1, "signal": "SIGUSR1", "ranks": 4,
                                         "same_step": False, "steps": {"n1": [447], "n2": [446, 447]}}]
    assert report.main([str(run / "events")]) == 0
    out = capsys.readouterr().out
    assert "[n2] cycle 0: graceful stop on SIGUSR1: ranks stopped after DIFFERENT steps: rank 2 after step 446, " \
           "rank 3 after step 447" in out
    assert "the ranks stopped after DIFFERENT steps on SIGUSR1: n1: 447; n2: 446, 447" in out


def test_two_histories_or_only_a_history_are_clear_errors(tmp_path, capsys):
    first, second = per_node_run(tmp_path / "a", {2: 1}), per_node_run(tmp_path / "b", {2: 1})
    assert report.main([str(first), str(second)]) == 2
    assert "more than one autoresume history.tsv" in capsys.readouterr().err
    assert report.main([str(first / "history.tsv")]) == 2
    assert "no event log among" in capsys.readouterr().err



def test_a_refused_replace_request_is_on_the_timeline(tmp_path, capsys):
    # issue 31 item 2: the launcher's line of a refused straggler replace request, in ft_report too
    from launcher.events.records import LauncherStart, ReplaceRefused

    why = ("rank 1 (pid 9) requested ExcludeThisNode: straggler: node b flagged in 2 straggler reports in a row: "
           "not replaced: no spare node waits and --nnodes allows no fewer than this job's 2 node(s) (MIN 2); "
           "training goes on")
    records = [LauncherStart(ts=1000.0, time=_iso(1000.0), node="b", pid=1, run_id="r1", nnodes="2:2"),
               ReplaceRefused(ts=1010.0, time=_iso(1010.0), node="b", pid=1, run_id="r1", cycle=0, reason=why,
                              nodes=2, min_nodes=2, spares_waiting=0)]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r.to_wire()) + "\n" for r in records))
    assert report.main([str(path)]) == 0
    assert f"[b] {why}" in capsys.readouterr().out
