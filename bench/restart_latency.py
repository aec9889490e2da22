"""Worker failure -> replacement workers started -> gloo process group ready again.

Runs the same 2-rank job (``bench/restart_worker.py``) under each tool, alternating the tools run
by run (ABBA order, so a drift in the machine's load hits every tool alike): rank 1 exits with
code 1 right after the group formed (``--crashes`` times per run); the launcher restarts the
group. Reported per tool, over all planned crashes of all runs: crash -> last replacement worker
started (its first Python statement), and crash -> process group ready (``init_process_group``
plus one ``all_reduce`` done) in all new workers. Per-run medians are kept too, so that a driver
can pair the runs of two tools and report ratios.

Tools: ``ft_launcher`` (ours, warm restarts), ``ft_launcher_cold`` (ours, ``--no-warm-restarts``),
``torchrun`` (plain torch with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, the setting that makes its
restarts clean here, and that ours uses by default), ``torchrun_default`` (torchrun as it comes:
restarted gloo groups here often read the previous round's peer addresses, fail with "Connection
refused" and need extra restarts, or hang until the run's time limit; not run unless asked for),
and ``nvrx`` (NVRx 0.4.1's ``ft_launcher``, with the interpreter given by ``--peer-python``). Every
launcher gets ``--monitor-interval 0.1`` (NVRx's default; torchrun's is 0.1 s too since torch
2.5) and spare restarts, so that a restarted group that fails to form is counted ("unplanned
restarts") rather than ending the run.

Run: ``python bench/restart_latency.py [--runs N] [--crashes N] [--tools ...] [--peer-python PY]``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import _impl  # noqa: E402
from bench._util import become_subreaper, emit, kill_descendants, summarize  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "restart_worker.py")
RUN_TIMEOUT_S = 120.0
TOOLS = ("ft_launcher", "ft_launcher_cold", "torchrun", "torchrun_default", "nvrx")
DEFAULT_TOOLS = ("ft_launcher", "ft_launcher_cold", "torchrun", "nvrx")


def tool_command(tool: str, peer_python: str | None) -> list[str]:
    if tool == "ft_launcher":
        return _impl.launcher_command("ours", sys.executable)
    if tool == "ft_launcher_cold":
        return [*_impl.launcher_command("ours", sys.executable), "--no-warm-restarts"]
    if tool in ("torchrun", "torchrun_default"):
        return [sys.executable, "-m", "torch.distributed.run"]
    if tool == "nvrx":
        if not peer_python:
            raise SystemExit("restart_latency: tool nvrx needs --peer-python (the NVRx venv's python)")
        return _impl.launcher_command("nvrx", peer_python)
    raise SystemExit(f"restart_latency: unknown tool {tool!r}; choose from {', '.join(TOOLS)}")


def run_bounded(cmd: list[str], env: dict, timeout: float, log_path: str) -> tuple[object, int]:
    """Run ``cmd`` in its own session; on timeout kill it and everything it started.

    Returns the exit code (or "timeout") and how many processes it left behind, which this
    process (a child subreaper) then killed.
    """
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code: object = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = "timeout"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # torchrun's workers have sessions of their own: orphans re-parent to us.
        return code, len(kill_descendants())


def one_run(tool: str, crashes: int, peer_python: str | None, log_dir: str | None
            ) -> tuple[list[tuple[float, float]], int, object, int]:
    """Per planned crash (to processes started, to group ready); unplanned restarts; exit code;
    processes left behind."""
    with tempfile.TemporaryDirectory(prefix="ftb-restart-") as out:
        tmp = os.path.join(out, "tmp")  # the launchers' temporary files (torchrun leaves its own)
        os.mkdir(tmp)
        env = {**os.environ, "BENCH_OUT": out, "OMP_NUM_THREADS": "1", "BENCH_CRASHES": str(crashes),
               "TMPDIR": tmp, "PYTHONWARNINGS": "ignore",
               "BENCH_CLIENT": {"nvrx": "nvrx", "torchrun": "none", "torchrun_default": "none"}.get(tool, "ours"),
               # let the warm template finish importing before the first planned crash
               "BENCH_FIRST_WAIT": "1" if tool == "ft_launcher" else "0"}
        if tool == "torchrun":
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        else:
            env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        # Spare restarts: a launcher whose restarted group fails to form needs more than planned.
        cmd = tool_command(tool, peer_python) + [
            "--standalone", "--nproc-per-node", "2", "--max-restarts", str(crashes + 5),
            "--monitor-interval", "0.1", WORKER]
        log_path = os.path.join(log_dir or out, f"restart_{tool}_{os.getpid()}.log")
        code, leftovers = run_bounded(cmd, env, RUN_TIMEOUT_S, log_path)

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
        attempts = max(started) + 1 if started else 0
        return results, max(0, attempts - 1 - len(crashed)), code, leftovers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--crashes", type=int, default=3, help="restarts measured per run")
    parser.add_argument("--tools", nargs="+", default=None,
                        help=f"from {', '.join(TOOLS)} (default: {', '.join(DEFAULT_TOOLS)}; nvrx only "
                        "with --peer-python)")
    parser.add_argument("--peer-python", default=None, help="interpreter of the venv with NVRx installed")
    parser.add_argument("--log-dir", default=None, help="keep each launcher's output here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tools = args.tools or [t for t in DEFAULT_TOOLS if t != "nvrx" or args.peer_python]
    become_subreaper()
    left: dict[str, int] = dict.fromkeys(tools, 0)
    samples: dict[str, list[tuple[float, float]]] = {tool: [] for tool in tools}
    per_run: dict[str, list] = {tool: [] for tool in tools}
    unplanned = dict.fromkeys(tools, 0)
    failed_runs: dict[str, list] = {tool: [] for tool in tools}
    for run in range(args.runs):
        for tool in tools if run % 2 == 0 else reversed(tools):
            values, extra_restarts, code, leftovers = one_run(tool, args.crashes, args.peer_python, args.log_dir)
            left[tool] += leftovers
            samples[tool] += values
            # Per-run medians, in run order (None: no planned crash measured in that run).
            per_run[tool].append([
                round(statistics.median(s for s, _ in values), 4) if values else None,
                round(statistics.median(r for _, r in values), 4) if values else None])
            unplanned[tool] += extra_restarts
            if code != 0:
                failed_runs[tool].append(code)
    result = {
        tool: {"failure_to_processes_started_s": summarize([s for s, _ in values]) if values else None,
               "failure_to_process_group_ready_s": summarize([r for _, r in values]) if values else None,
               "per_run_medians_s": per_run[tool],
               "unplanned_restarts": unplanned[tool],
               "processes_left_behind": left[tool],
               "runs": args.runs, "crashes_per_run": args.crashes, "failed_runs": failed_runs[tool]}
        for tool, values in samples.items()
    }
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
