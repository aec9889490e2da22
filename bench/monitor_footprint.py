"""Memory of each launcher process, and rank monitor CPU at 10 heartbeats/s, as deployed.

Starts a real launcher (``--standalone --nproc-per-node 2``) running ``bench/footprint_worker.py``.
The first cycle only makes the launcher restart the workers once, so that everything is measured
as it is after a restart (for ours: workers forked by the warm template, and trampolines). In the
second cycle each worker connects its client and sends 10 heartbeats per second for ``--seconds``.
While everything is alive, every process of the launcher's tree is found (``/proc``) and
classified: the launcher itself, each rank monitor, and for ours the warm template and the
per-worker trampolines; the workers (the user's processes) are listed apart. Memory is read from
``/proc/<pid>/smaps_rollup`` at the end of the heartbeat window: RSS, PSS (shared pages split
between the processes that map them) and USS (private pages: what ending the process frees).
A process forked from another shares its pages copy-on-write: NVRx forks its monitors from the
launcher, ours forks workers from the warm template, so PSS is the figure that adds up. Monitor CPU
is its threads' time on CPU over the window (``schedstat``), scaled to one minute.

Tools: ``ours`` (``python -m launcher``), ``ours_cold`` (``--no-warm-restarts``: no template),
``nvrx`` (NVRx's launcher, with ``--peer-python``), ``torchrun`` (no monitors: the baseline).
Run: ``python bench/monitor_footprint.py [--seconds S] [--tool ours|nvrx|torchrun] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import _impl  # noqa: E402
from bench._util import (  # noqa: E402
    become_subreaper,
    descendants,
    emit,
    kill_descendants,
    proc_cpu_ns,
    proc_memory_kb,
)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "footprint_worker.py")


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as stream:
        return stream.read().replace(b"\0", b" ").decode(errors="replace")


def classify(launcher_pid: int, workers: set[int]) -> dict[int, str]:
    """Role of every process in the launcher's tree (workers and their children excluded)."""
    roles = {launcher_pid: "launcher"}
    launcher_cmd = cmdline(launcher_pid)
    worker_tree = set(workers)
    for worker in workers:
        worker_tree.update(descendants(worker))
    for pid in descendants(launcher_pid):
        if pid in worker_tree:
            continue
        try:
            cmd = cmdline(pid)
        except OSError:
            continue
        if "ft_core.monitor.cli" in cmd:
            roles[pid] = "monitor"
        elif "zygote" in cmd:
            roles[pid] = "warm_template"
        elif "trampoline.py" in cmd:
            roles[pid] = "trampoline"
        elif cmd == launcher_cmd:
            # NVRx forks its rank monitors from the launcher (multiprocessing "fork").
            roles[pid] = "monitor"
        else:
            roles[pid] = "other: " + cmd[:80]
    return roles


def wait_files(directory: str, names: list[str], timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(directory, n)) for n in names):
        if proc.poll() is not None:
            raise RuntimeError(f"launcher exited early with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {names} in {directory}")
        time.sleep(0.05)


def measure(tool: str, seconds: float, peer_python: str | None, log_path: str | None) -> dict:
    if tool == "ours":
        cmd, client = _impl.launcher_command("ours", sys.executable), "ours"
    elif tool == "ours_cold":
        cmd, client = [*_impl.launcher_command("ours", sys.executable), "--no-warm-restarts"], "ours"
    elif tool == "nvrx":
        if not peer_python:
            raise SystemExit("monitor_footprint: --tool nvrx needs --peer-python")
        cmd, client = _impl.launcher_command("nvrx", peer_python), "nvrx"
    else:
        cmd, client = [sys.executable, "-m", "torch.distributed.run"], "none"
    with tempfile.TemporaryDirectory(prefix="ftb-footprint-") as out:
        tmp = os.path.join(out, "tmp")
        os.mkdir(tmp)
        env = {**os.environ, "BENCH_OUT": out, "BENCH_SECONDS": str(seconds), "BENCH_HZ": "10",
               "BENCH_CLIENT": client, "OMP_NUM_THREADS": "1", "TMPDIR": tmp, "PYTHONWARNINGS": "ignore",
               "BENCH_RESTART_FIRST": "1", "BENCH_WAIT_TEMPLATE": "1" if tool == "ours" else "0"}
        full = cmd + ["--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.1",
                      "--max-restarts", "1", WORKER]
        with open(log_path or os.devnull, "ab") as log:
            proc = subprocess.Popen(full, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            wait_files(out, ["ready_r0", "ready_r1"], 180, proc)
            workers = set()
            for rank in (0, 1):
                with open(os.path.join(out, f"ready_r{rank}")) as stream:
                    workers.add(int(stream.read()))
            roles = classify(proc.pid, workers)
            cpu0 = {pid: proc_cpu_ns(pid) for pid, role in roles.items() if role == "monitor"}
            t0 = time.monotonic()
            wait_files(out, ["done_r0", "done_r1"], seconds + 60, proc)
            t1 = time.monotonic()
            cpu_per_min = sorted(round((proc_cpu_ns(pid) - c0) / 1e9 / (t1 - t0) * 60, 4) for pid, c0 in cpu0.items())
            roles = classify(proc.pid, workers)
            roles.update({pid: "worker" for pid in workers})
            processes = []
            for pid, role in sorted(roles.items(), key=lambda item: (item[1], item[0])):
                with contextlib.suppress(OSError):
                    processes.append({"role": role, "pid": pid, **proc_memory_kb(pid)})
            with open(os.path.join(out, "release"), "w"):
                pass
            code = proc.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            leftovers = len(kill_descendants())  # torchrun's workers have sessions of their own
    by_role: dict[str, list[dict]] = {}
    for entry in processes:
        by_role.setdefault(entry["role"], []).append(entry)
    ours = [p for p in processes if p["role"] != "worker"]
    total = {key: sum(p[key] for p in ours) for key in ("rss_kb", "pss_kb", "uss_kb")}
    return {"tool": tool, "processes": processes, "monitor_cpu_s_per_min_at_10hz": cpu_per_min,
            "window_s": round(t1 - t0, 2), "total_without_workers_kb": total, "launcher_exit_code": code,
            "processes_left_behind": leftovers,
            "roles": {role: len(entries) for role, entries in by_role.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="heartbeat window (10 Hz)")
    parser.add_argument("--tool", choices=("ours", "ours_cold", "nvrx", "torchrun"), default="ours")
    parser.add_argument("--peer-python", default=None, help="interpreter of the venv with NVRx installed")
    parser.add_argument("--log", default=None, help="append the launcher's output to this file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    become_subreaper()
    emit(measure(args.tool, args.seconds, args.peer_python, args.log), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
