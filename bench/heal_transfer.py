"""Time to heal a node from a peer: one just-in-time state sent through a c10d TCPStore.

Three processes, as in a job: this one hosts the store (the launcher of the node with the c10d
endpoint), a sender (the node holding the state) and a receiver (the node that lacks it) run
``launcher.rendezvous.state_transfer.send``/``receive`` with the launcher's chunking, window and
checksum. Prints the seconds per transfer and per 100 MB (median and min-max over ``--reps``).

Run: ``python bench/heal_transfer.py [--sizes-mb 100 400] [--reps 3] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEP = 1000
BLOCK = 1 << 20


def _write_state(directory: str, megabytes: int):  # type: ignore[no-untyped-def]
    from ft_core.wire import saved_state

    block = os.urandom(BLOCK)

    def writer(path: str) -> None:
        with open(path, "wb") as stream:
            for _ in range(megabytes * 1_000_000 // BLOCK):
                stream.write(block)
            stream.write(block[:megabytes * 1_000_000 % BLOCK])

    return saved_state.write(directory, STEP, writer, kind="plain", source="blocked")


def _side(role: str, port: int, directory: str, receivers: int) -> int:
    """One side of the transfer (a child process): prints its Transfer as JSON."""
    import torch.distributed as dist

    from ft_core.wire import saved_state
    from launcher.rendezvous import state_transfer

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    if role == "send":
        state = saved_state.newest(directory)
        assert state is not None
        result = state_transfer.send(store, state, receivers, 600)
    else:
        result = state_transfer.receive(store, directory, STEP, 600)
    print(json.dumps(result.__dict__))
    return 0 if result.ok else 1


def measure(megabytes: int, work: str) -> dict:
    """One transfer of ``megabytes`` MB: the receiver's seconds and bytes."""
    import torch.distributed as dist

    holder, lacking = os.path.join(work, "holder"), os.path.join(work, "lacking")
    for path in (holder, lacking):
        shutil.rmtree(path, ignore_errors=True)
    _write_state(holder, megabytes)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    me = os.path.abspath(__file__)
    children = [subprocess.Popen([sys.executable, me, "--side", role, "--port", str(store.port), "--dir", path],
                                 stdout=subprocess.PIPE, text=True)
                for role, path in (("recv", lacking), ("send", holder))]
    outs = [child.communicate(timeout=900)[0] for child in children]
    received, sent = (json.loads(out.strip().splitlines()[-1]) for out in outs)
    assert received["ok"] and sent["ok"], (received, sent)
    del store
    return {"mb": megabytes, "seconds": received["seconds"], "bytes": received["bytes"],
            "per_100mb_s": received["seconds"] * 100_000_000 / received["bytes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--side", choices=("send", "recv"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return _side(args.side, args.port, args.dir, 1)
    work = tempfile.mkdtemp(prefix="heal-bench-")
    results: dict[str, dict] = {}
    try:
        for megabytes in args.sizes_mb:
            runs = [measure(megabytes, work) for _ in range(args.reps)]
            per = [r["per_100mb_s"] for r in runs]
            results[str(megabytes)] = {
                "seconds": [r["seconds"] for r in runs],
                "per_100mb_s": {"median": statistics.median(per), "min": min(per), "max": max(per)},
                "mb_per_s": 100 / statistics.median(per),
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"bench": "heal_transfer", "cpus": os.cpu_count(), "loadavg": os.getloadavg()[0],
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sizes": results}
    if args.json:
        print(json.dumps(report))
    else:
        for megabytes, result in results.items():
            per = result["per_100mb_s"]
            print(f"{megabytes} MB: {per['median']:.2f} s per 100 MB (min {per['min']:.2f}, max {per['max']:.2f}; "
                  f"{result['mb_per_s']:.0f} MB/s); load average {report['loadavg']:.1f} on {report['cpus']} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
