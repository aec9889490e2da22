"""Failures that repeat on one node, on a real 4-node SLURM cluster (issue 23; ``make test-cluster``).

- A node whose ranks crash in every attempt (``train.py --crash-marker``: a marker file only that
  node's path names) is excluded by ``autoresume.sh`` (root of failures in
  ``--node-failures-to-exclude`` attempts, its fingerprint on it only), and the requeued job finishes
  on the other two nodes and the cluster's fourth. With in-job restarts the launchers' crash-loop
  guard stops first (exit 66, no requeue: inside one job a bad node and a bug look the same), and
  the node history names node2 as the root of that failed attempt.
- A node whose node check fails (its temp dir full, or read-only: the temp dir is node-local here,
  ``RUN_DIR/tmp/<node>``, the only path of a node's own view on this shared file system) never
  joins: its launcher exits 65 before the rendezvous and the job runs on the others and the spare.

docs/multinode.md has the measured times.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest

from launcher.exit_codes import EXIT_NODE_EXCLUDED
from launcher.resume.history import TIME_FORMAT, read_node_history
from tests.cluster.conftest import ClusterRun, cycle_starts, failures, wait_for

# 3 attempts (2 failed at step 15, ~25 s each with the requeue) and 45 more steps: ~100 s measured.
REPEATING_NODE_BOUND_S = 300.0
# node2's launcher starts, checks its node and leaves: ~5 s (import torch) measured.
NODE_CHECK_LEAVE_BOUND_S = 60.0


def _epoch(history_time: str) -> float:
    return datetime.strptime(history_time, TIME_FORMAT).timestamp()


@pytest.mark.timeout(480)
def test_repeating_crash_on_node2_excludes_it_and_the_job_finishes_on_the_others_and_the_spare(
        cluster: ClusterRun):
    """--max-restarts 0: node2's rank raises at step 15 in attempt 1 (the job requeued as is: a
    first failure of a node is no reason to exclude it) and again in attempt 2: node2 was then the
    root of failures in 2 attempts, with one fingerprint, on it alone: excluded; not a bug (it never
    repeated on another node), so not a stop. Attempt 3 runs on node1, node3 and node4 from the
    step-10 checkpoint and finishes."""
    markers = cluster.run_dir / "markers"
    markers.mkdir(parents=True)
    (markers / "node2").write_text("this node is bad\n")
    submitted = time.time()
    job = cluster.submit_autoresume(nodes=3, launcher_args="--max-restarts 0",
                                    train_args=f"--steps 60 --save-every 10 --crash-step 15 "
                                               f"--crash-marker {markers}/{{node}}")
    state = wait_for(lambda: (s := cluster.job_state(job)).get("JobState") == "COMPLETED"
                     and cluster.history() and cluster.history()[-1]["decision"].startswith("finished") and s,
                     REPEATING_NODE_BOUND_S + 60, "the job to finish without node2")
    history = cluster.history()
    assert [h["decision"].split(":")[0] for h in history] == ["continue", "continue", "finished"], history
    assert history[0]["decision"].endswith("requeued"), history  # once is no pattern: not excluded
    assert history[1]["decision"].endswith("requeued excluding node2"), history
    assert state["ExcNodeList"] == "node2" and state["NodeList"] == "node[1,3-4]", state
    timeline = cluster.timeline()
    crashes = [e for e in timeline if e["event"] == "crash"]
    assert [(e["node"], e["attempt"], e["step"]) for e in crashes] == [("node2", "1", 15), ("node2", "2", 15)], crashes
    third = {e["node"]: e["step"] for e in timeline if e["event"] == "pg_ready" and e["attempt"] == "3"}
    assert third == {"node1": 10, "node3": 10, "node4": 10}, third
    assert {e["node"] for e in timeline if e["event"] == "done"} == {"node1", "node3", "node4"}
    # Every node's record of both failures names node2's rank as the root, with one fingerprint.
    prints = set()
    for node in ("node1", "node2", "node3"):
        failed = failures(cluster.events(node))
        assert len(failed) >= 2, (node, failed)  # one per attempt at least
        for failure in failed:
            assert failure["role"] == ("root" if node == "node2" else "collateral"), (node, failure)
            if node != "node2":
                assert failure["root_node"] == "node2", (node, failure)
            prints.add(failure["fingerprint"])
    assert len(prints) == 1, prints
    text = failures(cluster.events("node2"))[0]["fingerprint_text"]
    assert "RuntimeError: checksum mismatch in step N" in text and "train.py main" in text, text
    rows = read_node_history(str(cluster.run_dir / "autoresume"))
    assert [(r.attempt, r.node, r.kind) for r in rows if r.node != "-"] == [
        (1, "node2", "root"), (2, "node2", "root"), (2, "node2", "excluded")], rows
    assert {r.fingerprint for r in rows if r.kind == "failed"} == prints, rows
    # Timings: the first crash, the decision to exclude node2 (end of attempt 2), training on the
    # spare, the end.
    first_crash = crashes[0]["t"]
    excluded = _epoch(history[1]["end"])
    back = min(e["t"] for e in timeline if e["event"] == "pg_ready" and e["attempt"] == "3")
    done = max(e["t"] for e in timeline if e["event"] == "done")
    print(f"repeating crash on node2: first crash {first_crash - submitted:.1f} s after the submission; "
          f"node2 excluded {excluded - first_crash:.0f} s after it (end of attempt 2, 1 s resolution); "
          f"training on node1, node3, node4 {back - first_crash:.1f} s after it; "
          f"job finished {done - submitted:.1f} s after the submission")
    assert done - submitted < REPEATING_NODE_BOUND_S
    cluster.assert_no_leftovers()


@pytest.mark.timeout(420)
def test_crash_loop_on_node2_inside_the_job_stops_with_66_and_records_node2_as_its_root(cluster: ClusterRun):
    """The same bad node with in-job restarts (--max-restarts 2): node2's rank raises at step 15 in
    cycles 0 and 1 (both resumed from the step-10 checkpoint), the crash-loop guard stops every
    launcher with 66 (the launchers cannot tell a bad node from a bug: the cycles ran on the same
    nodes) and autoresume.sh stops without a requeue. node2 is not excluded, but the node history
    records the failed attempt with node2 as its root (before: a ``clean`` attempt, no root), so
    that a resubmission with the same run dir excludes node2 at its next failure there."""
    markers = cluster.run_dir / "markers"
    markers.mkdir(parents=True)
    (markers / "node2").write_text("this node is bad\n")
    job = cluster.submit_autoresume(nodes=3, launcher_args="--max-restarts 2",
                                    train_args=f"--steps 60 --save-every 10 --crash-step 15 "
                                               f"--crash-marker {markers}/{{node}}")
    cluster.wait_job(job, 240)
    history = cluster.history()
    assert [(h["exit_code"], h["decision"].split(":")[0]) for h in history] == [("66", "stop")], history
    assert "ft_launcher stopped a repeating failure (exit 66)" in history[0]["decision"], history
    crashes = [e for e in cluster.timeline() if e["event"] == "crash"]
    assert [(e["node"], e["cycle"], e["step"]) for e in crashes] == [("node2", 0, 15), ("node2", 1, 15)], crashes
    prints = set()
    for node in ("node1", "node2", "node3"):
        events = cluster.events(node)
        assert [e["exit_code"] for e in events if e["event"] == "result"] == [66], node
        roots = {(f["cycle"], f["root_node"] if f["role"] == "collateral" else node) for f in failures(events)}
        assert roots == {(0, "node2"), (1, "node2")}, (node, roots)
        prints |= {f["fingerprint"] for f in failures(events)}
    assert len(prints) == 1, prints
    rows = read_node_history(str(cluster.run_dir / "autoresume"))
    assert [(r.attempt, r.node, r.kind, r.fingerprint) for r in rows] == [
        (1, "-", "failed", *prints), (1, "node2", "root", *prints), (1, "-", "stop", "-")], rows
    assert not (cluster.run_dir / "autoresume" / "excluded_nodes").exists()
    stopped = _epoch(history[0]["end"])
    print(f"crash loop on node2 inside the job: second crash {crashes[1]['t'] - crashes[0]['t']:.1f} s after the "
          f"first; autoresume.sh stopped (66) {stopped - crashes[0]['t']:.0f} s after the first crash")
    cluster.assert_no_leftovers()


@contextmanager
def _bad_temp_dir(path: Path, how: str) -> Iterator[None]:
    """``path`` as a full file system (a 4 MiB tmpfs: below the check's 50 MiB) or a read-only one
    (a read-only bind mount of itself), until the end of the block. Needs root, as the cluster does."""
    path.mkdir(parents=True, exist_ok=True)
    if how == "full":
        commands = [["mount", "-t", "tmpfs", "-o", "size=4m,mode=1777", "tmpfs", str(path)]]
    else:
        commands = [["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,bind,ro", str(path)]]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=30)
        yield
    finally:
        # lazy: a launcher that (wrongly) joined may still hold it until the job is cancelled
        while subprocess.run(["mountpoint", "-q", str(path)], timeout=30).returncode == 0:
            subprocess.run(["umount", "--lazy", str(path)], check=True, timeout=30)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("how", ["full", "read-only"])
def test_node2_failing_its_node_check_never_joins_the_job_runs_on_the_others_and_the_spare(
        cluster: ClusterRun, how: str):
    """4 nodes for a 3-node job (``--nnodes 3``): node2's temp dir is full or read-only, its
    launcher's node check fails before the first rendezvous (exit 65, a ``node_check`` record), and
    node1, node3 and node4 train to the end. (Before the node check read $TMPDIR itself, Python's
    ``tempfile`` quietly replaced a read-only $TMPDIR by /tmp: node2 passed and joined.)"""
    with _bad_temp_dir(cluster.run_dir / "tmp" / "node2", how):
        job = cluster.submit(nodes=4, nnodes="3", launcher_args="--max-restarts 1",
                             train_args="--steps 60 --step-time 0.05")
        cluster.wait_job(job, 240)  # FAILED: srun reports node2's exit 65
        node2 = cluster.events("node2")
        [check] = [e for e in node2 if e["event"] == "node_check"]
        [disk] = [c for c in check["checks"] if not c["ok"]]
        assert disk["name"] == f"disk {cluster.run_dir}/tmp/node2", check
        assert ("MiB free < 50 MiB" if how == "full" else "Read-only file system") in disk["detail"], check
        result = [e for e in node2 if e["event"] == "result"]
        assert [(r["exit_code"], r["outcome"]) for r in result] == [(EXIT_NODE_EXCLUDED, "node check failed")], node2
        assert not cycle_starts(node2), node2
        assert "the node check failed, so this node does not join the job" in cluster.log("node2")
        timeline = cluster.timeline()
        assert {(e["node"], e["world_size"]) for e in timeline if e["event"] == "pg_ready"} == {
            ("node1", 3), ("node3", 3), ("node4", 3)}, timeline
        assert {e["node"] for e in timeline if e["event"] == "done"} == {"node1", "node3", "node4"}
        for node in ("node1", "node3", "node4"):
            events = cluster.events(node)
            assert [e["exit_code"] for e in events if e["event"] == "result"] == [0], node
            assert not failures(events) and len(cycle_starts(events)) == 1, node
        started = min(e["ts"] for node in ("node1", "node2", "node3", "node4") for e in cluster.events(node)
                      if e["event"] == "launcher_start")
        node2_start = next(e["ts"] for e in node2 if e["event"] == "launcher_start")
        training = max(e["t"] for e in timeline if e["event"] == "pg_ready")
        done = max(e["t"] for e in timeline if e["event"] == "done")
        print(f"node2's temp dir {how}: node2 left {check['ts'] - node2_start:.2f} s after its launcher "
              f"started ({result[0]['ts'] - started:.1f} s after the first launcher); node1, node3, node4 "
              f"training {training - started:.1f} s and done {done - started:.1f} s after the first launcher")
        assert check["ts"] - node2_start < NODE_CHECK_LEAVE_BOUND_S
        cluster.assert_no_leftovers()
