"""``ft_report`` on a large event log: time and peak memory of the text report and of ``--plot``.

Writes a synthetic ``ft_events.jsonl`` of about ``--events`` records (100 000 by default, about
30 MB) as a long job on ``--nodes`` nodes would leave it: per node one launcher, then cycles of
``cycle_start``, ``workers_ready``, a ``failure`` (the root on one node, collateral records on
the others) and a ``restart``, each record built by its class of ``launcher/events/records.py``. Then
runs ``ft_report LOG`` and ``ft_report LOG --plot FILE.png`` under ``/usr/bin/time -v`` and
reports each one's wall time, CPU time and peak RSS (the figures of docs/benchmarks.md).

Run: ``python bench/report_scale.py [--events N] [--nodes N] [--json]``.

Figures (2026-11-26, 2 cores shared with other test runs, load average 7-10; 100 016 records, 28.9 MB):

======================  ========  =======  ============
ft_report               wall      CPU      peak RSS
======================  ========  =======  ============
text                    29.2 s    9.5 s    173 MB
``--plot``, before      1074 s    ~300 s   1394 MB
``--plot``, now         24.0 s    11.6 s   237 MB
======================  ========  =======  ============

"Before" is one artist per bar, marker and label (launcher/events/report.py until issue 21 item 12); now
the chart is reduced to its pixels (:mod:`launcher.events.plot`). About 7 s of the CPU time is
reading the records (``launcher.events.records.read_events``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._util import emit  # noqa: E402
from launcher.events.records import CycleStart, Failure, LauncherStart, Restart, Result, WorkersReady  # noqa: E402

FT_REPORT = Path(sys.executable).parent / "ft_report"
PER_CYCLE = 4  # records per node and cycle


def write_log(path: Path, events: int, nodes: int) -> int:
    """A long run's event log with about ``events`` records; returns how many were written."""
    cycles = max(1, events // (nodes * PER_CYCLE))
    start = 1_790_000_000.0
    written = 0
    with open(path, "w", encoding="utf-8") as stream:
        def put(record) -> None:
            nonlocal written
            stream.write(json.dumps(record.to_wire(), separators=(",", ":")) + "\n")
            written += 1

        for node in range(nodes):
            host, run_id = f"node{node:03d}", f"run-{node}"
            envelope = {"node": host, "pid": 1000 + node, "run_id": run_id}
            put(LauncherStart(ts=start, nnodes=f"{nodes}:{nodes}", nproc_per_node=8, max_restarts=cycles,
                              **envelope))
            ts = start
            for cycle in range(cycles):
                ranks = {str(r): node * 8 + r for r in range(8)}
                put(CycleStart(ts=ts + 1, cycle=cycle, restart_count=cycle, group_rank=node,
                               group_world_size=nodes, ranks=ranks, worker_pids={r: 5000 + p for r, p in ranks.items()},
                               since_failure_s=2.5 if cycle else None, warm_start=bool(cycle), **envelope))
                put(WorkersReady(ts=ts + 3, cycle=cycle, ready_s=2.0, **envelope))
                root = cycle % nodes == node
                put(Failure(ts=ts + 60, cycle=cycle, rank=node * 8, local_rank=0, worker_pid=5000 + node * 8,
                            cause="hang: no heartbeat for 30 s" if root else "stopped after another worker failed",
                            cause_kind="hang" if root else "terminated", role="root" if root else "collateral",
                            explanation="rank hung", detected_at=ts + 59.5, decision="restarting the worker group",
                            hang_kind="heartbeat" if root else None, root_node=None if root else "node000",
                            root_outcome=None if root else "hang", **envelope))
                put(Restart(ts=ts + 61, cycle=cycle, reason="a worker failed", **envelope))
                ts += 62
            put(Result(ts=ts + 1, outcome="succeeded", exit_code=0, cycles=cycles, **envelope))
    return written


def measure(args: list[str]) -> dict[str, float]:
    """Wall seconds and peak RSS (MB) of one command, from ``/usr/bin/time -v``."""
    done = subprocess.run(["/usr/bin/time", "-v", *args], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr))
    hours, minutes, seconds = (float(g) if g else 0.0 for g in wall.groups())
    # on a shared machine the CPU seconds are the steadier figure
    return {"wall_s": round(hours * 3600 + minutes * 60 + seconds, 2), "cpu_s": round(cpu, 2),
            "max_rss_mb": round(int(rss.group(1)) / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-scale-") as tmp:
        log, png = Path(tmp) / "ft_events.jsonl", Path(tmp) / "timeline.png"
        count = write_log(log, args.events, args.nodes)
        result = {
            "events": count,
            "log_mb": round(os.path.getsize(log) / 1e6, 1),
            "text": measure([str(FT_REPORT), str(log)]),
            "plot": measure([str(FT_REPORT), str(log), "--plot", str(png)]),
            "png_kb": round(png.stat().st_size / 1024),
        }
    emit(result, args.json)


if __name__ == "__main__":
    main()
