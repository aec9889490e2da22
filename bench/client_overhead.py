"""Cost of the client's hot-path calls against a real rank monitor.

Prints microseconds per ``send_heartbeat()`` and per ``start_section()``+``end_section()`` pair:
the median and p99 of individually timed calls (timer overhead subtracted), and the mean over
large batches. Run: ``python bench/client_overhead.py [--calls N] [--impl ours|nvrx] [--json]``
(``--impl nvrx`` needs NVIDIA nvidia-resiliency-ext installed: ``make bench-peer``'s ``.venv-peer``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import _impl  # noqa: E402

FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = "FT_RANK_MONITOR_IPC_SOCKET"  # the same in both packages


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_individually(fn, calls: int) -> list[float]:
    clock = time.perf_counter_ns
    overhead = []
    for _ in range(10_000):
        t0 = clock()
        overhead.append(clock() - t0)
    timer_ns = statistics.median(overhead)
    samples = []
    for _ in range(calls):
        t0 = clock()
        fn()
        samples.append(max(0.0, clock() - t0 - timer_ns) / 1000.0)
    return samples


def time_in_batches(fn, batches: int, batch: int) -> float:
    per_call = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(per_call)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--impl", choices=_impl.IMPLS, default="ours")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    ft = _impl.core(args.impl)
    FaultToleranceConfig, RankMonitorClient, RankMonitorServer = (
        ft.FaultToleranceConfig, ft.RankMonitorClient, ft.RankMonitorServer)
    os.environ.setdefault("RANK", "0")  # NVRx's client asks for its rank
    os.environ.setdefault("LOCAL_RANK", "0")

    run_dir = tempfile.mkdtemp(prefix="ftb-")
    socket_path = os.path.join(run_dir, "m.sock")
    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 600}, rank_out_of_section_timeout=600)
    monitor = RankMonitorServer.run_in_subprocess(cfg, socket_path)
    os.environ[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = socket_path
    client = RankMonitorClient()
    client.init_workload_monitoring()
    try:
        def section_pair():
            client.start_section("step")
            client.end_section("step")

        results = {}
        for name, fn in (("heartbeat", client.send_heartbeat), ("section_pair", section_pair)):
            time_in_batches(fn, 5, max(100, args.calls // 20))  # warm up
            samples = time_individually(fn, args.calls)
            results[name] = {
                "median_us": round(statistics.median(samples), 3),
                "p99_us": round(percentile(samples, 0.99), 3),
                "batch_mean_us": round(time_in_batches(fn, 50, args.calls // 50), 3),
            }
        results["monitor_alive"] = monitor.is_alive()
        results["impl"] = args.impl
        results["calls"] = args.calls
    finally:
        client.shutdown_workload_monitoring()
        monitor.terminate()
        monitor.join(10)
        os.rmdir(run_dir)
    if args.json:
        print(json.dumps(results))
    else:
        for name in ("heartbeat", "section_pair"):
            r = results[name]
            print(f"{name:13s} median {r['median_us']:.3f} us  p99 {r['p99_us']:.3f} us  "
                  f"batch mean {r['batch_mean_us']:.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
