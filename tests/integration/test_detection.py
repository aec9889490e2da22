"""Detection quality with real launchers, monitors and ranks (issues 13.8-13.10, 14.2-14.4).

The culprit, not the victims (a frozen, a killed and a GIL-holding rank in a gloo all-reduce is
the root, its peer collateral, each with a stack file), evidence before the kill (py-spy and the
faulthandler fallback), a hang that ends in exit 0 fails the cycle, escalation when a rank
outlives its termination signal, and a stopped monitor replaced before the next cycle.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ft_core import FaultToleranceConfig
from ft_core.monitor.link import MonitorLink
from ft_core.wire import messages, protocol
from tests.launcher_util import (
    FT_LAUNCHER,
    events_of,
    launcher_env,
    live_descendants,
    read_events,
    run_launcher,
    start_launcher,
    wait_for,
)
from tests.monitor_events import wait_event

CULPRIT = str(Path(__file__).resolve().parent.parent / "workers" / "culprit_worker.py")
HB = ["--ft-param-initial_rank_heartbeat_timeout", "60", "--ft-param-rank_heartbeat_timeout", "2"]

pytestmark = pytest.mark.timeout(180)


def launcher_args(tmp_path: Path, *extra: str, nproc: int = 2) -> list[str]:
    return ["--standalone", "--nproc-per-node", str(nproc), "--monitor-interval", "0.05", "--max-restarts", "1",
            "--ft-event-log", str(tmp_path / "events.jsonl"), *extra]


def worker(tmp_path: Path, *extra: str) -> list[str]:
    return [CULPRIT, "--dir", str(tmp_path), *extra]


def failures_of(tmp_path: Path, cycle: int = 0) -> list[dict]:
    return [f for f in events_of(read_events(tmp_path / "events.jsonl"), "failure") if f["cycle"] == cycle]


def stack_text(failure: dict) -> str:
    assert failure["stack_file"], failure
    path = Path(failure["stack_file"])
    assert path.parent.name == "ft_stacks", path  # Contract 3: next to the event log
    return path.read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lines_starting(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


# ---------------------------------------------------------------------------- root and collateral


def test_a_stopped_rank_in_a_gloo_all_reduce_is_the_root_and_its_peer_collateral(tmp_path):
    result = run_launcher(launcher_args(tmp_path, *HB) + worker(tmp_path, "--fault", "sigstop"), timeout=150)
    assert result.returncode == 0, result.stderr
    root, *others = failures_of(tmp_path)
    assert (root["rank"], root["role"], root["cause_kind"]) == (1, "root", "hang"), root
    assert [(f["rank"], f["role"]) for f in others] == [(0, "collateral")], others
    assert root["step"] == 10 and others[0]["step"] == 11
    assert root["stack_frames"][0].endswith(" freeze_here") and root["user_frame"].endswith(" freeze_here")
    assert others[0]["root_rank"] == 1
    # a stack file for each: where the root froze, where the peer waits
    assert "in freeze_here" in stack_text(root)
    assert "in all_reduce" in stack_text(others[0]) and "torch/distributed" in stack_text(others[0])
    # the launcher's lines say it plainly; torch's own line naming a rank is gone
    root_line, = lines_starting(result.stderr, "[ft_launcher] cycle 0: rank 1 (")
    assert "rank 1 froze (its process was stopped) in step 10" in root_line
    assert "rank 0 stopped waiting for it" in root_line and "freeze_here" in root_line
    peer_line, = lines_starting(result.stderr, "[ft_launcher] cycle 0: rank 0 (")
    assert "stopped waiting for rank 1, blocked at" in peer_line and "all_reduce" in peer_line
    assert "failed (exitcode" not in result.stderr
    # the summary counts one incident, not two failures
    assert "summary: 2 cycles; 1 incident: 1 × hang (heartbeat); 1 rank stopped as collateral" in result.stderr


def test_a_sigkilled_rank_is_the_root(tmp_path):
    result = run_launcher(launcher_args(tmp_path, *HB) + worker(tmp_path, "--fault", "sigkill"), timeout=150)
    assert result.returncode == 0, result.stderr
    root, *others = failures_of(tmp_path)
    assert (root["rank"], root["role"], root["cause"]) == (1, "root", "signal SIGKILL"), root
    assert [f["role"] for f in others] == ["collateral"] and others[0]["rank"] == 0
    root_line, = lines_starting(result.stderr, "[ft_launcher] cycle 0: rank 1 (")
    assert "rank 1 was killed by SIGKILL in step 10" in root_line
    assert "summary: 2 cycles; 1 incident: 1 × crash (signal SIGKILL)" in result.stderr


@pytest.mark.parametrize("py_spy", ["installed", "off"])
def test_a_rank_busy_in_c_holding_the_gil_still_gets_a_stack(tmp_path, py_spy):
    # Without set_step the root is told apart by its stack: its peer waits in a collective.
    env = {"FT_PY_SPY": "off"} if py_spy == "off" else {}
    result = run_launcher(launcher_args(tmp_path, *HB) + worker(tmp_path, "--fault", "gil", "--no-step"),
                          timeout=150, env=env)
    assert result.returncode == 0, result.stderr
    root, peer = failures_of(tmp_path)
    assert (root["rank"], root["role"], peer["role"]) == (1, "root", "collateral"), (root, peer)
    assert root["stack_frames"][0].endswith(" busy_in_c_holding_the_gil"), root
    text = stack_text(root)
    assert "busy_in_c_holding_the_gil" in text
    assert ("captured with faulthandler" if py_spy == "off" else "captured with py-spy") in text


def test_a_crash_is_the_root_and_a_survivor_whose_timeout_fires_in_the_grace_is_collateral(tmp_path):
    # Rank 1 exits 1; rank 0 stops heartbeating at the same step and ignores the launcher's
    # SIGTERM, so its 1 s heartbeat timeout fires during the grace after the crash. Its monitor
    # reports the hang after capturing its stacks (up to the 2 s budget, slower on a loaded
    # machine): a 6 s grace keeps the report inside it.
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-initial_rank_heartbeat_timeout", "60",
                      "--ft-param-rank_heartbeat_timeout", "1", "--workers-stop-timeout", "6")
        + worker(tmp_path, "--fault", "crash", "--no-gloo", "--stall-others"), timeout=150)
    assert result.returncode == 0, result.stderr
    root, peer = failures_of(tmp_path)
    assert (root["rank"], root["role"], root["cause"]) == (1, "root", "exit code 1"), root
    print(result.stderr)  # shown when an assertion fails
    assert (peer["rank"], peer["role"], peer["cause_kind"]) == (0, "collateral", "hang"), peer
    assert root["detected_at"] < peer["detected_at"]
    # "time to restart" counts from the crash, not from the end of the grace
    restart = events_of(read_events(tmp_path / "events.jsonl"), "cycle_start")[1]
    assert restart["since_failure_s"] >= restart["ts"] - root["detected_at"] - 0.3, (restart, root)


def test_across_nodes_the_root_on_the_other_node_is_named_on_both(tmp_path):
    # Two launchers on 127.0.0.1 acting as two nodes; node b's rank freezes in the all-reduce.
    port = free_port()
    nodes = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        fault = ["--fault", "sigstop", "--fault-rank", "-1"] if name == "b" else []
        nodes[name] = start_launcher(
            ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", f"culprit-{port}", "--monitor-interval", "0.05",
             "--rdzv-conf", f"join_timeout=60,last_call_timeout=2,is_host={'true' if name == 'a' else 'false'}",
             "--max-restarts", "1", "--ft-event-log", str(tmp_path / name / "events.jsonl"), *HB,
             CULPRIT, "--dir", str(tmp_path / name), *fault])
    errs = {}
    try:
        for name in ("b", "a"):
            _out, errs[name] = nodes[name].communicate(timeout=150)
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert [nodes[n].returncode for n in ("a", "b")] == [0, 0], errs
    a_failures, b_failures = failures_of(tmp_path / "a"), failures_of(tmp_path / "b")
    root, = b_failures
    peer, = a_failures
    assert (root["role"], root["cause_kind"]) == ("root", "hang"), root
    assert peer["role"] == "collateral", peer
    assert peer["root_rank"] == root["rank"] != peer["rank"], (root, peer)
    b_group = events_of(read_events(tmp_path / "b" / "events.jsonl"), "cycle_start")[0]["group_rank"]
    assert peer["root_group_rank"] == b_group, peer
    # each node's line names the other's rank: the root's lists its collateral, the peer its root
    assert f"rank {peer['rank']} stopped waiting for it" in root["explanation"], root
    assert f"stopped waiting for rank {root['rank']} on node" in peer["explanation"], peer
    assert "in freeze_here" in stack_text(root) and "in all_reduce" in stack_text(peer)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def _freeze_node(launcher: subprocess.Popen) -> list[int]:
    """Stop a launcher and every process of its run (SIGSTOP), as a node that froze or was cut
    off goes silent; returns the pids stopped, the launcher first."""
    os.killpg(launcher.pid, signal.SIGSTOP)  # the launcher first: it must not see its rank stop
    stopped = [launcher.pid, *live_descendants(launcher.pid)]
    for pid in stopped[1:]:
        os.kill(pid, signal.SIGSTOP)
    return stopped


def _end_frozen_node(launcher: subprocess.Popen, stopped: list[int]) -> None:
    """End a frozen node as a dead node's launcher ends: the launcher killed, its helpers
    continued to clean up (SIGKILL for any still there after a bound)."""
    os.kill(launcher.pid, signal.SIGKILL)
    for pid in stopped[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    launcher.communicate(timeout=30)
    try:
        wait_for(lambda: not any(_alive(pid) for pid in stopped[1:]), 30, "the frozen node's processes to end")
    finally:
        for pid in stopped[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_node_gone_silent_is_named_as_the_root_not_a_rank_that_waited_for_it(tmp_path):
    # Two launchers on 127.0.0.1 acting as two nodes (--nnodes 1:2). Once both train, node b goes
    # silent as a cut-off or powered-off node does: its launcher and every process of its run are
    # stopped (SIGSTOP), so its rank no longer joins the all-reduce and its launcher publishes no
    # view. Node a's rank times out in the all-reduce; a names node b as the root, not its own
    # rank, and trains on alone.
    port = free_port()
    host = socket.gethostname()
    nodes = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        nodes[name] = start_launcher(
            ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", f"silent-{port}", "--monitor-interval", "0.05",
             "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2,"
             f"is_host={'true' if name == 'a' else 'false'}",
             "--max-restarts", "1", "--ft-event-log", str(tmp_path / name / "events.jsonl"), *HB,
             CULPRIT, "--dir", str(tmp_path / name), "--steps", "100000", "--later-steps", "20"])
    a, b = nodes["a"], nodes["b"]
    stopped: list[int] = []
    try:
        # both ranks have formed the gloo group and stepped together once
        try:
            wait_for(lambda: all(list((tmp_path / n).glob("cycle0_rank*.json")) for n in nodes), 90,
                     "both ranks training")
        except AssertionError as err:  # what each launcher had done (a spare? a cold or a waiting start?)
            kinds = {n: [e["event"] for e in read_events(tmp_path / n / "events.jsonl")] for n in nodes}
            raise AssertionError(f"{err}: events so far {kinds}") from None
        b_group = events_of(read_events(tmp_path / "b" / "events.jsonl"), "cycle_start")[0]["group_rank"]
        stopped = _freeze_node(b)
        _out, a_err = a.communicate(timeout=150)
    finally:
        _end_frozen_node(b, stopped)
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
            a.communicate()
    assert a.returncode == 0, a_err
    peer, = failures_of(tmp_path / "a")
    assert (peer["role"], peer["cause_kind"], peer["root_rank"]) == ("collateral", "hang", None), peer
    assert (peer["root_node"], peer["root_group_rank"], peer["root_outcome"]) == (host, b_group, "lost"), peer
    assert peer["lost_nodes"] == [{"group_rank": b_group, "node": host}], peer
    assert peer["root_cause"] == (f"node {host} (group rank {b_group}) sent no report within 2.0 s: lost or cut off "
                                  "from the rendezvous store; every rank that reported was waiting in a collective")
    assert peer["explanation"].startswith(f"stopped waiting for node {host} (group rank {b_group}), which sent no "
                                          "report (lost or cut off), blocked at "), peer
    assert "all_reduce" in peer["explanation"], peer
    line, = lines_starting(a_err, f"[ft_launcher] cycle 0: rank {peer['rank']} (")
    assert f"stopped waiting for node {host} (group rank {b_group})" in line, line
    assert "1 incident: 1 × lost node" in a_err, a_err
    # and node a went on alone
    assert [c["group_world_size"] for c in events_of(read_events(tmp_path / "a" / "events.jsonl"),
                                                     "cycle_start")] == [2, 1]


def test_a_node_dropped_while_a_spare_waits_is_named_as_the_root_of_the_survivors_restart(tmp_path):
    # As above, with a spare waiting and timeouts far longer than torch's keep-alive: node b
    # freezes, node a's rank blocks in the all-reduce with no error and no timeout yet, torch
    # drops b from the round (its keep-alive lapsed) and restarts a's workers for the spare
    # (rule 6 of launcher.decision.culprit). Node a must still name b as the root: before rule 6
    # it wrote only a restart record, and the report had no root cause.
    port = free_port()
    host = socket.gethostname()
    slow_hb = ["--ft-param-initial_rank_heartbeat_timeout", "120", "--ft-param-rank_heartbeat_timeout", "120"]
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, *steps: str) -> None:
        (tmp_path / name).mkdir()
        args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{port}", "--rdzv-id", f"dropped-{port}", "--monitor-interval", "0.05",
                "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2,"
                f"is_host={'true' if name == 'a' else 'false'}",
                "--max-restarts", "1", "--ft-event-log", str(tmp_path / name / "events.jsonl"), *slow_hb,
                CULPRIT, "--dir", str(tmp_path / name), *steps]
        with open(tmp_path / f"{name}.err", "w") as err:  # read while it runs
            procs[name] = subprocess.Popen(FT_LAUNCHER + args, env=launcher_env(), stdout=subprocess.DEVNULL,
                                           stderr=err, text=True, start_new_session=True)

    start("a", "--steps", "100000", "--later-steps", "20")
    start("b", "--steps", "100000", "--later-steps", "20")
    stopped: list[int] = []
    try:
        wait_for(lambda: all(list((tmp_path / n).glob("cycle0_rank*.json")) for n in ("a", "b")), 90,
                 "both ranks training")
        start("spare", "--steps", "20")  # its own first cycle trains as many steps as a's next one
        # torch keeps a node that finds the round full on its redundancy list; after 10 s there
        # its launcher starts its warm template and says so
        spare_log = tmp_path / "spare" / "events.jsonl"
        wait_for(lambda: spare_log.exists() and events_of(read_events(spare_log), "warm_template_started"), 60,
                 "the spare waiting in the rendezvous")
        b_group = events_of(read_events(tmp_path / "b" / "events.jsonl"), "cycle_start")[0]["group_rank"]
        stopped = _freeze_node(procs["b"])
        for name in ("a", "spare"):
            procs[name].wait(timeout=150)
    finally:
        if stopped:
            _end_frozen_node(procs["b"], stopped)
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    a_err = (tmp_path / "a.err").read_text()
    assert (procs["a"].returncode, procs["spare"].returncode) == (0, 0), a_err[-4000:]
    a_events = read_events(tmp_path / "a" / "events.jsonl")
    peer, = failures_of(tmp_path / "a")
    assert (peer["role"], peer["cause_kind"], peer["cause"]) == (
        "collateral", "terminated", "stopped: a node of its round was dropped from the rendezvous"), peer
    assert (peer["root_node"], peer["root_group_rank"], peer["root_outcome"]) == (host, b_group, "lost"), peer
    assert peer["root_cause"].endswith("the rendezvous dropped it from the round (its launcher's keep-alive "
                                       "lapsed) while every rank that reported was still running"), peer
    line, = lines_starting(a_err, f"[ft_launcher] cycle 0: rank {peer['rank']} (")
    assert f"stopped waiting for node {host} (group rank {b_group})" in line, line
    assert line.endswith("; restarting the worker group with the node(s) waiting in the rendezvous (torch's restart "
                         "for a new membership; not counted against --max-restarts)"), line
    assert "1 incident: 1 × lost node" in a_err, a_err[-3000:]
    assert [r["reason"] for r in events_of(a_events, "restart")] == ["another node entered the rendezvous"]
    # the spare took b's place: a's second cycle is a round of two again, and the spare trained in it
    assert [c["group_world_size"] for c in events_of(a_events, "cycle_start")] == [2, 2]
    assert list((tmp_path / "spare").glob("cycle0_rank*.json"))


# ---------------------------------------------------------------------------- hang then exit 0, escalation


def test_a_hang_followed_by_exit_0_fails_the_cycle_and_restarts(tmp_path):
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-rank_termination_signal", "SIGTERM", *HB)
        + worker(tmp_path, "--fault", "hang", "--no-gloo", "--term-handler", "exit0", "--steps", "400"),
        timeout=150)
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    root = failures_of(tmp_path)[0]
    assert (root["rank"], root["cause_kind"], root["exit_code"], root["role"]) == (1, "hang", 0, "root"), root
    assert root["decision"] == "restarting the worker group (restart 1/1)"
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
    assert events_of(events, "result")[-1]["outcome"] == "succeeded"


def test_a_rank_that_outlives_its_termination_signal_gets_sigkill(tmp_path):
    result = run_launcher(
        launcher_args(tmp_path, "--ft-param-rank_termination_signal", "SIGTERM",
                      "--ft-param-rank_termination_grace", "1", *HB)
        + worker(tmp_path, "--fault", "hang", "--no-gloo", "--term-handler", "return", "--steps", "400"),
        timeout=150)
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    escalated, = events_of(events, "rank_escalated")
    assert (escalated["cycle"], escalated["rank"], escalated["signal"], escalated["after"]) == (0, 1, "SIGKILL", 1.0)
    root = failures_of(tmp_path)[0]
    assert (root["rank"], root["exit_code"]) == (1, -signal.SIGKILL), root
    assert "SIGTERM handler (return)" in result.stdout + result.stderr
    assert "1 hung rank needed SIGKILL" in result.stderr


def test_the_monitor_escalates_on_its_own_and_reports_it(start_monitor, spawn_rank):
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=0.5, rank_termination_signal="SIGTERM",
                               rank_termination_grace=0.5, stack_capture_budget=0)
    _handle, path = start_monitor(cfg)
    link = MonitorLink(path)
    try:
        rank = spawn_rank([["on_term", "return"], ["init"], ["sleep", 60]], path)
        hang = wait_event(link, protocol.MSG_RANK_HANG)
        escalated = wait_event(link, protocol.MSG_RANK_ESCALATED)
        assert rank.wait(20) == -signal.SIGKILL
        assert rank.next_event("sigterm")  # the handler ran and returned
        assert (escalated["pid"], escalated["signal"], escalated["after"]) == (rank.proc.pid, "SIGKILL", 0.5)
        assert escalated["rank"] == 0 and hang["stack_error"].startswith("stack capture is off")
    finally:
        link.close()


@pytest.mark.parametrize("value", ["SIGSTOP", "STOP", "19", "SIGCONT", "SIGCHLD", "SIGTSTP", "SIGWINCH"])
def test_signals_that_cannot_end_a_rank_are_refused(tmp_path, value):
    result = run_launcher(launcher_args(tmp_path, "--ft-param-rank_termination_signal", value)
                          + worker(tmp_path), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "rank_termination_signal" in result.stderr and "cannot end a hung rank" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------- an unresponsive monitor


def test_a_stopped_monitor_is_replaced_before_the_next_cycle(tmp_path):
    proc = start_launcher(launcher_args(tmp_path, *HB)
                          + worker(tmp_path, "--no-gloo", "--fault", "crash", "--fault-step", "60", "--steps", "100"))
    try:
        wait_for(lambda: (tmp_path / "cycle0_rank0.json").exists(), 60, "cycle 0 to start")
        monitor = events_of(read_events(tmp_path / "events.jsonl"), "monitors_started")[0]["monitor_pids"][0]
        os.kill(monitor, signal.SIGSTOP)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err
    events = read_events(tmp_path / "events.jsonl")
    unresponsive, = events_of(events, "monitor_unresponsive")
    assert (unresponsive["cycle"], unresponsive["local_rank"], unresponsive["monitor_pid"]) == (1, 0, monitor)
    assert [(e["cycle"], e["reason"]) for e in events_of(events, "monitor_replaced")] == [(1, "unresponsive")]
    assert not os.path.exists(f"/proc/{monitor}")  # killed (and reaped)
    # cycle 1's rank 0 connected to the new monitor: no handshake failure, no extra restart
    assert [f["cycle"] for f in events_of(events, "failure") if f["role"] == "root"] == [0]
    assert events_of(events, "workers_ready")[-1]["cycle"] == 1


def test_a_rank_whose_monitor_does_not_answer_goes_on_unwatched(start_monitor, spawn_rank):
    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 30})
    handle, path = start_monitor(cfg)
    os.kill(handle.pid, signal.SIGSTOP)
    try:
        rank = spawn_rank(
            [["init"], ["step", 1], ["start", "step"], ["hb", 3, 0.01], ["end", "step"], ["calc_hb"],
             ["calc_sections", ["step"], False], ["shutdown"]],
            path, env={"FT_RANK_CONFIG": json.dumps(cfg.sent_to("rank"))})
        assert rank.wait(40) == 0, rank.stderr()
        stderr = rank.stderr()
        assert stderr.count("did not answer the handshake") == 1, stderr
        assert "hang detection is off for this rank, training continues" in stderr
    finally:
        os.kill(handle.pid, signal.SIGCONT)


def test_without_the_launchers_config_a_mute_monitor_is_still_an_error(start_monitor, spawn_rank):
    handle, path = start_monitor(FaultToleranceConfig())
    os.kill(handle.pid, signal.SIGSTOP)
    try:
        rank = spawn_rank([["init"]], path)
        assert rank.wait(40) == 1
        assert "handshake with the rank monitor" in rank.stderr()
    finally:
        os.kill(handle.pid, signal.SIGCONT)


def test_progress_report_and_stacks_on_request(start_monitor, spawn_rank, tmp_path):
    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 30})
    _handle, path = start_monitor(cfg)
    link = MonitorLink(path)
    try:
        assert link.send({"type": protocol.MSG_PROGRESS_QUERY})
        empty = wait_event(link, protocol.MSG_PROGRESS_REPORT)
        assert (empty["connected"], empty["progress"]) == (False, None)
        rank = spawn_rank([["init"], ["step", 61], ["start", "step"], ["hb", 2, 0.01], ["sleep", 60]], path)
        rank.next_event("sleep")
        link.send({"type": protocol.MSG_PROGRESS_QUERY})
        report = wait_event(link, protocol.MSG_PROGRESS_REPORT)
        assert (report["connected"], report["rank"], report["pid"]) == (True, 0, rank.proc.pid)
        progress = report["progress"]
        assert (progress["step"], progress["open_section"], progress["heartbeats"]) == (61, "step", 2)
        assert progress["section_since"] <= progress["last_progress_at"] <= time.time()
        link.send({"type": protocol.MSG_CAPTURE_STACKS, "reason": "test"})
        captured = wait_event(link, protocol.MSG_STACKS_CAPTURED)
        assert captured["stack_error"] is None and captured["stack_file"] is None  # no --stacks-dir
        assert any(frame.endswith(" main") for frame in captured["stack_frames"]), captured
        rank.kill()
        wait_for(lambda: _disconnected(link), 10, "the monitor to see the rank gone")
    finally:
        link.close()


def _disconnected(link: MonitorLink) -> bool:
    link.send({"type": protocol.MSG_PROGRESS_QUERY})
    report = wait_event(link, protocol.MSG_PROGRESS_REPORT)
    return not report["connected"] and report["progress"]["step"] == 61 and report["disconnected_at"] > 0


def test_ping_is_answered(start_monitor):
    _handle, path = start_monitor(FaultToleranceConfig())
    link = MonitorLink(path)
    try:
        assert link.send(messages.Ping())
        assert messages.decode(wait_event(link, protocol.MSG_PONG, 10)) == messages.Pong()
    finally:
        link.close()
