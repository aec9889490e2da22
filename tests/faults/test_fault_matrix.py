"""The fault matrix: every way a run can go wrong, against real ft_launchers with 2 ranks.

Each ``Case`` below is one run of ft_launcher (two for the two-node cases) with
``tests/workers/faults_worker.py`` and states what must come out of it: the launcher's exit code,
its ``result`` outcome, the root failures in its event log (cycle, rank, kind, cause, hang kind,
section), the number of cycles, and case-specific checks. Several faults of the same family are
planned in consecutive cycles of one run (one launcher start, about 3 s of CPU, instead of one
each); each fault is then a test of its own (its ``Root`` has an id) that asserts its cause, its
one stderr line, that its cycle's processes are gone, and its own check, on top of everything
the run must show.

For every case the test also asserts that nothing of the run is left: no process that carries the
case's marker environment variable (launcher, monitors, warm template, trampolines, workers and
their children), and nothing at all in the case's TMPDIR (run directory, socket files).

The selected cases run concurrently before the first test (``tests/faults/runner.py``); the
tests then assert on their outcomes. ``FT_FAULTS_PARALLEL`` sets the pool size (default 5),
``FT_FAULTS_VERBOSE=1`` prints each case's wall time, ``FT_FAULTS_KEEP=1`` keeps the logs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from tests.faults import signal_cases as sc
from tests.faults.runner import WORKER, CaseRun, free_port, live_case_processes, run_all, wait_for

PARALLEL = int(os.environ.get("FT_FAULTS_PARALLEL", "5"))
# How late a detection may be on a loaded 2-core machine (bench/hang_detection.py has the figure).
LATENESS_BOUND = 1.0

pytestmark = pytest.mark.timeout(400)  # the first test also waits for the whole matrix

HB = ("--ft-param-initial_rank_heartbeat_timeout", "1", "--ft-param-rank_heartbeat_timeout", "1")
SECTIONS = ("--ft-param-rank_section_timeouts", "setup:1,step:1,checkpointing:1",
            "--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null")
# Both nodes start together and join within last_call_timeout of each other; a dead node is
# dropped from the rendezvous after keep_alive_interval x keep_alive_max_attempt.
TWO_NODE_RDZV = "join_timeout=30,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=2"


@dataclass(frozen=True)
class Root:
    """An expected root failure (``cause_kind`` other than ``terminated``).

    Attributes:
        id: Makes this fault a test of its own (in a case that plans several).
        check: Extra assertions for it: ``check(run, failure_record)``.
    """

    cycle: int
    rank: int
    kind: str  # hang | exit | signal
    cause: str  # a substring of the recorded cause
    hang_kind: str | None = None
    section: str | None = None
    id: str | None = None
    check: Callable[[CaseRun, dict], None] | None = None


def hang(cycle: int, rank: int, hang_kind: str, section: str | None = None, **kwargs) -> Root:
    text = {"initial_heartbeat": "no initial heartbeat", "heartbeat": "no heartbeat for",
            "section": f"section {section!r} open", "out_of_section": "out of any section"}[hang_kind]
    return Root(cycle, rank, "hang", text, hang_kind, section, **kwargs)


@dataclass(frozen=True)
class Case:
    """One launcher run of the matrix.

    Attributes:
        id: Test id.
        plan: ``CYCLE:RANK:KIND`` fault plans for the worker (see faults_worker.py).
        launcher: Extra ft_launcher arguments (later ones override the defaults).
        worker: Extra worker arguments.
        exit_code: The launcher's exit code (node ``a`` in two-node cases).
        outcome: The ``result`` record's outcome; None when the launcher cannot write one.
        roots: The root failures, in the order recorded (None: left to ``check``).
        cycles: The number of cycles started (None: not checked).
        drive: Runs the case (default: run the launcher to completion).
        check: Case-specific assertions.
        budget: Seconds the case may take.
        xfail: Reason the case is expected to fail (strict: it must fail).
        extra: Parameters of the case's driver.
        script: The worker script.
    """

    id: str
    plan: tuple[str, ...] = ()
    launcher: tuple[str, ...] = ()
    worker: tuple[str, ...] = ()
    exit_code: int = 0
    outcome: str | None = "succeeded"
    roots: tuple[Root, ...] | None = ()
    cycles: int | None = None
    drive: Callable[[Case, CaseRun], None] | None = None
    check: Callable[[Case, CaseRun], None] | None = None
    budget: float = 60.0
    xfail: str | None = None
    extra: dict = field(default_factory=dict)
    script: str = WORKER

    def launcher_args(self, run: CaseRun, name: str = "a") -> list[str]:
        return ["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.05", "--warm-preload=",
                "--max-restarts", "1", "--ft-event-log", str(run.dir / f"{name}.events.jsonl"), *self.launcher]

    def worker_args(self, run: CaseRun, record_dir: Path | None = None) -> list[str]:
        plans = [arg for plan in self.plan for arg in ("--plan", plan)]
        return [self.script, "--dir", str(record_dir or run.dir), *plans, *self.worker]


# ---------------------------------------------------------------------------- drivers


def run_to_completion(case: Case, run: CaseRun) -> None:
    run.launch(case.launcher_args(run) + case.worker_args(run)).finish(case.budget)


def both_started(run: CaseRun, cycle: int = 0) -> bool:
    return bool(run.record(cycle, 0) and run.record(cycle, 1))


def signal_when_running(sig: signal.Signals, case: Case, run: CaseRun) -> None:
    launcher = run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: both_started(run), 30, "both workers of cycle 0")
    sent = time.monotonic()
    launcher.signal(sig)
    launcher.finish(case.budget)
    run.info["stop_s"] = time.monotonic() - sent


def kill_launcher(case: Case, run: CaseRun) -> None:
    launcher = run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: both_started(run), 30, "both workers of cycle 0")
    assert live_case_processes(run.case_id)
    launcher.proc.kill()
    launcher.finish(10)
    killed = time.monotonic()
    wait_for(lambda: not live_case_processes(run.case_id), 10, "every process of the run to exit")
    run.info["gone_s"] = time.monotonic() - killed


def kill_monitor(case: Case, run: CaseRun) -> None:
    launcher = run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: both_started(run), 30, "both workers of cycle 0")
    run.info["monitor"] = launcher.events("monitors_started")[0]["monitor_pids"][0]
    os.kill(run.info["monitor"], signal.SIGKILL)
    launcher.finish(case.budget)


def rendezvous_args(case: Case, run: CaseRun, name: str, port: int, nnodes: str, nproc: int) -> list[str]:
    return ["--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"{case.id}-{port}",
            "--monitor-interval", "0.05", "--ft-event-log", str(run.dir / f"{name}.events.jsonl"), *case.launcher]


def sigterm_in_rendezvous(case: Case, run: CaseRun) -> None:
    # A two-node job whose second node never comes: the launcher waits in the rendezvous.
    port = free_port()
    launcher = run.launch(rendezvous_args(case, run, "a", port, "2", 2) + case.worker_args(run),
                          env={"LOGLEVEL": "INFO"})  # torch's agent then logs when it enters the rendezvous
    run.wait_for(lambda: "Rendezvous'ing worker group" in launcher.log(), 30, "the launcher to enter the rendezvous")
    sent = time.monotonic()
    launcher.signal(signal.SIGTERM)
    launcher.finish(case.budget)
    run.info["stop_s"] = time.monotonic() - sent


def two_nodes(case: Case, run: CaseRun) -> None:
    """Nodes a (hosts the store) and b start together; ``case.extra['b_plan']`` is b's fault."""
    port = free_port()
    dirs = {name: run.dir / name for name in ("a", "b")}
    launchers = {}
    for name in ("a", "b"):
        dirs[name].mkdir()
        host = "true" if name == "a" else "false"
        plans = [arg for plan in case.extra.get(f"{name}_plan", ()) for arg in ("--plan", plan)]
        launchers[name] = run.launch(
            rendezvous_args(case, run, name, port, "1:2", 1) + ["--rdzv-conf", f"{TWO_NODE_RDZV},is_host={host}"]
            + case.worker_args(run, dirs[name]) + plans, name=name)
    a, b = launchers["a"], launchers["b"]
    run.wait_for(lambda: a.events("cycle_start") and b.events("cycle_start"), 60, "both nodes to start workers")
    sizes = [launcher.events("cycle_start")[0]["group_world_size"] for launcher in (a, b)]
    assert sizes == [2, 2], f"the nodes did not form one two-node group: {sizes}"
    if case.extra.get("kill_b"):
        run.wait_for(lambda: list(dirs["a"].glob("cycle0_rank*.group.json"))
                     and list(dirs["b"].glob("cycle0_rank*.group.json")), 60, "the two-node gloo group")
        b.proc.kill()
        b.finish(10)
    else:
        b.finish(case.budget)
    run.info["b_gone_at"] = time.monotonic()
    a.finish(case.budget)
    run.info["a_done_at"] = time.monotonic()


def port_taken(case: Case, run: CaseRun) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        if case.extra["listen"]:
            holder.listen()  # another program serves this port
        port = holder.getsockname()[1]
        started = time.monotonic()
        launcher = run.launch(rendezvous_args(case, run, "a", port, "1", 2) + ["--warm-preload="]
                              + case.worker_args(run))
        launcher.finish(case.budget)
        run.info["took_s"] = time.monotonic() - started
        run.info["port"] = port


# ---------------------------------------------------------------------------- checks


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X")


def sigcont_then_sigterm(run: CaseRun, failure: dict) -> None:
    # SIGTERM to a stopped process stays pending; the monitor's SIGCONT made it land.
    assert failure["signal"] == "SIGTERM" and failure["exit_code"] == -signal.SIGTERM, failure


def gil_held(run: CaseRun, failure: dict) -> None:
    fault = run.record(failure["cycle"], failure["rank"], ".fault")
    assert fault["thread_heartbeats"] >= 5, "the heartbeat thread never ran"
    assert failure["exit_code"] == -signal.SIGKILL, failure


def children_gone(run: CaseRun, failure: dict) -> None:
    children = run.record(failure["cycle"], failure["rank"], ".fault")["children"]
    assert len(children) == 3
    assert not [pid for pid in children if alive(pid)]
    daemon = children[-1]  # left the process group and the session: only the sweep finds it
    swept = [pid for event in run.launchers["a"].events("leftovers_killed") for pid in event["pids"]]
    assert daemon in swept, swept


def no_restarts_left(run: CaseRun, failure: dict) -> None:
    assert failure["decision"] == "no restarts left (--max-restarts=2); stopping", failure


def step_timeout(run: CaseRun, failure: dict) -> None:
    assert failure["timeout"] == 1.0 and failure["decision"] == "restarting the worker group (restart 1/2)", failure


def cause_is_in_stderr(run: CaseRun, failure: dict) -> None:
    assert "No module named 'ft_faults_no_such_module'" in run.launchers["a"].log()
    assert run.record(failure["cycle"], failure["rank"]) is None  # it never got as far as its monitor
    ready = [e["cycle"] for e in run.launchers["a"].events("workers_ready")]
    assert failure["cycle"] not in ready, ready


def check_collective(case: Case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    assert run.record(0, 1, ".waiting"), "rank 1 never entered the collective"
    failures = [f for f in launcher.events("failure") if f["cycle"] == 0]
    root = failures[0]
    # the rank's own exception is recorded without @record too (the client's error recording)
    assert (root["rank"], root["cause_kind"], root["cause"]) == (
        0, "exit", "exit code 1: RuntimeError: injected failure in rank 0 while its peers wait in all_reduce"), failures
    # The peer was stopped by the launcher, or failed on its own with gloo's error first.
    assert [(f["rank"], f["cause_kind"] in ("terminated", "exit")) for f in failures[1:]] == [(1, True)], failures
    # The peer stuck in all_reduce did not hold the restart up (torch would wait 30 s for it).
    restart = launcher.events("cycle_start")[1]
    assert restart["since_failure_s"] < 10, restart


def check_error_recorded(case: Case, run: CaseRun) -> None:
    root = run.launchers["a"].events("failure")[0]
    assert "injected failure in rank 0" in root.get("error", ""), root


def check_monitor_killed(case: Case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    died = launcher.events("monitor_died")
    assert [(e["cycle"], e["local_rank"]) for e in died] == [(0, 0)]
    replaced = launcher.events("monitor_replaced")
    assert [(e["cycle"], e["local_rank"]) for e in replaced] == [(1, 0)]
    # Training went on without the monitor: rank 0 finished cycle 0 and noticed the loss.
    assert run.record(0, 0, ".done")["monitor_lost"] is True
    assert "hang detection is off for this rank, training continues" in launcher.log()
    # The replacement watches rank 0 in cycle 1: it caught rank 0's hang (a root above).
    assert not alive(run.info["monitor"])


def check_sigterm(case: Case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    # rank 1 ignores SIGTERM: it gets SIGKILL after --term-timeout (1.9 s), not torch's 30 s, and
    # not after 1 s either (torch's own stop path takes whole seconds; ours keeps the fraction).
    assert 1.9 <= run.info["stop_s"] < 15.0, run.info
    assert "received SIGTERM" in launcher.log()
    for rank in (0, 1):
        assert not alive(run.record(0, rank)["pid"])


def check_sigint(case: Case, run: CaseRun) -> None:
    assert run.info["stop_s"] < 15.0, run.info
    assert "received SIGINT" in run.launchers["a"].log()


def check_sigkill(case: Case, run: CaseRun) -> None:
    # The monitors notice the launcher's death at once, stop the workers, remove the run dir.
    assert run.info["gone_s"] <= 5.0, run.info
    assert not run.launchers["a"].events("result")


def check_rendezvous_sigterm(case: Case, run: CaseRun) -> None:
    assert run.info["stop_s"] < 10.0, run.info
    assert not run.launchers["a"].events("cycle_start")


def check_exhausted(case: Case, run: CaseRun) -> None:
    assert ("summary: 3 cycles; 3 incidents: 2 × crash (exit code 1), 1 × hang (section 'step')"
            in run.launchers["a"].log())


def check_node_killed(case: Case, run: CaseRun) -> None:
    a, b = run.launchers["a"], run.launchers["b"]
    assert b.code == -signal.SIGKILL
    cycles = a.events("cycle_start")
    assert [c["group_world_size"] for c in cycles] == [2, 1]  # node a went on alone
    # Node a noticed, waited for b's keep-alive to lapse, and finished alone within a bound.
    assert run.info["a_done_at"] - run.info["b_gone_at"] < 30, run.info
    roots = [f for f in a.events("failure") if f["cause_kind"] != "terminated"]
    # node a's rank fails with gloo's error about its lost peer (its text is recorded without
    # @record, unless the rank is stopped before it gets that far)
    assert [(f["cycle"], f["cause"].split(": ")[0]) for f in roots] == [(0, "exit code 1")], roots


def check_node_excluded(case: Case, run: CaseRun) -> None:
    a, b = run.launchers["a"], run.launchers["b"]
    assert b.code == 65, b.log()[-3000:]
    assert [e["action"] for e in b.events("control_request")] == ["ExcludeThisNode"]
    assert b.events("result")[-1]["outcome"] == "node_excluded"
    assert len(b.events("cycle_start")) == 1
    assert [c["group_world_size"] for c in a.events("cycle_start")] == [2, 1]
    assert run.info["a_done_at"] - run.info["b_gone_at"] < 30, run.info


def check_warm_control_request(case: Case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    cycles = launcher.events("cycle_start")
    assert cycles[1]["warm_start"] is True  # forked by the template: torch knows only its trampoline
    requests = launcher.events("control_request")
    assert [(r["action"], r["cycle"], r["rank"]) for r in requests] == [("ShutdownWorkload", 1, 0)]
    assert "not a worker of this launcher" not in launcher.log()
    first = launcher.events("failure")[0]
    assert (first["cycle"], first["rank"], first["cause"]) == (0, 1, "exit code 1")


def check_usage_error(case: Case, run: CaseRun) -> None:
    log = run.launchers["a"].log()
    assert "Traceback" not in log
    assert "--rdzv-conf" in log and "last_call_timeout" in log and "0.5" in log


def check_port_taken(case: Case, run: CaseRun) -> None:
    log = run.launchers["a"].log()
    assert "Traceback" not in log
    assert "rendezvous failed" in log and str(run.info["port"]) in log
    assert run.info["took_s"] < case.budget


# ---------------------------------------------------------------------------- the table

CASES = [
    # --- hangs: the monitor notices, says why, and the group restarts
    Case("heartbeat-hangs-in-consecutive-cycles",
         ("0:1:hang_before_hb", "1:0:hang_between_hb", "2:1:gil", "3:0:children_hang"),
         HB + ("--max-restarts", "4"), cycles=5, roots=(
             hang(0, 1, "initial_heartbeat", id="hang-before-first-heartbeat"),
             hang(1, 0, "heartbeat", id="hang-between-heartbeats"),
             # a heartbeat thread cannot help while the main thread holds the GIL in C code
             hang(2, 1, "heartbeat", id="hang-in-c-call-holding-the-gil", check=gil_held),
             # data-loader-like children go too, even one that left its group and session
             hang(3, 0, "heartbeat", id="hang-with-children", check=children_gone))),
    Case("section-hangs-in-consecutive-cycles",
         ("0:1:hang_in_setup", "1:0:hang_in_checkpointing", "2:1:hang_out_of_section"),
         SECTIONS + ("--ft-param-rank_out_of_section_timeout", "1", "--max-restarts", "3"), ("--sections",),
         cycles=4, roots=(
             hang(0, 1, "section", "setup", id="hang-in-section-setup"),
             hang(1, 0, "section", "checkpointing", id="hang-in-section-checkpointing"),
             hang(2, 1, "out_of_section", id="hang-out-of-section"))),
    Case("hang-sigstop", ("0:0:sigstop",), HB + ("--ft-param-rank_termination_signal", "SIGTERM"), cycles=2,
         roots=(hang(0, 0, "heartbeat", check=sigcont_then_sigterm),)),
    # --- crashes: the cause is the exit code or the signal
    Case("crashes-in-consecutive-cycles", ("0:0:exit1", "1:1:os_exit3", "2:0:sigsegv", "3:1:sigkill"),
         ("--max-restarts", "4"), cycles=5, roots=(
             Root(0, 0, "exit", "exit code 1", id="crash-exit-1"),
             Root(1, 1, "exit", "exit code 3", id="crash-os-exit-3"),
             Root(2, 0, "signal", "signal SIGSEGV", id="crash-sigsegv"),
             Root(3, 1, "signal", "signal SIGKILL", id="crash-sigkill"))),
    Case("crash-while-peer-waits-in-gloo-collective", ("0:0:raise_in_collective",),
         ("--warm-preload", "torch,torch.distributed"), ("--gloo",), cycles=2,
         roots=None, check=check_collective, budget=90),
    Case("crash-in-a-worker-using-torch-record", ("0:0:raise",), ("--warm-preload", "torch,torch.distributed"),
         ("--record-errors",), cycles=2, roots=(Root(0, 0, "exit", "exit code 1"),), check=check_error_recorded),
    # --- the monitor dies: training goes on, the launcher records it and replaces the monitor
    Case("monitor-sigkilled", ("0:1:exit1_after_peer_done", "1:0:hang_between_hb"),
         HB + ("--ft-param-initial_rank_heartbeat_timeout", "10", "--max-restarts", "2"), ("--steps-cycle0", "40"),
         cycles=3, roots=(Root(0, 1, "exit", "exit code 1"), hang(1, 0, "heartbeat")),
         drive=kill_monitor, check=check_monitor_killed),
    # --- the launcher is stopped
    # (a stop by signal exits 0 only if every worker exited 0 within --term-timeout)
    Case("launcher-sigterm", ("*:1:ignore_sigterm",), ("--term-timeout", "1.9"), ("--steps", "600"),
         exit_code=1, outcome="signal SIGTERM", cycles=1,
         drive=partial(signal_when_running, signal.SIGTERM), check=check_sigterm),
    Case("launcher-sigint", (), ("--term-timeout", "1"), ("--steps", "600"),  # KeyboardInterrupt: exit 1
         exit_code=1, outcome="signal SIGINT", cycles=1,
         drive=partial(signal_when_running, signal.SIGINT), check=check_sigint),
    Case("launcher-sigkill", (), (), ("--steps", "600"), exit_code=-signal.SIGKILL, outcome=None,
         drive=kill_launcher, check=check_sigkill),
    Case("launcher-sigterm-during-rendezvous", (), ("--term-timeout", "1", "--warm-preload="),
         exit_code=0, outcome="signal SIGTERM", cycles=0,  # no worker ran: none failed
         drive=sigterm_in_rendezvous, check=check_rendezvous_sigterm),
    # --- restarts
    Case("restarts-exhausted", ("0:0:hang_in_step", "1:1:exit1", "2:1:exit1"), SECTIONS + ("--max-restarts", "2"),
         ("--sections",),
         exit_code=1, outcome="failed", cycles=3, check=check_exhausted, roots=(
             hang(0, 0, "section", "step", id="hang-in-section-step", check=step_timeout),
             Root(1, 1, "exit", "exit code 1"),
             Root(2, 1, "exit", "exit code 1", check=no_restarts_left))),
    Case("failure-during-the-restart", ("0:0:raise", "1:1:import_error"), ("--max-restarts", "2"), cycles=3,
         roots=(Root(0, 0, "exit", "exit code 1"), Root(1, 1, "exit", "exit code 1", check=cause_is_in_stderr))),
    # --- workload control still works after a (warm) restart
    Case("workload-control-after-a-warm-restart", ("0:1:exit1_once_warm", "1:0:shutdown_workload"),
         ("--max-restarts", "3"),
         exit_code=64, outcome="shutdown_requested", cycles=2, roots=None, check=check_warm_control_request),
    # --- two launchers on 127.0.0.1 acting as two nodes (a hosts the rendezvous store)
    Case("two-nodes-one-sigkilled", (), ("--max-restarts", "1", "--warm-preload="),
         ("--gloo", "--steps", "4", "--steps-cycle0", "400"), cycles=2,
         roots=None, drive=two_nodes, check=check_node_killed, extra={"kill_b": True}, budget=90),
    Case("two-nodes-one-excluded", (), ("--max-restarts", "1", "--warm-preload", "torch,torch.distributed"),
         ("--gloo", "--steps", "4", "--steps-cycle0", "400"), cycles=2,
         roots=None, drive=two_nodes, check=check_node_excluded, extra={"b_plan": ("0:*:exclude_node",)}, budget=90),
    Case("rdzv-conf-bad-value", (), ("--rdzv-conf", "last_call_timeout=0.5"), exit_code=2, outcome=None, cycles=0,
         check=check_usage_error),
    Case("rendezvous-port-taken-not-listening", (), ("--rdzv-conf", "read_timeout=3,join_timeout=5"),
         exit_code=1, outcome="rendezvous failed", cycles=0, drive=port_taken, check=check_port_taken,
         extra={"listen": False}, budget=30),
    Case("rendezvous-port-taken-by-another-program", (), ("--rdzv-conf", "read_timeout=3,join_timeout=5"),
         exit_code=1, outcome="rendezvous failed", cycles=0, drive=port_taken, check=check_port_taken,
         extra={"listen": True}, budget=25),
]

# --- signals as SLURM sends them (tests/faults/signal_cases.py): to every process of the step
# ("job"), or to the launcher alone; each worker's handler must run once per signal sent, warm or
# cold, and every helper must survive. Two ranks, --max-restarts 1.
SIG = signal.Signals
NO_WARM = ("--no-warm-restarts",)
STOP_2S = ("--stop-delay", "2")  # a checkpoint-like SIGTERM handler


def signal_case(id: str, delivery: str, signals: tuple, stop: SIG, launcher: tuple = (), worker: tuple = (),
                check: Callable = sc.check_signal_run, **extra) -> Case:
    return Case(id, (), ("--term-timeout", "10", *launcher), ("--crash-ranks", "0,1", *worker), cycles=2,
                roots=None, outcome=f"signal {stop.name}", drive=sc.signal_run, check=check, script=sc.SIGNAL_WORKER,
                extra={"delivery": delivery, "signals": signals, "stop": stop, "restart": True, **extra})


CASES += [
    signal_case("job-wide-usr1-usr2-hup-warm", "job", (SIG.SIGUSR1, SIG.SIGUSR2), SIG.SIGHUP),
    signal_case("job-wide-usr1-usr2-int-cold", "job", (SIG.SIGUSR1, SIG.SIGUSR2), SIG.SIGINT, NO_WARM,
                order="workers-first"),
    signal_case("job-wide-sigterm-warm-gets-the-term-timeout", "job", (), SIG.SIGTERM, (), STOP_2S,
                check=sc.check_term_timeout),
    signal_case("job-wide-sigterm-cold-gets-the-term-timeout", "job", (), SIG.SIGTERM, NO_WARM, STOP_2S,
                check=sc.check_term_timeout, order="workers-first"),
    signal_case("launcher-only-usr1-usr2-term-warm", "launcher", (SIG.SIGUSR1, SIG.SIGUSR2), SIG.SIGTERM),
    signal_case("launcher-only-usr1-usr2-term-cold", "launcher", (SIG.SIGUSR1, SIG.SIGUSR2), SIG.SIGTERM, NO_WARM),
    Case("signal-during-a-warm-restart-is-queued", (), ("--term-timeout", "10"),
         ("--crash-ranks", "1", "--stop-delay", "1"),
         cycles=2, roots=None, outcome="signal SIGTERM", drive=sc.signal_during_restart, check=sc.check_queued,
         script=sc.SIGNAL_WORKER, extra={"delivery": "launcher"}),
    Case("job-wide-signal-during-a-cold-restart-is-queued", (), ("--term-timeout", "10", *NO_WARM),
         ("--crash-ranks", "1", "--stop-delay", "1"), cycles=2, roots=None, outcome="signal SIGTERM",
         drive=sc.signal_during_restart, check=sc.check_queued, script=sc.SIGNAL_WORKER, extra={"delivery": "job"}),
    Case("second-stop-signal-during-clean-up", (), ("--term-timeout", "10",), ("--stop-delay", "0.5",), cycles=1,
         roots=None, outcome="signal SIGTERM", drive=sc.repeated_stop_signals, check=sc.check_second_signal,
         script=sc.SIGNAL_WORKER, extra={"more": (SIG.SIGINT,)}, budget=90),
    Case("third-stop-signal-forces-the-stop", (), ("--term-timeout", "10",), ("--stop-delay", "0.5",), cycles=1,
         exit_code=128 + signal.SIGTERM, outcome=None, roots=None, drive=sc.repeated_stop_signals,
         check=sc.check_forced, script=sc.SIGNAL_WORKER, extra={"more": (SIG.SIGINT, SIG.SIGTERM)}, budget=90),
    Case("launcher-sigkill-workers-daemons-go-too", (), (), ("--spawn-daemon",), exit_code=-signal.SIGKILL,
         outcome=None, roots=None, drive=sc.launcher_sigkilled, check=sc.check_daemons_gone, script=sc.SIGNAL_WORKER),
    Case("warm-workers-are-found-and-signalled-by-their-own-pid", (), ("--term-timeout", "10"), ("--crash-ranks", "0",),
         exit_code=1, outcome="failed", cycles=2, roots=None, drive=sc.findable_workers, check=sc.check_findable,
         script=sc.SIGNAL_WORKER, extra={"restart": True}),
]
# Rough wall times on a quiet 2-core machine: the longest start first.
ESTIMATES = {"two-nodes-one-sigkilled": 30, "two-nodes-one-excluded": 30,
             "rendezvous-port-taken-by-another-program": 25, "heartbeat-hangs-in-consecutive-cycles": 16,
             "monitor-sigkilled": 15, "crashes-in-consecutive-cycles": 14, "section-hangs-in-consecutive-cycles": 14,
             "crash-while-peer-waits-in-gloo-collective": 14, "failure-during-the-restart": 12,
             "restarts-exhausted": 12}


def _params() -> list:
    params = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        params.append(pytest.param(case, None, id=case.id, marks=marks))
        for root in case.roots or ():
            if root.id is not None:
                params.append(pytest.param(case, root, id=root.id, marks=marks))
    return params


@pytest.fixture(scope="module")
def matrix(request: pytest.FixtureRequest):
    """Run the selected cases (longest first, concurrently) and hand out their outcomes."""
    wanted = {
        item.callspec.params["case"].id for item in request.session.items
        if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
    }
    selected = sorted((c for c in CASES if c.id in wanted), key=lambda c: -ESTIMATES.get(c.id, 8))
    base = Path(tempfile.mkdtemp(prefix="ftf-", dir="/tmp"))
    try:
        runs = run_all([(c.id, partial(c.drive or run_to_completion, c)) for c in selected], PARALLEL, base)
        if os.environ.get("FT_FAULTS_VERBOSE"):
            for run in sorted(runs.values(), key=lambda r: -r.wall_s):
                print(f"fault matrix: {run.case_id}: {run.wall_s:.1f} s", file=sys.stderr)
        yield runs
    finally:
        if not os.environ.get("FT_FAULTS_KEEP"):
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(("case", "fault"), _params())
def test_fault(case: Case, fault: Root | None, matrix) -> None:
    """What the whole run must show; with ``fault``, also that one planned fault's own record."""
    run = matrix[case.id]
    assert run.error is None, f"{run.error}\n{run.describe()}"
    launcher = run.launchers["a"]
    assert launcher.code == case.exit_code, run.describe()
    events = launcher.events()
    log = launcher.log()
    if case.outcome is not None:
        result = [e for e in events if e["event"] == "result"]
        assert [(r["outcome"], r["exit_code"]) for r in result] == [(case.outcome, case.exit_code)]
        assert "[ft_launcher] summary:" in log
    roots = [e for e in events if e["event"] == "failure" and e["cause_kind"] != "terminated"]
    if case.roots is not None:
        assert [(f["cycle"], f["rank"], f["cause_kind"]) for f in roots] == [
            (r.cycle, r.rank, r.kind) for r in case.roots], run.describe()
    if case.cycles is not None:
        cycles = [e["cycle"] for e in events if e["event"] == "cycle_start"]
        assert cycles == list(range(case.cycles)), run.describe()
    expected = case.roots or ()
    for failure, root in zip(roots, expected, strict=False):
        if fault is not None and root is not fault:
            continue
        assert root.cause in failure["cause"], failure
        if root.kind == "hang":
            assert (failure["hang_kind"], failure["section"]) == (root.hang_kind, root.section), failure
            assert 0 <= failure["elapsed"] - failure["timeout"] < LATENESS_BOUND, failure
        # one human-readable line per root failure, with the cause
        prefix = f"[ft_launcher] cycle {root.cycle}: rank {root.rank} ("
        lines = [line for line in log.splitlines() if line.startswith(prefix)]
        assert len(lines) == 1 and failure["cause"] in lines[0], lines
        # the cycle's workers are gone
        for rank in (0, 1):
            record = run.record(root.cycle, rank)
            assert record is None or not alive(record["pid"]), record
        if root.check is not None:
            root.check(run, failure)
    if fault is None and case.check is not None:
        case.check(case, run)
    assert not run.leaked_pids, f"processes left running: {run.leaked_pids}"
    assert not run.leaked_files, f"left in the case's TMPDIR: {run.leaked_files}"
