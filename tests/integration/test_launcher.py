"""Real ft_launcher runs on one node: a full restart, configuration, control requests, SIGUSR1.

Every kind of hang, crash and stop (signals, a dead monitor, exhausted restarts, leftovers) is in
the fault matrix, tests/faults/test_fault_matrix.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

from tests.launcher_util import (
    WORKER,
    events_of,
    read_events,
    records,
    run_launcher,
    start_launcher,
    wait_for,
)


def base_args(tmp_path: Path, *extra: str, nproc: int = 2) -> list[str]:
    return ["--standalone", "--nproc-per-node", str(nproc), "--monitor-interval", "0.05",
            "--ft-event-log", str(tmp_path / "events.jsonl"), *extra]


def worker_args(tmp_path: Path, *extra: str) -> list[str]:
    return [WORKER, "--record-dir", str(tmp_path), *extra]


def test_hang_is_detected_and_the_group_restarts_to_success(tmp_path):
    flag = tmp_path / "finished.flag"
    result = run_launcher(
        base_args(tmp_path, "--max-restarts", "2", "--ft-param-initial_rank_heartbeat_timeout", "20",
                  "--ft-param-rank_heartbeat_timeout", "1")
        + worker_args(tmp_path, "--hang-rank", "1", "--hang-cycle", "0", "--steps", "6"),
        env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)},
    )
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    failures = events_of(events, "failure")
    root = failures[0]
    assert root["cause_kind"] == "hang" and root["hang_kind"] == "heartbeat"
    assert root["rank"] == 1 and root["local_rank"] == 1 and root["cycle"] == 0
    assert root["cause"].startswith("hang: no heartbeat for") and "> timeout 1.00 s" in root["cause"]
    assert root["decision"] == "restarting the worker group (restart 1/2)"
    assert root["exit_code"] == -signal.SIGKILL and root["timeout"] == 1.0
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
    assert events_of(events, "result")[0]["outcome"] == "succeeded"
    # one human line per root failure on stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("[ft_launcher] cycle 0: rank 1")]
    assert len(lines) == 1 and "hang: no heartbeat" in lines[0] and "restart 1/2" in lines[0]
    # the environment each worker got
    recs = records(tmp_path)
    assert set(recs) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    sockets = {recs[(1, r)]["env"]["FT_RANK_MONITOR_IPC_SOCKET"] for r in (0, 1)}
    assert len(sockets) == 2 and all(s.endswith(f"r{r}.sock") for r, s in zip((0, 1), sorted(sockets), strict=True))
    assert recs[(0, 0)]["env"]["FT_RANK_MONITOR_IPC_SOCKET"] == recs[(1, 0)]["env"]["FT_RANK_MONITOR_IPC_SOCKET"]
    assert recs[(1, 1)]["env"]["FAULT_TOL_FINISHED_FLAG_FILE"] == str(flag)
    assert recs[(1, 1)]["env"]["FT_LAUNCHER_IPC_SOCKET"].endswith("launcher.sock")
    assert recs[(1, 1)]["cfg"]["rank_heartbeat_timeout"] == 1.0
    # each cycle's worker sees the same monitor (started once, reused)
    assert len(events_of(events, "monitors_started")) == 1


def test_yaml_and_cli_precedence_reach_the_workers(tmp_path):
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 50\n  safety_factor: 3\n"
                        "  rank_section_timeouts: {step: 9}\n")
    result = run_launcher(
        base_args(tmp_path, "--fault-tol-cfg-path", str(cfg_file), "--ft-rank-heartbeat-timeout", "40", nproc=1)
        + worker_args(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    cfg = records(tmp_path)[(0, 0)]["cfg"]
    assert cfg["rank_heartbeat_timeout"] == 40.0
    assert cfg["safety_factor"] == 3.0
    assert cfg["rank_section_timeouts"] == {"step": 9.0}
    assert cfg["initial_rank_heartbeat_timeout"] == 3600.0


def test_shutdown_workload_stops_without_restart(tmp_path):
    result = run_launcher(
        base_args(tmp_path, "--max-restarts", "5") + worker_args(tmp_path, "--request", "shutdown", "--steps", "200"),
    )
    assert result.returncode == 64, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    assert len(events_of(events, "cycle_start")) == 1
    request = events_of(events, "control_request")[0]
    assert request["action"] == "ShutdownWorkload" and request["rank"] == 0
    assert request["description"] == "test asked for shutdown"
    assert events_of(events, "result")[0]["outcome"] == "shutdown_requested"


def test_exclude_this_node_leaves_with_its_own_exit_code(tmp_path):
    result = run_launcher(
        base_args(tmp_path, "--max-restarts", "5") + worker_args(tmp_path, "--request", "exclude", "--steps", "200"),
    )
    assert result.returncode == 65, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    assert len(events_of(events, "cycle_start")) == 1
    assert events_of(events, "control_request")[0]["action"] == "ExcludeThisNode"


def test_control_socket_refuses_processes_that_are_not_workers(tmp_path):
    # A process of the same user that is not one of the launcher's workers is refused.
    import subprocess
    import sys

    proc = start_launcher(base_args(tmp_path, nproc=1) + worker_args(tmp_path, "--steps", "400"))
    try:
        rec = wait_for(lambda: records(tmp_path).get((0, 0)), 30, "the worker to start")
        code = (
            "import sys\n"
            "from ft_core import RankMonitorClient, WorkloadControlRequest, WorkloadAction, RankMonitorClientError\n"
            "try:\n"
            "    RankMonitorClient().send_workload_control_request(\n"
            "        WorkloadControlRequest(WorkloadAction.ShutdownWorkload, 'x'))\n"
            "except RankMonitorClientError as err:\n"
            "    print(err)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "FT_LAUNCHER_IPC_SOCKET": rec["env"]["FT_LAUNCHER_IPC_SOCKET"]})
        assert "not a worker of this launcher" in out.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 1  # stopped by SIGTERM; the worker (no handler) died of it: not a clean stop
    assert not events_of(read_events(tmp_path / "events.jsonl"), "control_request")


def test_sigusr1_is_forwarded_to_workers(tmp_path):
    proc = start_launcher(base_args(tmp_path) + worker_args(tmp_path, "--steps", "2", "--wait-for-signal"))
    wait_for(lambda: len(records(tmp_path)) == 2, 30, "both workers")
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    for rank in (0, 1):
        assert json.loads((tmp_path / f"usr1_rank{rank}.json").read_text()), f"rank {rank} got no SIGUSR1"
    assert events_of(read_events(tmp_path / "events.jsonl"), "signal_forwarded")[0]["signal"] == "SIGUSR1"


def _result_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_result_file_names_this_node_when_its_rank_crashed_the_run(tmp_path):
    # scripts/autoresume.sh reads this file to keep the root's node out of the next allocation.
    result_path = tmp_path / "result"
    result = run_launcher(
        base_args(tmp_path, "--max-restarts", "1")
        + worker_args(tmp_path, "--crash-rank", "1", "--steps", "50"),
        env={"FT_LAUNCHER_RESULT_FILE": str(result_path)},
    )
    assert result.returncode == 1, result.stderr
    written = _result_file(result_path)
    # the fingerprint: launcher/decision/crash_loop.py
    assert {k: written.pop(k) for k in ("fingerprint", "fingerprint_text")}["fingerprint"]
    assert written == {"exit_code": "1", "outcome": "failed", "root_nodes": socket.gethostname(), "lost_nodes": ""}
    # the workers never see the variable
    assert all("FT_LAUNCHER_RESULT_FILE" not in rec["env"] for rec in records(tmp_path).values())


def test_result_file_names_no_node_after_a_recovered_failure(tmp_path):
    result_path = tmp_path / "result"
    result = run_launcher(
        base_args(tmp_path, "--max-restarts", "1") + worker_args(tmp_path, "--crash-rank", "1", "--crash-cycle", "0"),
        env={"FT_LAUNCHER_RESULT_FILE": str(result_path)},
    )
    assert result.returncode == 0, result.stderr
    written = _result_file(result_path)
    assert written.pop("fingerprint") and written.pop("fingerprint_text")  # the recovered failure's
    assert written == {"exit_code": "0", "outcome": "succeeded", "root_nodes": "", "lost_nodes": ""}


def test_result_file_in_a_missing_directory_is_a_usage_error(tmp_path):
    missing = tmp_path / "no-such-dir" / "result"
    result = run_launcher(base_args(tmp_path) + worker_args(tmp_path),
                          env={"FT_LAUNCHER_RESULT_FILE": str(missing)})
    assert result.returncode == 2, result.stderr
    assert f"FT_LAUNCHER_RESULT_FILE must be in an existing directory, got '{missing}'" in result.stderr


def test_each_rounds_store_port_is_below_the_ephemeral_range(tmp_path):
    # A fresh store per round: rank 0's worker binds MASTER_PORT seconds after the launcher chose it.
    # A port from the kernel's ephemeral range could meanwhile become an outgoing connection's local
    # port (EADDRINUSE, a crash of cycle 0 in CI); launcher/rendezvous/master_port.py picks one below the range.
    from launcher.rendezvous.master_port import LOWEST_PORT, ephemeral_range

    script = tmp_path / "print_port.py"
    script.write_text("import os\nprint('MASTER_PORT', os.environ['MASTER_PORT'], flush=True)\n")
    result = run_launcher(base_args(tmp_path, nproc=1) + [str(script)])
    assert result.returncode == 0, result.stderr
    ports = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("MASTER_PORT ")]
    low, _ = ephemeral_range()
    assert len(ports) == 1 and LOWEST_PORT <= ports[0] < low, (ports, low)


def test_a_worker_error_file_cut_short_is_a_failure_not_a_launcher_traceback(tmp_path):
    # torch's poll json.loads a failed worker's error file; one left empty by a worker killed while
    # writing it ended the launcher with a JSONDecodeError traceback (seen in a loaded .ci/run).
    script = Path(__file__).resolve().parents[1] / "workers" / "broken_error_file.py"
    result = run_launcher(base_args(tmp_path, "--max-restarts", "0") + [str(script)])
    assert result.returncode == 1, result.stderr[-4000:]
    # torch logs the decode error's traceback itself before it re-raises; the launcher goes on
    assert "launcher/cli.py" not in result.stderr and "result: failed (exit code 1)" in result.stderr, \
        result.stderr[-4000:]
    assert "error file" in result.stderr and "is not JSON" in result.stderr, result.stderr[-4000:]
    assert [e["outcome"] for e in events_of(read_events(tmp_path / "events.jsonl"), "result")] == ["failed"]
