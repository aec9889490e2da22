"""A node that dies after it joined a forming round, before the round closes (issue 31, item 4).

Three ft_launchers on 127.0.0.1, ``--nnodes 1:3`` with a long last call, so the round closes only
when the third node arrives: a and b join, the test sees both in the round (in the store),
SIGKILLs b's launcher, then starts c, which closes the round counting the dead b. torch's rank
assignment right after the round then waits for b's role info that never comes: it waited the
store's whole timeout (60 s) and ended both survivors with a ``DistStoreError`` traceback (exit 1,
no cycle run, no restart used). Now the failed round is a restart: a and c form the next round
without b and finish.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.integration.test_launcher_multinode import free_port
from tests.launcher_util import WORKER, events_of, live_descendants, read_events, start_launcher, wait_for

# The round must not close before c arrives (the last call, MIN 1, is long; MAX 3 closes it at once).
CONF = "join_timeout=120,last_call_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3"


class Launcher:
    def __init__(self, name: str, tmp_path: Path, port: int, max_restarts: int) -> None:
        self.dir = tmp_path / name
        (self.dir / "tmp").mkdir(parents=True)  # its own TMPDIR: b's run directory stays when it is killed
        self.events_path = self.dir / "events.jsonl"
        self.proc = start_launcher(
            ["--nnodes", "1:3", "--nproc-per-node", "1", "--rdzv-backend", "ft-barrier",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job-{port}", "--monitor-interval", "0.05",
             "--rdzv-conf", CONF, "--max-restarts", str(max_restarts), "--no-warm-restarts",
             "--ft-event-log", str(self.events_path), WORKER, "--record-dir", str(self.dir), "--steps", "3"],
            env={"TMPDIR": str(self.dir / "tmp")})
        self.err = ""

    def events(self, kind: str) -> list[dict]:
        return events_of(read_events(self.events_path), kind) if self.events_path.exists() else []

    def finish(self, timeout: float) -> int:
        _, self.err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode


def _store(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))


def _first_round(store, run_id: str) -> tuple[int, bool]:
    """How many nodes joined ft-barrier's first round (its arrival counter), and whether it closed."""
    prefix = f"ft_barrier/{run_id}/r1/"
    return int(store.add(prefix + "new", 0)), store.check([prefix + "closed"])


# c10d takes the same path (launcher.rendezvous.round_failure), but has no fast deterministic test:
# its round closes counting b only if b's keep-alive has not expired when c arrives, and the next
# round then waits the whole last call (its deadline starts again when MIN is reached).
@pytest.mark.timeout(240)
@pytest.mark.parametrize("max_restarts", [3, 0])
def test_a_node_that_dies_while_the_round_forms_is_a_restart_for_the_others(tmp_path, max_restarts):
    port = free_port()
    run_id = f"job-{port}"
    a = Launcher("a", tmp_path, port, max_restarts)
    launchers = [a]
    b_processes: list[int] = []
    try:
        wait_for(lambda: a.events("monitors_started"), 90, "node a to start")
        store = _store(port)
        wait_for(lambda: _first_round(store, run_id)[0] == 1, 60, "node a in the round")
        b = Launcher("b", tmp_path, port, max_restarts)
        launchers.append(b)
        wait_for(lambda: _first_round(store, run_id)[0] == 2, 90, "node b in the round")
        b_processes = live_descendants(b.proc.pid)  # its rank monitors, which a node's death takes too
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.communicate(timeout=30)
        assert _first_round(store, run_id) == (2, False), "the round closed before b died"
        killed_at = time.monotonic()
        c = Launcher("c", tmp_path, port, max_restarts)
        launchers.append(c)
        codes = {node.dir.name: node.finish(timeout=150) for node in (a, c)}
        took = time.monotonic() - killed_at
    finally:
        for node in launchers:
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.communicate()
        for pid in b_processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert codes == ({"a": 0, "c": 0} if max_restarts else {"a": 1, "c": 1}), "\n".join(n.err[-4000:] for n in (a, c))
    for node in (a, c):
        assert "Traceback" not in node.err, node.err[-4000:]
        failed = node.events("round_failed")
        assert len(failed) == 1, node.err[-4000:]
        assert failed[0]["group_world_size"] == 3 and failed[0]["missing_ranks"] == [1], failed
        assert failed[0]["waited_s"] < 30, failed  # bounded by the keep-alive rule, not the store's 60 s
        assert failed[0]["restarts_left"] == max_restarts
        assert "the round failed: rank 1 of its 3 node(s)" in node.err, node.err[-4000:]
        if not max_restarts:  # no restart left: the launcher's rendezvous failure, in one line
            assert "rendezvous failed: RoundFailed: the round failed" in node.err, node.err[-4000:]
            assert not node.events("cycle_start") and node.events("result")[-1]["outcome"] == "rendezvous failed"
            continue
        cycles = node.events("cycle_start")
        # the failed round counted as a restart: the one cycle ran in the next round, of two nodes
        starts = [(s["cycle"], s["group_world_size"], s["restart_count"]) for s in cycles]
        assert starts == [(0, 2, 1)], node.err[-4000:]
        assert node.events("result")[-1]["outcome"] == "succeeded"
        # a live member's keep-alive went on while its main thread waited in the store
        assert not re.search(r"rank [02] of round \d+ sent no heartbeat", node.err), node.err[-4000:]
    assert took < 120
