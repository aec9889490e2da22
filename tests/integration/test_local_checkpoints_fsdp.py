"""Local checkpoints of a sharded job with real processes: plain torch FSDP2 (``fully_shard`` on
CPU, gloo) under two ft_launchers on one machine, each with its own node-local directory (two nodes).

Each rank saves only its shard of the parameters and of the optimizer state (DTensors) through
``LocalCheckpointManager``; the same local rank of the other node keeps a replica. Node b's ranks
die right after a save and its local directory is wiped (a lost node): the restarted job restores
every shard, node b's from node a's replicas, with parameters and optimizer state equal, tensor for
tensor, to what was saved (tests/workers/local_ckpt_fsdp.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.test_local_checkpoints import Job, clear_reports

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "local_ckpt_fsdp.py")
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_lost_node_of_an_fsdp_job_restores_every_shard_from_its_peers_replica(tmp_path, nproc):
    job = Job(tmp_path, {"every": 2, "max_steps": 50, "die": {"node": "b", "after": 5}}, nproc=nproc, worker=WORKER)
    results = job.finish()
    assert results["b"][0] != 0 and results["a"][0] != 0, results
    saved = {(r["rank"], r["iteration"]): r["fingerprint"] for r in job.reports() if r["kind"] == "saved"}
    world = 2 * nproc
    assert {(rank, 4) for rank in range(world)} <= set(saved), job.reports()
    shards = {rank: saved[(rank, 4)]["/model/0.weight"] for rank in range(world)}
    assert all(s.startswith(f"shard:({16 // world}, 32):") for s in shards.values()), shards
    assert len(set(shards.values())) == world, "each rank saved a different shard"
    assert any(key.startswith("/optim/state/") and value.startswith("shard:")
               for key, value in saved[(0, 4)].items()), "the optimizer state is sharded too"
    shutil.rmtree(tmp_path / "local_b")  # the lost node's disk
    clear_reports(job.root)

    job = Job(tmp_path, {"every": 2, "max_steps": 6}, nproc=nproc, worker=WORKER)
    results = job.finish()
    assert all(code == 0 for code, _ in results.values()), results
    starts = {r["rank"]: r for r in job.reports() if r["kind"] == "start"}
    assert sorted(starts) == list(range(world)), job.reports()
    for rank, start in starts.items():
        assert start["step"] == 4, start
        assert start["fingerprint"] == saved[(rank, 4)], f"rank {rank}'s restored shard differs from the saved one"
        assert start["load"]["received"] == (start["node"] == "b"), start
    assert {r["rank"] for r in job.reports() if r["kind"] == "end" and r["step"] == 6} == set(range(world))


def test_lightning_model_parallel_fsdp2_restores_every_shard_from_the_peers_replica(tmp_path):
    """Lightning's ModelParallelStrategy (FSDP2) loads a checkpoint path itself, not through its
    CheckpointIO: LocalCheckpointCallback routes its load through HierarchicalCheckpointIO, so the
    job resumes from the local checkpoints (node b's shards from node a's replicas), not from the
    global path (which does not exist: the strategy's own load would fail on it)."""
    cfg = {"strategy": "fsdp2", "every": 2}
    job = Job(tmp_path, {**cfg, "max_steps": 50, "die": {"node": "b", "after": 5}})
    results = job.finish()
    assert results["b"][0] != 0 and results["a"][0] != 0, results
    saved = {(r["rank"], r["iteration"]): r["fingerprint"] for r in job.reports() if r["kind"] == "saved"}
    assert {(0, 4), (1, 4)} <= set(saved), job.reports()
    assert saved[(0, 4)]["/state_dict/layer.weight"].startswith("shard:(1, 32):"), saved[(0, 4)]
    assert saved[(0, 4)]["/optimizer_states/0/state/layer.weight/exp_avg"].startswith("shard:(1, 32):")
    shutil.rmtree(tmp_path / "local_b")
    clear_reports(job.root)

    job = Job(tmp_path, {**cfg, "max_steps": 8, "resume": str(tmp_path / "shared" / "global" / "none.ckpt")})
    results = job.finish()
    assert all(code == 0 for code, _ in results.values()), results
    starts = {r["rank"]: r for r in job.reports() if r["kind"] == "start"}
    assert sorted(starts) == [0, 1], job.reports()
    for rank, start in starts.items():
        assert start["step"] == 4, start
        assert start["fingerprint"] == saved[(rank, 4)], f"rank {rank}'s restored shard differs from the saved one"
        assert start["load"]["received"] == (start["node"] == "b"), start
