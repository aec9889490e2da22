"""Healing a node from a peer with real launchers: two ft_launchers on 127.0.0.1 acting as two
nodes (c10d rendezvous, one rank each, each with its own run directory, so its own node-local
state directory). Rank 1 crashes at step 137: its node keeps no survivor and saves nothing, the
other node's survivor saves; after the rendezvous the crashed node receives that state through
the store and both resume at the saved step. A corrupted transfer is refused by the receiver's
checksum and both nodes fall back to the periodic checkpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_launcher_multinode import free_port
from tests.launcher_util import FT_LAUNCHER, events_of, launcher_env, read_events

TRAIN = str(Path(__file__).resolve().parents[1] / "workers" / "jit_plain_train.py")
CORRUPTING = str(Path(__file__).resolve().parents[1] / "workers" / "heal_corrupting_launcher.py")
CRASH = {"rank": 1, "cycle": 0, "step": 137, "kind": "crash"}


class HealNode:
    """One ft_launcher of a two-node job running jit_plain_train.py with its own directories."""

    def __init__(self, name: str, tmp_path: Path, port: int, ckpt_dir: Path | None = None,
                 launcher: list[str] = FT_LAUNCHER, extra: tuple[str, ...] = ()):
        self.dir = tmp_path / name
        self.reports = self.dir / "reports"
        self.reports.mkdir(parents=True)
        ckpt = ckpt_dir or self.dir / "ckpt"
        ckpt.mkdir(exist_ok=True)
        self.events_path = self.dir / "events.jsonl"
        cfg = {"ckpt_dir": str(ckpt), "report_dir": str(self.reports), "steps": 150, "ckpt_every": 100,
               "fault": CRASH}
        self.proc = subprocess.Popen(
            [*launcher, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"heal-{port}", "--monitor-interval", "0.05",
             "--rdzv-conf", "join_timeout=30,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5",
             "--max-restarts", "2", "--ft-param-initial_rank_heartbeat_timeout=null",
             "--ft-param-rank_heartbeat_timeout=null", "--ft-param-rank_section_timeouts=setup:600,step:180,"
             "checkpointing:420", "--ft-param-rank_out_of_section_timeout=300",
             "--ft-event-log", str(self.events_path), *extra, TRAIN, json.dumps(cfg)],
            env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def finish(self, timeout: float = 150) -> int:
        try:
            self.out, self.err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.out, self.err = self.proc.communicate()
            raise AssertionError(f"{self.dir.name} did not finish in {timeout} s:\n{self.err[-4000:]}") from None
        return self.proc.returncode

    def events(self, kind: str) -> list[dict]:
        return events_of(read_events(self.events_path), kind)

    def report(self, cycle: int) -> tuple[int, list[dict]]:
        """(rank, lines) of this node's one rank in ``cycle``."""
        (path,) = self.reports.glob(f"report_rank*_cycle{cycle}.jsonl")
        rank = int(re.search(r"rank(\d+)", path.name).group(1))
        return rank, [json.loads(line) for line in path.read_text().splitlines()]


def _run_pair(tmp_path: Path, shared_ckpt: bool = False, corrupt: bool = False) -> tuple[HealNode, HealNode]:
    port = free_port()
    ckpt = tmp_path / "shared_ckpt" if shared_ckpt else None
    launcher = [sys.executable, CORRUPTING] if corrupt else FT_LAUNCHER
    a = HealNode("a", tmp_path, port, ckpt, launcher)
    b = HealNode("b", tmp_path, port, ckpt, launcher)
    codes = (a.finish(), b.finish())
    for node in (a, b):
        (node.dir / "stderr.txt").write_text(node.err)
    assert codes == (0, 0), (codes, a.err[-4000:], b.err[-4000:])
    return a, b


@pytest.mark.timeout(200)
def test_the_node_that_lost_its_only_rank_heals_from_its_peer_and_both_resume_at_the_saved_step(tmp_path):
    a, b = _run_pair(tmp_path)
    by_role = {}
    for node in (a, b):
        assert [c["cycle"] for c in node.events("cycle_start")] == [0, 1]
        (healed,) = node.events("state_healed")
        assert healed["cycle"] == 1 and healed["bytes"] > 0 and healed["seconds"] >= 0
        by_role[healed["role"]] = (node, healed)
        assert not node.events("state_heal_failed")
    survivor, sent = by_role["sent"]
    crashed, received = by_role["received"]
    assert survivor.report(0)[0] == 0 and crashed.report(0)[0] == 1  # the crashed node's only rank was rank 1
    # no survivor on the crashed node: nothing saved there (the survivor's rank saved in its own
    # exception path: a state_saved record only if its launcher saw the failure before the restart)
    assert not crashed.events("state_saved") and crashed.events("state_not_saved")
    step = sent["step"]
    assert step in (136, 137) and received["step"] == step
    assert received["bytes"] == sent["bytes"]
    # both resume at the saved step, with the survivor's parameters and optimizer state
    _, survivor_lines = survivor.report(0)
    survivor_hash = next(line["hash"] for line in survivor_lines if line["op"] == "step" and line["step"] == step)
    for node in (a, b):
        _, lines = node.report(1)
        started = {key: lines[0].get(key) for key in ("op", "step", "source", "hash")}
        assert started == {"op": "started", "step": step, "source": "jit", "hash": survivor_hash}
        assert lines[-1] == {"op": "end", "step": 150}
    line = [ln for ln in crashed.err.splitlines() if "resume from the just-in-time state" in ln]
    assert len(line) == 1 and f"healed from node {0 if crashed is b else 1}" in line[0]
    assert f"{received['bytes']} bytes in" in line[0]


@pytest.mark.timeout(200)
def test_a_corrupt_transfer_is_refused_and_both_nodes_use_the_periodic_checkpoint(tmp_path):
    a, b = _run_pair(tmp_path, shared_ckpt=True, corrupt=True)
    failed = {}
    for node in (a, b):
        assert [c["cycle"] for c in node.events("cycle_start")] == [0, 1]
        assert not node.events("state_healed") or node.events("state_healed")[0]["role"] == "sent"
        for record in node.events("state_heal_failed"):
            failed[record["role"]] = record
        fallback = [ln for ln in node.err.splitlines() if "cycle 1: healing from node" in ln]
        assert len(fallback) == 1 and "SHA-256 differs" in fallback[0], node.err[-3000:]
        assert "periodic checkpoints are used" in fallback[0]
        _, lines = node.report(1)
        assert lines[0]["step"] == 100 and lines[0]["source"] == "ckpt"
        assert lines[-1] == {"op": "end", "step": 150}
    assert "SHA-256" in failed["received"]["reason"]
