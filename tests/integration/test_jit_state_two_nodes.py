"""Just-in-time state across two ft_launchers on 127.0.0.1 acting as two nodes (one rank each):
global rank 1 crashes at step 137; the other node's rank saves, its own node has no survivor.
Every node must resume from the same step: 137 when the crashed rank's node can read the
survivor's state (its copy in the shared checkpoint directory, or the copy it received from the
other node: healing), else the periodic checkpoint of step 100 on both (healing off), with one
line on each node saying why."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_launcher_multinode import free_port
from tests.launcher_util import read_events, start_launcher

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "jit_plain_train.py")

pytestmark = pytest.mark.slow


def start_node(name: str, tmp_path: Path, port: int, cfg: dict, short_tmp: str, extra: tuple[str, ...] = ()):
    node_dir = tmp_path / name
    node_dir.mkdir()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}", "--monitor-interval", "0.05", "--max-restarts", "1",
            "--rdzv-conf", "join_timeout=30,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2",
            "--ft-event-log", str(node_dir / "events.jsonl"),
            "--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null",
            "--ft-param-rank_section_timeouts", "setup:60,step:60,checkpointing:60",
            "--ft-param-rank_out_of_section_timeout", "60", *extra, WORKER, json.dumps(cfg)]
    return start_launcher(args, env={"TMPDIR": short_tmp}), node_dir


def started(tmp_path: Path, rank: int) -> dict:
    path = tmp_path / f"report_rank{rank}_cycle1.jsonl"
    return next(r for r in map(json.loads, path.read_text().splitlines()) if r["op"] == "started")


def survivor_hash(tmp_path: Path, rank: int, step: int) -> str:
    path = tmp_path / f"report_rank{rank}_cycle0.jsonl"
    return next(r["hash"] for r in map(json.loads, path.read_text().splitlines())
                if r["op"] == "step" and r["step"] == step)


@pytest.mark.parametrize("shared_copy, heal", [(False, True), (False, False), (True, True)],
                         ids=["node-local-only-healed", "node-local-only-healing-off", "shared-copy"])
def test_both_nodes_resume_from_the_same_step(tmp_path, shared_copy, heal):
    short_tmp = tempfile.mkdtemp(prefix="jit2")
    (tmp_path / "ckpt").mkdir()
    port = free_port()
    try:
        procs = {}
        for name in ("a", "b"):
            cfg = {"ckpt_dir": str(tmp_path / "ckpt"), "report_dir": str(tmp_path), "shared_copy": shared_copy,
                   "fault": {"rank": 1, "cycle": 0, "step": 137, "kind": "crash"}}
            extra = () if heal else ("--ft-param-jit-heal-timeout", "0")
            procs[name] = start_node(name, tmp_path, port, cfg, short_tmp, extra)
        outputs = {}
        for name, (proc, _node_dir) in procs.items():
            out, err = proc.communicate(timeout=240)
            outputs[name] = err
            assert proc.returncode == 0, err[-6000:]
        expected = 137 if shared_copy or heal else 100
        starts = [started(tmp_path, rank) for rank in (0, 1)]
        assert {s["step"] for s in starts} == {expected}, starts
        healed = [e for name in procs for e in read_events(tmp_path / name / "events.jsonl")
                  if e["event"] == "state_healed"]
        # healing only where a node cannot read the newest state: not with the shared copy
        assert sorted(e["role"] for e in healed) == (["received", "sent"] if heal and not shared_copy else [])
        if shared_copy or heal:
            assert {s["hash"] for s in starts} == {survivor_hash(tmp_path, 0, 137)}
        else:
            assert {s["source"] for s in starts} == {"ckpt"}
            lines = [line for err in outputs.values() for line in err.splitlines()
                     if "the newest just-in-time state (step 137) cannot be read on node 1" in line]
            assert len(lines) == 2, "one line on each node"
        records = [e for name in procs for e in read_events(tmp_path / name / "events.jsonl")
                   if e["event"] in ("state_saved", "state_not_saved")]
        # The survivor saved in its exception path. Its launcher records it only when it handled the
        # failure itself: when the other node's restart reached the rendezvous first, torch restarted
        # this node's workers without asking (docs/jit-state.md, "When it does not apply").
        assert all(e["step"] == 137 for e in records if e["event"] == "state_saved"), records
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
