"""The reference's own spare-node scenarios, with real ft_launchers on 127.0.0.1 (issue 22).

Every launcher is a node of one c10d job (``is_host=1`` on the first: it holds the store, so the
scenarios never stop it). The workers (tests/workers/spare_scenario.py) form no process group, as
the reference's scenario workers: a node that leaves is noticed by the launchers through the
rendezvous, never through a failed collective. They count the runs of the workload (a line per
start of global rank 0) and register themselves while they live (the world size).

- min-healthy, 3 nodes + 1 spare at ``--nnodes 2:3``: a node that leaves while the minimum holds
  restarts nothing, a new node waits as a spare, the next node that leaves (below the minimum)
  restarts the workload with the spares; every node left ends with exit 0.
- ExcludeThisNode, 4 nodes + 1 late spare at ``--nnodes 2``: each exclusion makes that node leave
  (exit 65) and the remaining nodes restart the workload with a spare in its place.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_launcher_multinode import free_port
from tests.launcher_util import FT_LAUNCHER, events_of, launcher_env, read_events, wait_for

WORKER = str(Path(__file__).resolve().parent.parent / "workers" / "spare_scenario.py")
# torch's rendezvous drops a node (gone: excluded, stopped) once it sent no keep-alive for
# interval x attempts: 8 s here (ft_launcher's default is 3 s), because on two busy cores (other
# tests' launchers) a live launcher can miss 3 s of them and is then dropped for good, which the
# spare decisions count as a node gone. Keep-alives and polls are writes and reads of the whole
# rendezvous state; fewer of them (every 2 s, polls every 0.25 s) let a slow node's own write
# (joining the wait list) win. The last call waits up to 30 s for the third node of a 2:3 job
# (launchers reach the rendezvous up to 20 s apart on busy cores); it costs nothing when all three
# come in time (a full round completes at once).
RDZV_CONF = "join_timeout=90,last_call_timeout=30,keep_alive_interval=2,keep_alive_max_attempt=4,poll_interval=0.25"
SPARE_LINE = "wait as spare"  # launcher/rendezvous/membership.py's INFO line when waiting nodes restart nothing


class Node:
    """One ft_launcher of the job; its log goes to a file, read while it runs."""

    def __init__(self, name: str, tmp_path: Path, port: int, launcher_args: list[str], is_host: bool = False,
                 warm: bool = False):
        self.name = name
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.events_path = self.dir / "events.jsonl"
        self.log_path = self.dir / "launcher.log"
        self.control = self.dir / "control"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*FT_LAUNCHER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", f"job-{port}", "--rdzv-conf", f"is_host={int(is_host)},{RDZV_CONF}",
                 "--monitor-interval", "0.1", "--ft-event-log", str(self.events_path),
                 # the workers import no torch: a warm template per launcher would only load the CPUs
                 *([] if warm else ["--no-warm-restarts"]), *launcher_args,
                 WORKER, "--state-dir", str(tmp_path), "--control-file", str(self.control)],
                env=launcher_env(), stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, kind: str) -> list[dict]:
        return events_of(read_events(self.events_path), kind) if self.events_path.exists() else []

    def cycles(self) -> list[tuple[int, int]]:
        return [(c["cycle"], c["group_world_size"]) for c in self.events("cycle_start")]

    def spare_lines(self) -> int:
        return self.log().count(SPARE_LINE)

    def finish(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {self.name} did not exit in {timeout} s; its log:\n{self.log()}") from None


class Job:
    """The nodes of one scenario and what their workers wrote."""

    def __init__(self, tmp_path: Path, launcher_args: list[str], warm: bool = False):
        self.tmp_path = tmp_path
        self.port = free_port()
        self.launcher_args = launcher_args
        self.warm = warm
        self.nodes: list[Node] = []

    def start(self, name: str, is_host: bool = False) -> Node:
        node = Node(name, self.tmp_path, self.port, self.launcher_args, is_host, self.warm)
        self.nodes.append(node)
        return node

    def runs(self) -> list[int]:
        """The world size of each run of the workload so far (a line per start of global rank 0)."""
        path = self.tmp_path / "runs"
        return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []

    def world_size(self) -> int:
        """The workers alive now (registered, and their process not gone)."""
        alive = self.tmp_path / "alive"
        return sum(1 for entry in alive.iterdir() if _running(int(entry.name))) if alive.exists() else 0

    def state(self) -> str:
        return (f"runs {self.runs()}, world size {self.world_size()}, cycles "
                f"{ {n.name: n.cycles() for n in self.nodes} }, exit codes "
                f"{ {n.name: n.proc.poll() for n in self.nodes} }")

    def wait(self, predicate, timeout: float, what: str) -> None:
        try:
            wait_for(predicate, timeout, what)
        except AssertionError as err:
            raise AssertionError(f"{err}: {self.state()}\n" + self.logs()) from None

    def logs(self) -> str:
        return "\n".join(f"--- node {n.name}:\n{n.log()[-3000:]}" for n in self.nodes)

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.kill()
                node.proc.wait()


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_min_healthy_spares_wait_until_the_healthy_nodes_fall_below_the_minimum(tmp_path):
    job = Job(tmp_path, ["--nnodes", "2:3", "--nproc-per-node", "2", "--max-restarts", "1",
                         "--ft-restart-policy", "min-healthy"])
    try:
        a = job.start("a", is_host=True)
        b, c = job.start("b"), job.start("c")
        job.wait(lambda: job.runs() == [6] and job.world_size() == 6, 90, "the first run on 3 nodes")
        d = job.start("d")  # the round is full: d is a spare
        job.wait(lambda: d.events("monitors_started"), 30, "node d to reach the rendezvous")

        # 1. a running node leaves while the minimum (2) holds: no restart, the spare stays a spare
        b.proc.send_signal(signal.SIGTERM)
        job.wait(lambda: job.world_size() == 4 and a.spare_lines() and c.spare_lines(), 45,
                 "nodes a and c to see node d wait and leave it a spare")
        assert job.runs() == [6], job.state()
        assert d.cycles() == [], job.state()

        # 2. a new node is a spare too and does not interrupt training
        lines = a.spare_lines(), c.spare_lines()
        e = job.start("e")
        job.wait(lambda: a.spare_lines() > lines[0] and c.spare_lines() > lines[1], 30,
                 "nodes a and c to see node e wait and leave it a spare")
        assert job.runs() == [6] and job.world_size() == 4, job.state()
        assert d.cycles() == [] and e.cycles() == [], job.state()

        # 3. another running node leaves: 1 healthy node < 2, the workload restarts with the spares
        c.proc.send_signal(signal.SIGTERM)
        job.wait(lambda: job.runs() == [6, 6] and job.world_size() == 6, 60, "the second run, with d and e")
        assert [n for n in (a, d, e) if n.cycles()[-1][1] != 3] == [], job.state()
        # b and c, stopped by a signal to their launchers, said they left before stopping their
        # workers: node a's records (torch restarted it for the spares once c was gone from the
        # round) name a node that left, never a lost one (a lost node counts as bad for autoresume)
        assert {f["root_outcome"] for f in a.events("failure")} <= {"left"}, a.events("failure")

        # 4. the end: every node left exits 0
        (tmp_path / "finish").touch()
        for node in (a, d, e):
            assert node.finish() == 0, job.state() + "\n" + job.logs()
        assert job.runs() == [6, 6], job.state()
        for node in (b, c):  # stopped by SIGTERM (their workers exited 143: exit 1)
            node.finish()
    finally:
        job.stop_all()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_exclude_this_node_restarts_the_others_with_a_spare_in_its_place(tmp_path):
    job = Job(tmp_path, ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "10"])
    try:
        job.start("a", is_host=True)
        for name in ("b", "c", "d"):
            job.start(name)
        job.wait(lambda: job.runs() == [2] and job.world_size() == 2, 90, "the first run on 2 nodes")
        late = job.start("e")  # joins the running job: a spare
        job.wait(lambda: late.events("monitors_started"), 30, "node e to reach the rendezvous")
        excluded: list[Node] = []
        for run in (2, 3):
            # a node of the latest run that does not hold the store
            latest = [n for n in job.nodes if n.name != "a" and n.proc.poll() is None and _in_latest_run(n, job)]
            assert latest, job.state()
            victim = latest[0]
            victim.control.write_text("exclude")
            job.wait(lambda v=victim: not v.control.exists(), 10, f"node {victim.name}'s worker to take the command")
            assert victim.finish() == 65, job.state()
            assert victim.events("result")[-1]["outcome"] == "node_excluded", job.state()
            excluded.append(victim)
            job.wait(lambda r=run: len(job.runs()) == r and job.world_size() == 2, 60,
                     f"run {run}, without node {victim.name}")
        assert job.runs() == [2, 2, 2], job.state()
        # the end: the two running nodes exit 0, as in the reference
        (tmp_path / "finish").touch()
        # c10d fills each round with the first nodes to arrive, not the last round's members: a node
        # that ran before (even the store's host) can be a spare now, so ask whose workers are alive
        running = [n for n in job.nodes if n not in excluded and _in_latest_run(n, job)]
        assert len(running) == 2, job.state()
        for node in running:
            assert node.finish() == 0, job.state() + "\n" + job.logs()
        # the spare left waiting exits 0 when it sees the rendezvous closed; if it polls only after
        # the store's host (a) exited, it cannot tell the end from a lost host: rendezvous failed, 1
        for node in job.nodes:
            if node not in excluded and node not in running:
                code = node.finish()
                assert code == 0 or (code == 1 and "rendezvous failed" in node.log()), job.state() + "\n" + job.logs()
    finally:
        job.stop_all()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_spare_prepares_its_warm_template_while_it_waits_and_takes_the_place_warm(tmp_path):
    # Warm restarts on (the template imports torch, as by default): a spare waits with idle CPUs,
    # so it starts its template after 10 s in the rendezvous; the round that admits it forks its
    # workers from that template instead of starting them cold.
    job = Job(tmp_path, ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3"], warm=True)
    try:
        a = job.start("a", is_host=True)
        b = job.start("b")
        job.wait(lambda: job.runs() == [2] and job.world_size() == 2, 90, "the first run on 2 nodes")
        spare = job.start("c")
        job.wait(lambda: spare.events("warm_template_started"), 60, "the spare to start its template while it waits")
        assert spare.cycles() == [], job.state()
        assert spare.events("warm_template_started")[0]["cycle"] == 0, spare.events("warm_template_started")
        b.control.write_text("exclude")  # b leaves (exit 65); a restarts with the spare in its place
        assert b.finish() == 65, job.state() + "\n" + job.logs()
        job.wait(lambda: len(job.runs()) == 2 and job.world_size() == 2, 60, "the second run, with the spare")
        (start,) = spare.events("cycle_start")
        assert (start["warm_start"], start.get("cold_reason")) == (True, None), start
        (tmp_path / "finish").touch()
        assert a.finish() == 0 and spare.finish() == 0, job.state() + "\n" + job.logs()
    finally:
        job.stop_all()


def _in_latest_run(node: Node, job: Job) -> bool:
    """True if ``node``'s worker is alive now (it runs in the latest run)."""
    alive = job.tmp_path / "alive"
    pids = {int(p.name) for p in alive.iterdir() if _running(int(p.name))} if alive.exists() else set()
    starts = node.events("cycle_start")
    return bool(starts) and bool(set(starts[-1]["worker_pids"].values()) & pids)
