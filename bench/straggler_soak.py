"""Straggler soak: a clean multi-rank run with realistic jitter must flag nothing.

Runs ``tests/workers/straggler_train.py`` under ``ft_launcher`` (gloo, CPU) for ``--duration``
seconds with every rank healthy and the callback's default thresholds (relative 0.8, individual
0.7), both scores on, and jitter: each step's compute varies +-20 %, random garbage collections, a
rare 5x step, an evaluation every ``--val-every`` steps and a checkpoint every ``--ckpt-every``
steps. Counts the reports and the flags (rank 0's "Affected ranks" lines and the launcher's
``straggler`` events); the goal is 0. The machine's load average is recorded before and after (a
shared machine makes the run a harder jitter test).

Run: ``python bench/straggler_soak.py [--duration 630] [--ranks 4] [--interval 30] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "workers" / "straggler_train.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=630.0, help="seconds of training")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--interval", type=float, default=30.0, help="report_time_interval")
    parser.add_argument("--val-every", type=int, default=300)
    parser.add_argument("--ckpt-every", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cfg = {"max_steps": 10_000_000, "max_time": {"seconds": args.duration}, "fwd_ms": 20, "bwd_ms": 20,
               "jitter": True, "val_every": args.val_every, "ckpt_dir": str(Path(tmp) / "ckpt"),
               "ckpt_every": args.ckpt_every, "cb": {"report_time_interval": args.interval}}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FT_", "TORCHELASTIC_"))}
        env["OMP_NUM_THREADS"] = "1"
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", str(args.ranks),
             "--max-restarts", "0", "--ft-event-log", str(events), "--ft-param-initial_rank_heartbeat_timeout",
             "null", "--ft-param-rank_heartbeat_timeout", "null", str(WORKER), json.dumps(cfg)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=args.duration + 300)
        wall = time.monotonic() - started
        records = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    reports = re.findall(r"\[rank0\] INFO \S+: straggler report (\d+) ", proc.stderr)
    affected = [line for line in proc.stderr.splitlines() if "Affected" in line and "[rank0]" in line]
    steps = re.findall(r"fit done: (\d+) steps", proc.stderr)
    result = {
        "exit_code": proc.returncode, "wall_s": round(wall, 1), "ranks": args.ranks,
        "report_time_interval": args.interval, "reports": len(reports), "steps": int(steps[0]) if steps else None,
        "flag_lines": len(affected), "straggler_events": sum(1 for r in records if r.get("event") == "straggler"),
        "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in os.getloadavg()],
        "flags": affected[:20],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
