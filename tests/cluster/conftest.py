"""Fixtures for the multi-node tests (``make test-cluster`` starts the cluster).

The cluster is the shared multi-node SLURM cluster of this machine kind
(``/work/shared/tools/slurm-cluster``: one network namespace, hostname and slurmd per node; see
docs/multinode.md). ``make test-cluster`` starts it, runs this directory and stops it whatever
happened. Without a running cluster every test here is skipped with the reason.

Each test gets a :class:`ClusterRun`: it submits ``tests/cluster/ft_job.sbatch`` (one
``ft_launcher`` per node under ``srun``, c10d rendezvous on the first node, ``train.py`` as the
workload), injects node faults with the cluster's ``fault.sh``, reads every node's event log and
timeline, and at teardown cancels its jobs, brings faulted nodes back and checks that nothing of
ours is left on any node (processes in each node's namespace, listening sockets, per-node temp
dirs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = Path(__file__).resolve().parent / "ft_job.sbatch"
AUTORESUME = REPO_ROOT / "scripts" / "autoresume.sh"
TRAIN = Path(__file__).resolve().parent / "train.py"
CLUSTER_DIR = Path(os.environ.get("SLURM_CLUSTER_DIR", "/tmp/slurm-cluster"))
TOOLS = Path(os.environ.get("SLURM_CLUSTER_TOOLS",
                           Path(__file__).resolve().parents[2].parent / "shared" / "tools" / "slurm-cluster"))
PROBE_TIMEOUT_S = 15
# Settings every scenario shares: a 3 s heartbeat timeout once the first heartbeat came (the
# figure of the earlier multi-node measurements), a generous initial one (starting 3 workers on 2 cores).
FT_ARGS = ("--monitor-interval 0.1 --ft-param-rank-heartbeat-timeout 3 "
           "--ft-param-initial-rank-heartbeat-timeout 120")
T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@cache
def _cluster() -> tuple[dict[str, str] | None, list[tuple[str, str]], str]:
    """(environment for SLURM commands, [(node, namespace)], "") when the cluster runs, else why not."""
    if os.environ.get("PTLR_CLUSTER_TESTS") != "1":
        return None, [], "multi-node cluster tests run under make test-cluster (PTLR_CLUSTER_TESTS=1)"
    nodes_file = CLUSTER_DIR / "nodes"
    if shutil.which("scontrol") is None:
        return None, [], "SLURM client tools are not installed (make test-cluster starts the cluster)"
    if not nodes_file.exists() or not (TOOLS / "fault.sh").exists():
        return None, [], f"no multi-node cluster in {CLUSTER_DIR} (tools: {TOOLS}); make test-cluster starts one"
    env = dict(os.environ, SLURM_CONF=str(CLUSTER_DIR / "etc" / "slurm.conf"),
               SLURM_CLUSTER_DIR=str(CLUSTER_DIR))
    try:
        ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, [], f"SLURM did not answer within {PROBE_TIMEOUT_S} s"
    if " is UP" not in ping.stdout:
        return None, [], f"the cluster's controller does not answer: {ping.stdout.strip() or ping.stderr.strip()}"
    nodes = [tuple(line.split()[:2]) for line in nodes_file.read_text().splitlines() if line.strip()]
    return env, nodes, ""  # type: ignore[return-value]


@dataclass
class ClusterRun:
    tmp_path: Path
    env: dict[str, str]
    nodes: list[tuple[str, str]]
    jobs: list[str] = field(default_factory=list)
    faulted: set[str] = field(default_factory=set)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        """Shared by the nodes; under $PTLR_CLUSTER_RUNS/<test> when set (kept for a look after)."""
        keep = os.environ.get("PTLR_CLUSTER_RUNS")
        return Path(keep) / self.tmp_path.name if keep else self.tmp_path / "run"

    # --- SLURM ---------------------------------------------------------------------------------
    def slurm(self, *command: str, timeout: float = 30, check: bool = True) -> str:
        proc = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr}"
        return proc.stdout

    def submit(self, nodes: int = 3, nnodes: str | None = None, launcher_args: str = "",
               train_args: str = "", srun_args: str = "--no-kill", sbatch_args: tuple[str, ...] = ("--no-kill",),
               time_limit: str = "5") -> str:
        """Submit ft_job.sbatch on ``nodes`` nodes; return the job id."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(self.env, FTJ_PY=sys.executable, FTJ_REPO=str(REPO_ROOT), FTJ_RUN_DIR=str(self.run_dir),
                   FTJ_NNODES=nnodes or str(nodes), FTJ_LAUNCHER_ARGS=f"{FT_ARGS} {launcher_args}",
                   FTJ_TRAIN_ARGS=train_args, FTJ_SRUN_ARGS=srun_args)
        out = subprocess.run(
            ["sbatch", "--parsable", f"--nodes={nodes}", "--ntasks-per-node=1", f"--time={time_limit}",
             f"--output={self.run_dir}/slurm-%j.out", "--open-mode=append", "--export=ALL",
             *sbatch_args, str(JOB_SCRIPT)],
            env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"sbatch failed: {out.stderr}"
        job_id = out.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def submit_autoresume(self, nodes: int = 3, launcher_args: str = "", train_args: str = "",
                          script_args: tuple[str, ...] = (), sbatch_args: tuple[str, ...] = ("--time=5",),
                          job_no_kill: bool = True) -> str:
        """Submit scripts/autoresume.sh as the batch script (slurm mode: srun --no-kill, one
        ft_launcher per node, --nnodes = the allocation's node count); return the job id.

        ``job_no_kill``: also ``sbatch --no-kill`` (the job keeps its other nodes when one fails);
        without it SLURM ends and requeues the whole job when a node goes DOWN."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        launcher = Path(sys.executable).parent / "ft_launcher"
        args = f"{FT_ARGS} --nproc-per-node 1 --ft-event-log {self.run_dir}/events/{{node}}.jsonl {launcher_args}"
        out = subprocess.run(
            ["sbatch", "--parsable", f"--nodes={nodes}", "--ntasks-per-node=1", *sbatch_args, "--requeue",
             *(["--no-kill"] if job_no_kill else []), f"--output={self.run_dir}/slurm-%j.out", "--open-mode=append",
             f"--chdir={REPO_ROOT}",
             str(AUTORESUME), "--launcher", str(launcher), "--run-dir", str(self.run_dir / "autoresume"),
             "--srun-args", "--no-kill", "--launcher-args", args, *script_args,
             "--", str(TRAIN), "--run-dir", str(self.run_dir), *train_args.split()],
            env=self.env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"sbatch failed: {out.stderr}"
        job_id = out.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def srun_launchers(self, nodes: int = 3, nnodes: str | None = None, launcher_args: str = "",
                       train_args: str = "") -> subprocess.Popen:
        """Run ft_job.sbatch's srun line from the root namespace (not a node, so it survives any
        node fault, e.g. of the rendezvous host node1, where a batch script would run)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(self.env, FTJ_PY=sys.executable, FTJ_REPO=str(REPO_ROOT), FTJ_RUN_DIR=str(self.run_dir),
                   FTJ_NNODES=nnodes or str(nodes), FTJ_LAUNCHER_ARGS=f"{FT_ARGS} {launcher_args}",
                   FTJ_TRAIN_ARGS=train_args, FTJ_SRUN_ARGS="--no-kill")
        log = open(self.run_dir / "srun.out", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(["salloc", f"--nodes={nodes}", "--no-kill", "--time=5", "bash", str(JOB_SCRIPT)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def history(self) -> list[dict[str, str]]:
        path = self.run_dir / "autoresume" / "history.tsv"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        header = lines[0].split("\t")
        return [dict(zip(header, line.split("\t"), strict=False)) for line in lines[1:]]

    def job_state(self, job_id: str) -> dict[str, str]:
        text = self.slurm("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S+)", text))

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Wait until the job is no longer pending or running; return scontrol's fields."""
        def over() -> dict[str, str] | None:
            state = self.job_state(job_id)
            return state if state.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING",
                                                           "COMPLETING", "REQUEUED") else None
        try:
            return wait_for(over, timeout, f"job {job_id} to end", interval=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.diagnostics()}") from None

    # --- faults --------------------------------------------------------------------------------
    def fault(self, *args: str, timeout: float = 60) -> float:
        """Run ``fault.sh ARGS``; return the time (epoch s) just before it started."""
        if args[0] in ("crash", "poweroff", "partition", "throttle"):
            self.faulted.add(args[1])
        start = time.time()
        (self.run_dir / "timeline").mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "timeline" / "faults.jsonl", "a") as f:
            f.write(json.dumps({"event": "fault", "t": start, "node": args[1], "fault": " ".join(args)}) + "\n")
        proc = subprocess.run(["bash", str(TOOLS / "fault.sh"), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        assert proc.returncode == 0, f"fault.sh {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return start

    # --- what the job left ---------------------------------------------------------------------
    def timeline(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted((self.run_dir / "timeline").glob("*.jsonl")):
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(out, key=lambda e: e["t"])

    def events(self, node: str) -> list[dict[str, Any]]:
        path = self.run_dir / "events" / f"{node}.jsonl"
        assert path.exists(), f"no event log for {node}: {path}"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def log(self, node: str) -> str:
        path = self.run_dir / "logs" / f"{node}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def diagnostics(self) -> str:
        parts = []
        for out in sorted(self.run_dir.glob("slurm-*.out")):
            parts.append(f"--- {out.name}\n{out.read_text(errors='replace')[-3000:]}")
        for node, _ in self.nodes:
            parts.append(f"--- {node}.log\n{self.log(node)[-3000:]}")
        return "\n".join(parts)

    def node_processes(self, namespace: str) -> list[str]:
        """Command lines of the processes in a node's namespace other than its slurmd."""
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
        procs = []
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if cmd and not re.match(r"^\S*slurmd\b", cmd):
                procs.append(f"{pid}: {cmd[:200]}")
        return procs

    def listeners(self, namespace: str) -> list[str]:
        """Listening TCP and unix sockets in a node's namespace other than slurmd's port."""
        out = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-Hlnxt"], capture_output=True,
                             text=True).stdout
        return [line for line in out.splitlines() if line.strip() and ":6818 " not in line]

    def assert_no_leftovers(self, timeout: float = 30, crashed: tuple[str, ...] = ()) -> None:
        """Nothing of ours on any node: processes, listening sockets, per-node temp dirs (those of
        ``crashed`` nodes excepted: a SIGKILLed launcher cannot clean up its files)."""
        def clean() -> bool:
            return all(not self.node_processes(ns) and not self.listeners(ns) for _, ns in self.nodes)
        try:
            wait_for(clean, timeout, "every node to be clean", interval=0.5)
        except AssertionError:
            found = {node: (self.node_processes(ns), self.listeners(ns)) for node, ns in self.nodes}
            raise AssertionError(f"left on the nodes (processes, listeners): {found}") from None
        tmp = self.run_dir / "tmp"  # torchinductor_<user>: torch's own cache, made by `import torch`
        left = [str(p.relative_to(tmp)) for p in tmp.glob("*/*")
                if p.parent.name not in crashed and not p.name.startswith("torchinductor_")] \
            if tmp.exists() else []
        assert not left, f"left in the per-node temp dirs: {left}"

    def cleanup(self) -> None:
        for job_id in self.jobs:
            self.slurm("scancel", job_id, check=False)
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for node in sorted(self.faulted):
            subprocess.run(["bash", str(TOOLS / "fault.sh"), "fast", node], env=self.env, capture_output=True,
                           timeout=30)
            subprocess.run(["bash", str(TOOLS / "fault.sh"), "heal", node], env=self.env, capture_output=True,
                           timeout=60)
            subprocess.run(["bash", str(TOOLS / "fault.sh"), "revive", node], env=self.env, capture_output=True,
                           timeout=90)

        def idle() -> bool:
            states = self.slurm("sinfo", "-h", "-N", "-o", "%T", check=False).split()
            busy = self.slurm("squeue", "-h", "-o", "%i", check=False).split()
            return not busy and bool(states) and all(s == "idle" for s in states)
        wait_for(idle, 90, "every node idle and no job left", interval=0.5)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Replaces tests/conftest.py's check of this process's descendants: here a revived node's
    slurmd is one (fault.sh starts it) and must live on; ClusterRun.assert_no_leftovers checks
    every node's namespace instead."""
    yield


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterRun]:
    """One test's jobs and faults on the running cluster; cleaned up and nodes revived after it."""
    env, nodes, why = _cluster()
    if env is None:
        pytest.skip(why)
    run = ClusterRun(tmp_path, env, nodes)
    try:
        yield run
    finally:
        run.cleanup()


def failures(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "failure"]


def cycle_starts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "cycle_start"]
