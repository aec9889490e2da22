"""Warm restarts: workers forked from a template that already imported torch must look fresh."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.launcher_util import (
    WORKER,
    events_of,
    read_events,
    records,
    run_launcher,
    start_launcher,
)

PROBE = str(Path(__file__).resolve().parent.parent / "workers" / "warm_probe.py")


def probes(path: Path) -> dict[tuple[int, int], dict]:
    found = {}
    for file in path.glob("probe_c*_r*.json"):
        data = json.loads(file.read_text())
        found[(int(file.stem.split("_")[1][1:]), int(data["env_rank"]))] = data
    return found


def test_warm_started_workers_look_like_fresh_interpreters(tmp_path):
    logs = tmp_path / "logs"
    result = run_launcher(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "--log-dir", str(logs), "-r", "3",
         "--ft-event-log", str(tmp_path / "events.jsonl"), PROBE, str(tmp_path), "3", "5", "wait-template"],
        env={"FT_LAUNCHER_WARM_START_DELAY": "0"},  # the probe has no client: start the template at once
    )
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    cycles = events_of(events, "cycle_start")
    assert len(cycles) == 4
    assert all(c["warm_start"] for c in cycles[1:]), "a restart was not started from the template"
    ready = events_of(events, "warm_template_ready")[0]
    assert ready["cuda_initialized"] is False and ready["failed_preloads"] == []
    found = probes(tmp_path)
    assert set(found) == {(c, r) for c in range(4) for r in (0, 1)}
    warm_cycles = [c["cycle"] for c in cycles if c["warm_start"]]
    for (cycle, rank), probe in found.items():
        assert probe["name"] == "__main__"
        assert probe["argv"] == [PROBE, str(tmp_path), "3", "5", "wait-template"]
        assert probe["path0"] == os.path.dirname(PROBE)
        assert probe["imports"] == [probe["pid"]]  # module state is fresh
        assert probe["sid"] == probe["pid"]  # own session, like torchrun's workers
        assert probe["local_rank"] == str(rank) and probe["socket"].endswith(f"r{rank}.sock")
        # the template imports at the lowest priority, but its workers run at the launcher's
        assert probe["niceness"] == os.getpriority(os.PRIO_PROCESS, 0)
        if cycle in warm_cycles:
            assert probe["torch_loaded_at_start"] is True  # forked from the template
    for cycle in warm_cycles:
        assert found[(cycle, 0)]["random"] != found[(cycle, 1)]["random"]  # reseeded per worker
    # exit codes pass through the trampoline: rank 1 exited 5 in cycles 0-2
    roots = [f for f in events_of(events, "failure") if f["cause_kind"] != "terminated"]
    assert [(f["cycle"], f["cause"]) for f in roots] == [(c, "exit code 5") for c in range(3)]
    # torchrun's log redirection reaches the forked workers
    outs = sorted(p.read_text() for p in logs.rglob("stdout.log"))
    errs = sorted(p.read_text() for p in logs.rglob("stderr.log"))
    for cycle in warm_cycles:
        assert any(f"probe rank 0 cycle {cycle} stdout" in text for text in outs)
        assert any(f"probe rank 1 cycle {cycle} stderr" in text for text in errs)


def test_module_entry_points_are_warm_started_too(tmp_path):
    workers = Path(PROBE).parent
    result = run_launcher(
        ["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--ft-event-log",
         str(tmp_path / "events.jsonl"), "-m", "warm_probe", str(tmp_path), "0", "0"],
        env={"PYTHONPATH": f"{workers}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")},
    )
    assert result.returncode == 0, result.stderr
    probe = probes(tmp_path)[(0, 0)]
    assert probe["name"] == "__main__" and probe["argv"][0].endswith("warm_probe.py")


def test_no_warm_restarts_starts_every_worker_cold(tmp_path):
    result = run_launcher(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--no-warm-restarts",
         "--ft-event-log", str(tmp_path / "events.jsonl"), PROBE, str(tmp_path), "2", "4"],
    )
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "events.jsonl")
    assert not any(c["warm_start"] for c in events_of(events, "cycle_start"))
    assert not events_of(events, "warm_template_started")
    assert not any(p["torch_loaded_at_start"] for p in probes(tmp_path).values())


def test_a_dead_template_falls_back_to_cold_starts_and_is_replaced(tmp_path):
    proc = start_launcher(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--monitor-interval", "0.05",
         "--ft-event-log", str(tmp_path / "events.jsonl"),
         WORKER, "--record-dir", str(tmp_path), "--steps", "120", "--crash-rank", "1", "--crash-cycle", "-2"],
    )
    events_path = tmp_path / "events.jsonl"
    deadline = __import__("time").monotonic() + 60
    while not (events_path.exists() and events_of(read_events(events_path), "warm_template_started")):
        assert __import__("time").monotonic() < deadline
        __import__("time").sleep(0.05)
    template = events_of(read_events(events_path), "warm_template_started")[0]["pid"]
    os.kill(template, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    events = read_events(events_path)
    assert events_of(events, "warm_template_replaced")
    assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1, 2]
    assert set(records(tmp_path)) == {(c, r) for c in range(3) for r in (0, 1)}
