"""Two ft_launchers on 127.0.0.1 acting as two nodes (c10d rendezvous), and restart hygiene.

A killed node and an excluded node are rows of the fault matrix (tests/faults).
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest

from tests.launcher_util import WORKER, events_of, read_events, records, start_launcher, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Node:
    """One ft_launcher acting as a node of a two-node job."""

    def __init__(self, name: str, tmp_path: Path, port: int, nnodes: str, launcher_args: list[str],
                 worker_args: list[str],
                 rdzv_conf: str = "join_timeout=10,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"):
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.events_path = self.dir / "events.jsonl"
        self.proc = start_launcher(
            ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}", "--monitor-interval", "0.05",
             *(["--rdzv-conf", rdzv_conf] if rdzv_conf else []),
             "--ft-event-log", str(self.events_path), *launcher_args,
             WORKER, "--record-dir", str(self.dir), *worker_args],
        )

    def finish(self, timeout: float = 120) -> int:
        self.out, self.err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def events(self, kind: str) -> list[dict]:
        return events_of(read_events(self.events_path), kind)


def test_a_hang_on_one_node_restarts_both_nodes(tmp_path):
    port = free_port()
    common = ["--max-restarts", "2", "--ft-param-rank_heartbeat_timeout", "1.5",
              "--ft-param-initial_rank_heartbeat_timeout", "60"]
    a = Node("a", tmp_path, port, "2", common, ["--gloo", "--steps", "20"])
    b = Node("b", tmp_path, port, "2", common, ["--gloo", "--steps", "20", "--hang-rank", "-1", "--hang-cycle", "0"])
    assert b.finish() == 0, b.err
    assert a.finish() == 0, a.err
    b_root = b.events("failure")[0]
    assert b_root["cause_kind"] == "hang" and b_root["cycle"] == 0
    for node in (a, b):
        assert [c["cycle"] for c in node.events("cycle_start")] == [0, 1]
        assert records(node.dir)[(1, node.events("cycle_start")[1]["ranks"]["0"])]["process_group_ready"]


def test_shutdown_requested_on_one_node_stops_every_node(tmp_path):
    port = free_port()
    a = Node("a", tmp_path, port, "2", ["--max-restarts", "3"], ["--steps", "2000"])
    b = Node("b", tmp_path, port, "2", ["--max-restarts", "3"],
             ["--request", "shutdown", "--request-rank", "-1"])
    assert b.finish() == 64, b.err
    assert a.finish() == 64, a.err
    request = a.events("control_request")[0]
    assert request["action"] == "ShutdownWorkload" and request["description"] == "test asked for shutdown"
    assert len(a.events("cycle_start")) == 1 and len(b.events("cycle_start")) == 1


def test_min_healthy_waits_while_enough_nodes_are_healthy(tmp_path):
    port = free_port()
    policy = ["--restart-policy", "min-healthy", "--max-restarts", "2"]
    a = Node("a", tmp_path, port, "1:2", policy, ["--steps", "40", "--crash-rank", "-1", "--crash-cycle", "0"])
    b = Node("b", tmp_path, port, "1:2", policy, ["--steps", "4", "--crash-rank", "-1", "--crash-cycle", "0"])
    assert a.finish() == 0, a.err
    assert b.finish() == 0, b.err
    b_failure = b.events("failure")[0]
    a_failure = a.events("failure")[0]
    assert "min-healthy: 1 healthy node(s) >= minimum 1" in b_failure["decision"]
    # b's workers were not restarted until a failed too (then fewer than 1 node was healthy)
    b_second_cycle = b.events("cycle_start")[1]
    assert b_second_cycle["ts"] > a_failure["ts"]
    for node in (a, b):
        assert [c["cycle"] for c in node.events("cycle_start")] == [0, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_twenty_crash_restart_cycles_each_form_the_gloo_group_first_time(tmp_path):
    proc = start_launcher(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "20", "--monitor-interval", "0.05",
         "--ft-event-log", str(tmp_path / "events.jsonl"),
         WORKER, "--record-dir", str(tmp_path), "--gloo", "--steps", "2",
         "--crash-rank", "1", "--crash-cycle", "-20"],
    )
    _, err = proc.communicate(timeout=280)
    assert proc.returncode == 0, err
    events = read_events(tmp_path / "events.jsonl")
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == list(range(21))
    roots = [f for f in events_of(events, "failure") if f["cause_kind"] != "terminated"]
    # every restart was caused by the planned crash, none by a group that failed to form (rank 0
    # may also exit 1 when gloo reports the peer's death before the launcher stops it)
    assert {(f["cycle"], f["rank"]) for f in roots if f["rank"] == 1} == {(c, 1) for c in range(20)}
    assert {f["cause"] for f in roots} == {"exit code 1"}
    recs = records(tmp_path)
    assert all(recs[(c, r)]["process_group_ready"] for c in range(21) for r in (0, 1))
    assert "Connection refused" not in err


def test_a_node_that_starts_late_joins_under_the_default_rendezvous_settings(tmp_path):
    # ft_launcher's c10d defaults drop a node whose keep-alive stopped after 3 s and end a last
    # call after 2 s; a healthy node that merely starts later than the others (a slow srun, a
    # long module load) must still be waited for: node a waits in the rendezvous well past both.
    port = free_port()
    a = Node("a", tmp_path, port, "2", [], ["--gloo", "--steps", "5"], rdzv_conf="")
    try:
        wait_for(lambda: a.events_path.exists() and a.events("launcher_start"), 60, "node a to start")
        assert a.proc.poll() is None
        late_by = 8.0
        time.sleep(late_by)  # the scenario itself: b starts this much later (not a synchronisation)
        assert a.proc.poll() is None, "node a gave up before node b came"
        b = Node("b", tmp_path, port, "2", [], ["--gloo", "--steps", "5"], rdzv_conf="")
        assert b.finish() == 0, b.err
        assert a.finish() == 0, a.err
    finally:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.communicate()
    for node in (a, b):
        assert [c["cycle"] for c in node.events("cycle_start")] == [0], node.events("cycle_start")
        assert not node.events("failure")
        start = node.events("launcher_start")[0]
        assert start["rdzv_conf"]["keep_alive_interval"] == "1" and start["rdzv_conf"]["last_call_timeout"] == "2"
    assert a.events("cycle_start")[0]["rendezvous_s"] >= late_by - 1




@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["any-failed", "min-healthy"])
def test_more_waiting_nodes_than_free_slots_do_not_restart_the_workload_forever(tmp_path, policy):
    # Node a runs alone in a 1:2 job (its round completes after the last call with one
    # participant); b, c and d then join while the round is complete with a free slot, so torch
    # puts them on its wait list. torch's agent restarts whenever that list is not empty, and
    # after a restart the nodes that found no place (at least one of b, c, d) stay on it: without
    # launcher/rendezvous/membership.py the job restarted about twice a second, forever. Under any-failed one
    # new node fits (one restart takes it in); under min-healthy new nodes are spares (no restart).
    port = free_port()
    args = ["--restart-policy", policy, "--max-restarts", "5"]
    work = ["--steps", "2", "--wait-for-signal"]  # each worker ends once its launcher forwards SIGUSR1
    # a node's keep-alive may lag under load while three launchers start: allow 10 s before it counts as dead
    conf = "join_timeout=30,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=10"
    # under any-failed node a looks for waiting nodes every 3 s, so that all three spares wait by
    # then (they start up to seconds apart) and two of them find no place in the next round
    slow_look = ["--monitor-interval", "3"] if policy == "any-failed" else []
    a = Node("a", tmp_path, port, "1:2", args + slow_look, work, rdzv_conf=conf)
    spares: list[Node] = []
    nodes = [a]

    def restarts() -> int:
        return sum(len(n.events("restart")) for n in nodes)

    def in_pair_round() -> list[Node]:  # the nodes that started a cycle in a round of two
        return [n for n in nodes if any(c["group_world_size"] == 2 for c in n.events("cycle_start"))]

    try:
        wait_for(lambda: a.events_path.exists() and a.events("cycle_start"), 60, "node a's first cycle")
        spares = [Node(name, tmp_path, port, "1:2", args, work, rdzv_conf=conf) for name in ("b", "c", "d")]
        nodes += spares
        wait_for(lambda: all(n.events_path.exists() and n.events("monitors_started") for n in spares), 60,
                 "the spares to reach the rendezvous")
        if policy == "any-failed":
            wait_for(lambda: len(in_pair_round()) == 2, 30, "the restart that takes one new node in")
        # the observation itself: in a loop a node of the job restarts at once (the other within
        # its monitor interval); no further restart or cycle may come in 5 s
        expected_starts, expected_restarts = (3, 1) if policy == "any-failed" else (1, 0)
        observe_until = time.monotonic() + 5
        while (time.monotonic() < observe_until and restarts() <= expected_restarts
               and sum(len(n.events("cycle_start")) for n in nodes) <= expected_starts):
            time.sleep(0.1)
        starts = {n.dir.name: [(c["cycle"], c["group_world_size"]) for c in n.events("cycle_start")] for n in nodes}
        assert sum(map(len, starts.values())) == expected_starts, starts
        assert restarts() == expected_restarts == len(a.events("restart")), starts
        running = in_pair_round() if policy == "any-failed" else [a]
        for node in running:
            node.proc.send_signal(signal.SIGUSR1)
        for node in running:
            assert node.finish(timeout=30) == 0, node.err
        # the others leave once the job has ended and closed the rendezvous (a node still waiting
        # as a spare then exits 0, as the reference's spares do)
        for node in nodes:
            if node not in running:
                node.finish(timeout=30)
                assert not [c for c in node.events("cycle_start") if c["group_world_size"] == 2], starts
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.communicate()
