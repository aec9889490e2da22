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
