"""Straggler detection with real processes: 4 DDP ranks (gloo, CPU) under ft_launcher, one made slower.

The worker (tests/workers/straggler_train.py) gives every rank the same synthetic compute (sleeps in
the forward and in the backward) and makes one rank's forward, or backward, 1.3x slower. The slow
rank must be flagged (relative score below the threshold) within its first 2 reports, and no other
rank in any report. The individual score is off here: ranks that share 2 cores with other tests see
their own speed change with the machine's load, which is what that score is for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from tests.launcher_util import events_of, read_events, run_launcher, start_launcher, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "straggler_train.py")
NULL_HEARTBEATS = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null"]
REPORT = re.compile(r"\[rank0\] INFO \S+: straggler report (\d+) ")
AFFECTED = re.compile(r"\[rank0\] WARNING \S+: STRAGGLER DETECTION WARNING: Some GPUs have worse relative "
                      r"performance\. Affected ranks: (\{.*\})")


def _flags(stderr: str) -> dict[int, set[int]]:
    """Report index -> ranks rank 0's "Affected ranks" line names (relative scores)."""
    flagged: dict[int, set[int]] = {}
    report = 0
    for line in stderr.splitlines():
        if m := REPORT.search(line):
            report = int(m.group(1))
            flagged[report] = set()
        elif m := AFFECTED.search(line):
            flagged[report] |= {int(r) for r in re.findall(r"rank=(\d+)", m.group(1))}
    return flagged


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _launch(tmp_path: Path, cfg: dict, nproc: int, env: dict | None = None):
    events = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0", "--ft-event-log",
                           str(events), *NULL_HEARTBEATS, WORKER, json.dumps(cfg)], timeout=150, env=env)
    return result, read_events(events) if events.exists() else []


def test_a_rank_with_a_slower_forward_and_one_with_a_slower_backward_are_flagged_and_no_other(tmp_path: Path) -> None:
    # One run for both (ranks start in ~10-30 s on 2 shared cores; training takes ~6 s).
    cfg = {"max_steps": 80, "fwd_ms": 20, "bwd_ms": 20, "slow": {"1": "forward", "2": "backward"}, "slow_factor": 1.3,
           "cb": {"report_time_interval": 1.5, "calc_individual_gpu_perf": False,
                  "gpu_relative_perf_threshold": 0.85, "num_gpu_perf_scores_to_print": 4}}
    result, events = _launch(tmp_path, cfg, 4)
    assert result.returncode == 0, result.stderr[-4000:]
    flagged = _flags(result.stderr)
    assert len(flagged) >= 2, f"fewer than 2 reports:\n{result.stderr[-4000:]}"
    first_two = set().union(*(flagged[i] for i in sorted(flagged)[:2]))
    assert {1, 2} <= first_two, f"the slowed ranks were not flagged within 2 reports: {flagged}"
    others = {rank for ranks in flagged.values() for rank in ranks} - {1, 2}
    assert not others, f"healthy ranks flagged: {flagged}"
    stragglers = events_of(events, "straggler")
    assert {e["rank"] for e in stragglers} == {1, 2}, stragglers
    assert all(e["action"] == "report" and e["relative"] < 0.85 for e in stragglers), stragglers


def test_without_any_logging_set_up_the_reports_appear_as_the_references_then_ours(tmp_path: Path) -> None:
    # A user's script with no logging.basicConfig: the callback's lines reach the console as the
    # fault tolerance callbacks' do. With num_gpu_perf_scores_to_print the reference's headed
    # listings come first (scores to 2 decimals), then our one line; the launcher's straggler line
    # rounds the scores too.
    cfg = {"max_steps": 60, "fwd_ms": 20, "bwd_ms": 20, "slow": {"1": "forward"}, "slow_factor": 2.0,
           "no_logging_setup": True,
           "cb": {"report_time_interval": 1.5, "calc_individual_gpu_perf": True, "gpu_individual_perf_threshold": 0.0,
                  "gpu_relative_perf_threshold": 0.85, "num_gpu_perf_scores_to_print": 1}}
    result, events = _launch(tmp_path, cfg, 2)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stderr.splitlines()
    assert any(line.startswith("straggler report ") for line in lines), \
        f"no report line without a logging set-up:\n{result.stderr[-4000:]}"
    row = re.compile(r"  Rank=(\d) Node=\S+ Score=(\d+\.\d\d)")
    # the first report with scores (the first one may have none yet): the reference's two listings,
    # then our line; 2 ranks <= 2 * 1, so every rank is listed, worst first
    relative = next(i for i, line in enumerate(lines)
                    if line == "GPU relative performance:" and row.fullmatch(lines[i + 1]))
    individual = lines.index("GPU individual performance:", relative)
    first = next(i for i in range(individual, len(lines)) if lines[i].startswith("straggler report "))
    listed = [row.fullmatch(line) for line in lines[relative + 1:individual]]
    assert all(listed) and sorted(int(m.group(1)) for m in listed) == [0, 1], lines[relative:individual]
    assert float(listed[0].group(2)) <= float(listed[1].group(2))  # worst first
    assert all(row.fullmatch(line) for line in lines[individual + 1:first]), lines[individual:first + 1]
    # rank 1 (twice as slow) is flagged; the launcher's line and the events carry its scores
    assert any("Affected ranks" in line and "rank=1" in line for line in lines), result.stderr[-4000:]
    launcher_line = next(line for line in lines if "straggler: rank 1 on node" in line)
    assert re.search(r"\(relative score \d+\.\d\d, individual score \d+\.\d\d;", launcher_line), launcher_line
    assert any(e["rank"] == 1 for e in events_of(events, "straggler"))


def test_stop_if_detected_saves_and_stops_without_marking_the_run_finished(tmp_path: Path) -> None:
    flag = tmp_path / "finished.flag"
    ckpt = tmp_path / "ckpt"
    cfg = {"max_steps": 400, "fwd_ms": 20, "bwd_ms": 20, "slow": {"1": "forward"}, "slow_factor": 2.0,
           "ckpt_dir": str(ckpt), "ckpt_every": 1000, "ft": True,
           "cb": {"report_time_interval": 1.0, "calc_individual_gpu_perf": False, "stop_if_detected": True}}
    env = {"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}
    events_path = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--ft-event-log",
                           str(events_path), "--ft-param-initial_rank_heartbeat_timeout", "120",
                           "--ft-param-rank_heartbeat_timeout", "60", WORKER, json.dumps(cfg)], timeout=150, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Detected stragglers. Terminating training..." in result.stderr
    assert (ckpt / "last.ckpt").exists(), "no checkpoint saved at the stop"
    assert not flag.exists(), "a run stopped for a straggler was marked finished"
    assert "fit done" not in result.stderr  # left fit early (graceful stop), not at max_steps
    stragglers = events_of(read_events(events_path), "straggler")
    assert stragglers and {e["action"] for e in stragglers} == {"stop"}, stragglers


def _two_nodes_with_b_slow(tmp_path: Path, nnodes: str, spare: bool = False) -> tuple[dict, dict[str, str]]:
    """Nodes a and b (two ft_launchers on this machine, one rank each, c10d) under ``--nnodes
    nnodes``; b's rank is 2x slower, the callback's action "replace" with replace_after=2 and a
    checkpoint every 40 of 150 steps. Returns the launchers (ended) and their stderr by name.

    ``spare``: a third launcher, c, joins once a and b's round has formed and waits as a spare;
    the ranks hold before step 20 (before any report) until c has waited 10 s in the rendezvous
    (its warm template's start says so), so that b's request meets a spare waiting.

    a hosts the rendezvous store (the first launcher to bind the endpoint does): the node that
    leaves must not be the one holding it, as on a cluster (the endpoint is node 1).
    last_call_timeout=10: the launchers start seconds apart on a loaded machine, and the first must
    wait for the second to form one job. join_timeout=60 (not the default 600 s) bounds a wait for
    a node that never comes.
    """
    from tests.integration.test_launcher_multinode import free_port

    port = free_port()
    cfg = {"max_steps": 150, "fwd_ms": 20, "bwd_ms": 20, "slow_node": "b", "slow_where": "forward",
           "slow_factor": 2.0, "ckpt_dir": str(tmp_path / "ckpt"), "ckpt_every": 40,
           "cb": {"report_time_interval": 0.8, "calc_individual_gpu_perf": False, "action": "replace",
                  "replace_after": 2}}
    go = tmp_path / "go"
    # c10d drops a node whose keep-alive is late by keep_alive_interval x max_attempt: 2 s finds b gone
    # soon, but on a loaded machine a late keep-alive of a or b frees a slot, and a spare that
    # arrives then takes it (it goes on the wait list instead of the redundancy list)
    keep = 2
    if spare:
        cfg["hold_file"] = str(go)
        keep = 6
    procs = {}
    for name in ("a", "b", "c") if spare else ("a", "b"):
        if name == "b":
            wait_for(lambda: _listening(port), 60, "node a's rendezvous store")
        if name == "c":
            wait_for(lambda: _has_event(tmp_path / "a" / "events.jsonl", "cycle_start"), 120, "a and b's round")
        (tmp_path / name).mkdir()
        procs[name] = start_launcher(
            ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}", "--max-restarts", "2", "--monitor-interval", "0.1",
             "--rdzv-conf", f"join_timeout=60,last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt={keep}",
             "--ft-event-log", str(tmp_path / name / "events.jsonl"), *NULL_HEARTBEATS, WORKER, json.dumps(cfg)],
            env={"STRAGGLER_NODE": name})
    out = {}
    try:
        if spare:
            wait_for(lambda: _has_event(tmp_path / "c" / "events.jsonl", "warm_template_started"), 90,
                     "node c waiting as a spare")
            go.touch()
        for name, proc in procs.items():
            out[name] = proc.communicate(timeout=200)[1]
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                out[name] = proc.communicate()[1]
        for name, text in out.items():
            (tmp_path / name / "stderr.txt").write_text(text)
    return procs, out


def _has_event(path: Path, kind: str) -> bool:
    return path.exists() and bool(events_of(read_events(path), kind))


@pytest.mark.timeout(300)
def test_replace_a_node_flagged_k_times_leaves_after_the_next_checkpoint_and_training_resumes(tmp_path: Path) -> None:
    # --nnodes 1:2: the job can go on without b. With replace_after=2, b asks for ExcludeThisNode
    # right after the first checkpoint saved once it was flagged in 2 reports in a row. b's
    # launcher leaves (exit 65); a restarts alone and resumes from that checkpoint.
    procs, out = _two_nodes_with_b_slow(tmp_path, "1:2")
    assert procs["b"].returncode == 65, out["b"][-4000:]
    assert procs["a"].returncode == 0, out["a"][-4000:]
    b_events = read_events(tmp_path / "b" / "events.jsonl")
    replace = [e for e in events_of(b_events, "straggler") if e["action"] == "replace"]
    # the launcher's "node" is its host name; the detector's node name (STRAGGLER_NODE) is reported_node
    assert replace and all(e.get("reported_node") == "b" for e in replace), events_of(b_events, "straggler")
    assert any(e["consecutive"] >= 2 for e in replace), replace
    requests = events_of(b_events, "control_request")
    assert requests and requests[0]["action"] == "ExcludeThisNode", requests
    assert not events_of(b_events, "replace_refused")
    assert "allows one node fewer than this round's 2" in out["b"], out["b"][-4000:]
    # b's launcher SIGKILLs its workers and leaves at once: a SIGTERM gave Lightning's SIGTERM
    # handling (or a graceful stop) the --term-timeout (30 s) first, and a waited that long
    left = events_of(b_events, "result")[-1]["ts"] - requests[0]["ts"]
    assert left < 10, f"b's launcher left {left:.1f} s after the ExcludeThisNode request"
    # b published its ranks as "left" before killing them: a names b's leaving as the root, not its
    # own rank whose collective failed, and does not wait VIEW_WAIT (2 s) for a view from b
    (failure,) = events_of(read_events(tmp_path / "a" / "events.jsonl"), "failure")
    assert (failure["role"], failure["root_outcome"], failure["root_rank"]) == ("collateral", "left", 1), failure
    assert "requested ExcludeThisNode" in failure["root_cause"], failure
    assert failure["ts"] - failure["detected_at"] < 1.0, failure
    resumed = re.findall(r"fit starts from (\S+)", out["a"])
    assert resumed[-1].endswith("last.ckpt"), resumed
    assert "fit done: 150 steps" in out["a"]


@pytest.mark.timeout(300)
def test_replace_with_no_spare_and_no_node_to_spare_keeps_the_node_says_why_once_and_training_ends(
        tmp_path: Path) -> None:
    # --nnodes 2 and no spare: the job cannot go on without b. Before, b left anyway (exit 65) and a
    # waited for a second node until join_timeout, then failed. Now b's launcher refuses the
    # replace request of its rank: one line and one replace_refused record say why, and both nodes
    # train to the end (exit 0), no restart.
    procs, out = _two_nodes_with_b_slow(tmp_path, "2")
    assert procs["b"].returncode == 0, out["b"][-4000:]
    assert procs["a"].returncode == 0, out["a"][-4000:]
    b_events = read_events(tmp_path / "b" / "events.jsonl")
    requests = events_of(b_events, "control_request")
    assert requests and {r["action"] for r in requests} == {"ExcludeThisNode"}, requests
    (refused,) = events_of(b_events, "replace_refused")
    assert (refused["nodes"], refused["min_nodes"], refused["spares_waiting"]) == (2, 2, 0), refused
    lines = [line for line in out["b"].splitlines() if "not replaced:" in line]
    assert len(lines) == 1, lines
    assert ("requested ExcludeThisNode: straggler: node b flagged in 2 straggler reports in a row: not replaced: "
            "no spare node waits and --nnodes allows no fewer than this job's 2 node(s) (MIN 2); training goes on"
            ) in lines[0], lines
    for name in ("a", "b"):
        events = read_events(tmp_path / name / "events.jsonl")
        assert not events_of(events, "failure"), (name, events_of(events, "failure"))
        assert len(events_of(events, "cycle_start")) == 1, name  # no restart
        assert "fit done: 150 steps" in out[name], out[name][-4000:]
    # the job trained on after the refusal: it ended soon after, not after a rendezvous timeout
    ended = events_of(b_events, "result")[-1]["ts"]
    assert ended - refused["ts"] < 60, f"b ended {ended - refused['ts']:.1f} s after the refusal"


def test_a_hand_written_loop_finds_the_slow_rank_through_ft_integration(tmp_path: Path) -> None:
    # ft_core.integration.straggler_detection() in a plain DDP loop (no Lightning): 3 ranks, rank 1's
    # forward 1.5x slower; it alone is flagged, from the second report on (the first, at step 10, has
    # too few samples to score: one step in three is sampled).
    worker = str(Path(__file__).resolve().parents[1] / "workers" / "straggler_loop.py")
    result = run_launcher(["--standalone", "--nproc-per-node", "3", "--max-restarts", "0", *NULL_HEARTBEATS,
                           worker, "60", "1"], timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(reports) >= 2, result.stdout + result.stderr[-3000:]
    assert reports[0]["relative"] in ([], [1]), reports
    assert all(r["relative"] == [1] for r in reports[1:]), reports


@pytest.mark.timeout(300)
def test_replace_at_nnodes_min_with_a_spare_waiting_replaces_the_node_with_the_spare(tmp_path: Path) -> None:
    # --nnodes 2 and node c waiting as a spare (c10d's redundancy list: it came while the round was
    # full): the job can go on without b, so b leaves (exit 65) and a restarts with c.
    procs, out = _two_nodes_with_b_slow(tmp_path, "2", spare=True)
    assert procs["b"].returncode == 65, out["b"][-4000:]
    assert procs["a"].returncode == 0, out["a"][-4000:]
    assert procs["c"].returncode == 0, out["c"][-4000:]
    b_events = read_events(tmp_path / "b" / "events.jsonl")
    assert not events_of(b_events, "replace_refused")
    assert "(1 spare node(s) wait to take its place)" in out["b"], out["b"][-4000:]
    assert len(events_of(read_events(tmp_path / "c" / "events.jsonl"), "cycle_start")) == 1
    for name in ("a", "c"):
        assert "fit done: 150 steps" in out[name], out[name][-4000:]
