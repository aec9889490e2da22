"""Worker failure -> replacement workers started -> gloo process group ready again.

Runs the same 2-rank job under ft_launcher and plain torchrun (alternating, ``--runs`` each): rank
1 crashes right after the group formed; the launcher restarts the group. Reported per tool:
crash -> last replacement process started (its first Python statement), and crash -> process
group ready in all new workers. Run: ``python bench/restart_latency.py [--runs N] [--tools ...]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import emit, summarize  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "restart_worker.py")

TOOLS = {
    "ft_launcher": [sys.executable, "-m", "launcher"],
    "ft_launcher_cold": [sys.executable, "-m", "launcher", "--no-warm-restarts"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def one_run(tool: str, extra: list[str], crashes: int) -> tuple[list[tuple[float, float]], int, object]:
    """Per planned crash (to processes started, to group ready); unplanned restarts; exit code."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "BENCH_OUT": out, "OMP_NUM_THREADS": "1", "BENCH_CRASHES": str(crashes),
               "BENCH_CLIENT": "1" if tool.startswith("ft_launcher") else "0",
               # let the warm template finish importing before the first planned crash
               "BENCH_FIRST_WAIT": "1" if tool == "ft_launcher" else "0"}
        # Spare restarts: a launcher whose restarted group fails to form needs more than planned.
        cmd = TOOLS[tool] + ["--standalone", "--nproc-per-node", "2", "--max-restarts", str(crashes + 5),
                             "--monitor-interval", "0.1", *extra, WORKER]
        try:
            code = subprocess.run(cmd, env=env, timeout=300, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"

        def read(name: str) -> dict[int, list[float]]:
            found: dict[int, list[float]] = {}
            for path in glob.glob(os.path.join(out, f"{name}_a*_r*")):
                attempt = int(os.path.basename(path).split("_")[1][1:])
                with open(path) as stream:
                    found.setdefault(attempt, []).append(json.load(stream))
            return found

        started, ready, crashed = read("started"), read("ready"), read("crash")
        results = []
        for attempt, (crash,) in sorted(crashed.items()):
            later = [a for a in sorted(ready) if a > attempt and len(ready[a]) == 2]
            if later and len(started.get(attempt + 1, [])) == 2:
                results.append((max(started[attempt + 1]) - crash, max(ready[later[0]]) - crash))
        attempts = max(started) + 1
        return results, attempts - 1 - len(crashed), code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--crashes", type=int, default=3, help="restarts measured per run")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {tool: [] for tool in args.tools}
    unplanned = dict.fromkeys(args.tools, 0)
    failed_runs: dict[str, list] = {tool: [] for tool in args.tools}
    for _ in range(args.runs):
        for tool in args.tools:
            values, extra_restarts, code = one_run(tool, [], args.crashes)
            samples[tool] += values
            unplanned[tool] += extra_restarts
            if code != 0:
                failed_runs[tool].append(code)
    result = {
        tool: {"failure_to_processes_started_s": summarize([s for s, _ in values]) if values else None,
               "failure_to_process_group_ready_s": summarize([r for _, r in values]) if values else None,
               "unplanned_restarts": unplanned[tool],
               "runs": args.runs, "failed_runs": failed_runs[tool]}
        for tool, values in samples.items()
    }
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
