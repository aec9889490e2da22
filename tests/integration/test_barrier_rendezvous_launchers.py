"""Two ft_launchers on 127.0.0.1 with ``--rdzv-backend ft-barrier`` (launcher/rendezvous/barrier.py):
a worker crashes, every node restarts in the next round and finishes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.integration.test_launcher_multinode import Node, free_port
from tests.launcher_util import launcher_env, records

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


SUM_OF_RANKS = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {value.item():g}", flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.timeout(90)
def test_plain_torchrun_finds_ft_barrier_through_the_installed_entry_point(tmp_path):
    # torchrun itself, not ft_launcher: nothing of ours runs unless torch's registry loaded the
    # package's torchrun.handlers entry point (pyproject.toml)
    script = tmp_path / "sum_of_ranks.py"
    script.write_text(SUM_OF_RANKS)
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "ft-barrier",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"plain-{port}", "--nnodes", "2",
         "--nproc-per-node", "1", "--rdzv-conf", f"is_host={int(name == 'a')}", str(script)],
        # torchrun leaves its torchelastic_* log dirs in TMPDIR (ft_launcher removes its own)
        env=launcher_env({"TMPDIR": str(tmp_path)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, cwd=tmp_path) for name in ("a", "b")]
    try:
        outputs = [node.communicate(timeout=75) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(err[-3000:] for _, err in outputs)
    lines = sorted(line for out, _ in outputs for line in out.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2 sum 3", "rank 1 of 2 sum 3"], outputs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("poll", ["-1", "0"])
def test_plain_torchrun_refuses_the_poll_intervals_ft_launcher_refuses(tmp_path, poll):
    # was: -1 accepted (a crash once a node waits), 0 accepted (a busy poll of the store)
    script = tmp_path / "sum_of_ranks.py"
    script.write_text(SUM_OF_RANKS)
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "ft-barrier",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"plain-{port}", "--nnodes", "1",
         "--nproc-per-node", "1", "--rdzv-conf", f"poll_interval={poll}", str(script)],
        env=launcher_env({"TMPDIR": str(tmp_path)}), capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert done.returncode != 0 and "rank 0 of 1" not in done.stdout, done.stderr[-3000:]
    assert f"invalid rendezvous configuration: poll_interval='{poll}' (seconds from 0.01 to 1)" in done.stderr
