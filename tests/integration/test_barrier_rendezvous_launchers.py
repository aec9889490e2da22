"""Two ft_launchers on 127.0.0.1 with ``--rdzv-backend ft-barrier`` (launcher/barrier_rendezvous.py):
a worker crashes, every node restarts in the next round and finishes."""

from __future__ import annotations

import pytest

from tests.integration.test_launcher_multinode import Node, free_port
from tests.launcher_util import records

BARRIER = ["--rdzv-backend", "ft-barrier"]  # after Node's own c10d: torchrun's parser keeps the last one


@pytest.mark.timeout(90)
def test_a_crash_on_one_node_restarts_every_node_in_a_barrier_round(tmp_path):
    port = free_port()
    common = [*BARRIER, "--max-restarts", "2", "--no-warm-restarts"]
    nodes = [Node(name, tmp_path, port, "2", common, ["--gloo", "--steps", "6", *crash])
             for name, crash in (("a", []), ("b", ["--crash-rank", "-1", "--crash-cycle", "0"]))]
    try:
        codes = {node.dir.name: node.finish(timeout=75) for node in nodes}
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.communicate()
    assert codes == {"a": 0, "b": 0}, "\n".join(n.err[-3000:] for n in nodes)
    for node in nodes:
        start = node.events("launcher_start")[0]
        assert start["rdzv_backend"] == "ft-barrier"
        cycles = node.events("cycle_start")
        assert [c["cycle"] for c in cycles] == [0, 1]
        assert all(c["group_world_size"] == 2 for c in cycles)
        assert records(node.dir)[(1, cycles[1]["ranks"]["0"])]["process_group_ready"]
    # each round's ranks are 0 and 1 (one per node, by arrival)
    for cycle in (0, 1):
        assert sorted(n.events("cycle_start")[cycle]["group_rank"] for n in nodes) == [0, 1]
    assert "joined round 2" in nodes[0].err
