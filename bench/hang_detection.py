"""Hang detection latency past the timeout, with the default configuration otherwise.

A real rank monitor watches a real rank that sends heartbeats and then stops. Latency is the
moment the parent sees the rank die minus (last heartbeat + timeout), so it includes the
monitor's wake-up, the capture of the rank's stacks (ours: py-spy when installed, else the
client's faulthandler signal; bounded by ``stack_capture_budget``), the signal and process exit.
Every other setting keeps its default (NVRx's monitor checks every ``workload_check_interval`` =
5 s; ours sleeps until the deadline). ``--stacks off`` sets ``stack_capture_budget`` to 0,
``--stacks faulthandler`` hides py-spy from the monitor (``FT_PY_SPY=off``).
Run: ``python bench/hang_detection.py [--runs N] [--timeout S] [--impl ours|nvrx]
[--stacks default|faulthandler|off] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import _impl  # noqa: E402
from bench._util import emit, summarize  # noqa: E402

FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = "FT_RANK_MONITOR_IPC_SOCKET"  # the same in both packages

RANK = textwrap.dedent("""
    import sys, time
    from {core} import RankMonitorClient
    c = RankMonitorClient(); c.init_workload_monitoring()
    for _ in range(20):
        c.send_heartbeat(); time.sleep(0.02)
    c.send_heartbeat()
    print(time.monotonic(), flush=True)
    time.sleep(3600)
""")


def one_run(impl: str, timeout: float, stacks: str = "default") -> float:
    ft = _impl.core(impl)
    run_dir = tempfile.mkdtemp(prefix="ftb-")
    path = os.path.join(run_dir, "m.sock")
    # Defaults except the heartbeat timeout (the default 45 min would make a long benchmark).
    extra = {"stack_capture_budget": 0} if impl == "ours" and stacks == "off" else {}
    cfg = ft.FaultToleranceConfig(rank_heartbeat_timeout=timeout, **extra)
    saved = os.environ.get("FT_PY_SPY")
    if stacks == "faulthandler":
        os.environ["FT_PY_SPY"] = "off"  # read by the monitor process started below
    try:
        monitor = ft.RankMonitorServer.run_in_subprocess(cfg, path)
    finally:
        if saved is None:
            os.environ.pop("FT_PY_SPY", None)
        else:
            os.environ["FT_PY_SPY"] = saved
    try:
        code = RANK.replace("{core}", _impl.module_name(impl, "core"))
        rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR: path,
                                     "RANK": "0", "LOCAL_RANK": "0"},
                                start_new_session=True)
        last_hb = float(rank.stdout.readline())
        rank.wait(timeout=timeout + 30)
        died = time.monotonic()
        rank.stdout.close()
        return died - (last_hb + timeout)
    finally:
        monitor.terminate()
        monitor.join(10)
        os.rmdir(run_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--impl", choices=_impl.IMPLS, default="ours")
    parser.add_argument("--stacks", choices=("default", "faulthandler", "off"), default="default",
                        help="ours: stack capture as configured by default, faulthandler only, or off")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latencies = [one_run(args.impl, args.timeout, args.stacks) for _ in range(args.runs)]
    emit({"impl": args.impl, "stacks": args.stacks, "hang_detection_latency_s": summarize(latencies, 4),
          "samples_s": [round(x, 4) for x in latencies], "timeout_s": args.timeout}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
