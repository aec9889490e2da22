"""Local checkpoints with real processes: two ft_launchers on one machine, each with its own
node-local directory, act as two nodes of a Lightning DDP job (CPU, gloo).

A node lost right after a local save (its ranks SIGKILLed, its directory wiped) restores from its
peer's replicas; a corrupt replica is skipped with a warning; a job-wide SIGTERM during a save
leaves the previous one usable; the callback and checkpoint IO take the reference's arguments
(tests/workers/local_ckpt_train.py builds them so).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
from pathlib import Path

import pytest

from tests.launcher_util import start_launcher, wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "local_ckpt_train.py")
pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Job:
    """One run of the job: a launcher per node, each node with its own local checkpoint root."""

    def __init__(self, tmp_path: Path, cfg: dict, nproc: int = 1, nodes: tuple[str, ...] = ("a", "b"),
                 worker: str = WORKER):
        port = free_port()
        self.root = tmp_path / "shared"
        self.root.mkdir(exist_ok=True)
        cfg = {"root": str(self.root), **cfg}
        self.procs = {}
        for name in nodes:
            local = tmp_path / f"local_{name}"
            local.mkdir(exist_ok=True)
            self.procs[name] = start_launcher(
                ["--nnodes", str(len(nodes)), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}", "--monitor-interval", "0.05",
                 "--max-restarts", "0", "--no-warm-restarts",
                 "--ft-event-log", str(tmp_path / f"events_{name}.jsonl"), worker, json.dumps(cfg)],
                env={"LOCAL_CKPT_ROOT": str(local), "TEST_NODE": name, "PYTHONPATH": str(Path(__file__).parents[2])})

    def finish(self, timeout: float = 240) -> dict[str, tuple[int, str]]:
        results = {}
        for name, proc in self.procs.items():
            out, err = proc.communicate(timeout=timeout)
            results[name] = (proc.returncode, out + err)
        return results

    def reports(self) -> list[dict]:
        found = []
        for path in sorted(self.root.glob("report_*.jsonl")):
            found += [json.loads(line) for line in path.read_text().splitlines()]
        return found


def clear_reports(root: Path) -> None:
    for path in root.glob("report_*.jsonl"):
        path.unlink()


def saved_weights(reports: list[dict]) -> dict[int, float]:
    return {r["iteration"]: r["weights"] for r in reports if r["kind"] == "saved"}


def lose_node_b_after_step_5(tmp_path: Path, nproc: int = 1, **cfg) -> dict[int, float]:
    """Run 1: local saves at steps 2 and 4, then node b's ranks die after step 5; node b's disk is lost."""
    job = Job(tmp_path, {"every": 2, "max_steps": 50, "die": {"node": "b", "after": 5}, **cfg}, nproc=nproc)
    results = job.finish()
    assert results["b"][0] != 0 and results["a"][0] != 0, results
    weights = saved_weights(job.reports())
    assert {2, 4} <= set(weights), job.reports()
    shutil.rmtree(tmp_path / "local_b")
    clear_reports(job.root)
    return weights


def resumed(tmp_path: Path, nproc: int = 1, resume: str = "none.ckpt", **cfg) -> tuple[list[dict], dict]:
    job = Job(tmp_path, {"every": 2, "max_steps": 8, "resume": str(tmp_path / "shared" / "global" / resume),
                         **cfg}, nproc=nproc)
    results = job.finish()
    assert all(code == 0 for code, _ in results.values()), results
    return [r for r in job.reports() if r["kind"] == "start"], results


def test_a_lost_node_restores_from_its_peers_replica(tmp_path):
    weights = lose_node_b_after_step_5(tmp_path)
    starts, results = resumed(tmp_path)
    assert len(starts) == 2
    assert {(s["step"], s["weights"]) for s in starts} == {(4, weights[4])}
    by_node = {s["node"]: s["load"] for s in starts}
    assert by_node["b"]["received"] and not by_node["a"]["received"], starts


def test_a_corrupt_replica_is_skipped_with_a_warning(tmp_path):
    weights = lose_node_b_after_step_5(tmp_path)
    replicas = [p for p in (tmp_path / "local_a" / "job").glob("*/iter_0000004_*_local.pt")
                if p.parent.name != p.name.split("_")[2]]
    assert len(replicas) == 1
    data = bytearray(replicas[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    replicas[0].write_bytes(bytes(data))
    starts, results = resumed(tmp_path)
    assert {(s["step"], s["weights"]) for s in starts} == {(2, weights[2])}
    assert "corrupt or unreadable: skipped" in results["a"][1], results["a"][1][-3000:]


def test_a_job_wide_sigterm_during_a_save_leaves_the_previous_one(tmp_path):
    from tests.launcher_util import signal_whole_job

    job = Job(tmp_path, {"every": 2, "max_steps": 50, "slow_manifest": {"iteration": 6, "seconds": 120}})
    wait_for(lambda: len(list(job.root.glob("slow_*"))) == 2, 180, "both ranks inside the save of step 6")
    for proc in job.procs.values():
        signal_whole_job(proc.pid, signal.SIGTERM)
    results = job.finish()
    assert all(code != 0 for code, _ in results.values()), results
    weights = saved_weights(job.reports())
    assert list((tmp_path / "local_a" / "job").glob("*/iter_0000006_*_local.pt")), "the payload of step 6 was written"
    clear_reports(job.root)
    starts, _ = resumed(tmp_path)
    assert {(s["step"], s["weights"]) for s in starts} == {(4, weights[4])}


def test_two_by_two_with_global_checkpoints_resumes_from_the_peers_replicas(tmp_path):
    """2 nodes x 2 ranks (ranks n and n + 2 replicate each other), a global checkpoint every 4 steps:
    node b lost after step 5 resumes at step 4 from the local copies and the replicas (a tie with
    the global checkpoint of step 4 loads the local one); both of node b's ranks received theirs."""
    weights = lose_node_b_after_step_5(tmp_path, nproc=2, global_every=4)
    assert (tmp_path / "shared" / "global" / "step=4.ckpt").exists()
    starts, _ = resumed(tmp_path, nproc=2, resume="step=4.ckpt")
    assert len(starts) == 4 and {(s["step"], s["weights"]) for s in starts} == {(4, weights[4])}
    assert sorted((s["node"], s["load"]["received"]) for s in starts) == [
        ("a", False), ("a", False), ("b", True), ("b", True)]
