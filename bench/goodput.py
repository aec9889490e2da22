"""Goodput under faults: a 2-rank Lightning job under scripts/autoresume.sh and ft_launcher.

Each run trains ``bench/goodput_train.py`` (BoringModel, DDP with gloo on CPU, ``--step-time``
seconds of sleep per step standing in for compute, a checkpoint every ``--checkpoint-every``
steps) to ``--max-steps`` under ``scripts/autoresume.sh --mode local`` with the tool's
``ft_launcher``. Rank 1 injects a fault after every ``--fault-every`` seconds of training
(alternately a hang, ``SIGSTOP``, and a kill, ``SIGKILL``; ``--max-faults`` in all): identical
faults for both tools, made by the worker itself (NVRx's simulated faults need CUDA).

Restarts: ``ft_launcher``'s own in-job restarts (``--max-restarts`` covers every planned fault),
with autoresume.sh around it as in production: it starts the job, ends it when rank 0 has
created the finished flag, and would start a new launcher if the in-job restarts ran out. An
in-job restart keeps the launcher, its rendezvous store and the rank monitors alive (ours also
its warm template), which is the fast path a fault normally takes; an autoresume.sh attempt is a
whole new launcher, the path for job-level endings (time limit, preemption, restarts used up).

Both tools get the same heartbeat timeouts (``--ft-initial-rank-heartbeat-timeout 60``,
``--ft-rank-heartbeat-timeout`` ``--hb-timeout``) and otherwise their defaults (NVRx's monitor
checks every 5 s, it gives a surviving worker 30 s after SIGTERM; ours 2 s), plus
``--monitor-interval 0.1`` for both. Ours also gets ``--warm-preload
torch,torch.distributed,lightning.pytorch``, its documented setting for Lightning jobs.

Figures per run, from rank 0's progress log and the fault records (``bench/goodput_train.py``):

- goodput = useful step time / wall time. Wall time runs from starting autoresume.sh to its exit.
  Useful step time is the time of the steps that the final model descends from: for every step
  1..max_steps its last completion, timed from the previous step's completion in the same
  process (the first step of a process, which includes its setup, counts at that process's
  median step time).
- time to recover per fault: fault (the rank's record just before its signal) -> first step
  completed by a replacement process (rank 0; with DDP no rank finishes a step alone), split into
  fault -> replacement process started (detection, stop, restart) and -> first step (import,
  Lightning setup, rendezvous, checkpoint load, the step).
- steps redone per fault (since the last checkpoint), attempts of autoresume.sh, failures that
  were not planned (should be none).

Run: ``python bench/goodput.py [--tools ours nvrx] [--runs N] [--peer-python PY] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import REPO, become_subreaper, emit, kill_descendants, summarize  # noqa: E402
from launcher.events.goodput import Recovery, run_figures  # noqa: E402

TRAIN = REPO / "bench" / "goodput_train.py"
AUTORESUME = REPO / "scripts" / "autoresume.sh"


def launcher_path(tool: str, peer_python: str | None) -> Path:
    python = Path(peer_python or "") if tool == "nvrx" else Path(sys.executable)
    if tool == "nvrx" and not peer_python:
        raise SystemExit("goodput: tool nvrx needs --peer-python (the NVRx venv's python)")
    path = python.parent / "ft_launcher"
    if not path.exists():
        raise SystemExit(f"goodput: no ft_launcher next to {python} (install the package into that venv)")
    return path


def build_command(tool: str, args: argparse.Namespace, run_dir: Path, faults: int) -> list[str]:
    launcher_args = [
        "--nproc-per-node", "2", "--max-restarts", str(faults + 2), "--monitor-interval", "0.1",
        "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", str(args.hb_timeout),
    ]
    if tool == "ours":
        launcher_args += ["--warm-preload", "torch,torch.distributed,lightning.pytorch"]
    elif tool == "ours_cold":
        launcher_args += ["--no-warm-restarts"]
    if tool != "nvrx":
        launcher_args += ["--ft-event-log", str(run_dir / "ft_events.jsonl")]
    command = ["bash", str(AUTORESUME), "--mode", "local", "--run-dir", str(run_dir),
               "--launcher", str(launcher_path(tool, args.peer_python)), "--max-failures", "2",
               "--max-attempts", "3", "--launcher-args", "--standalone"]
    for arg in launcher_args:
        command += ["-a", arg]
    return command + ["--", str(TRAIN), "--run-dir", str(run_dir), "--impl", "nvrx" if tool == "nvrx" else "ours",
                      "--max-steps", str(args.max_steps), "--checkpoint-every", str(args.checkpoint_every),
                      "--step-time", str(args.step_time), "--fault-every", str(args.fault_every),
                      "--max-faults", str(faults), "--fault-rank", "1"]


def run_job(command: list[str], env: dict, timeout: float, log_path: Path) -> tuple[object, float, float, int]:
    """Run autoresume.sh in its own session; stop it (SIGTERM, then SIGKILL) past ``timeout``.

    Returns the exit code (or "timeout"), start and end times, and how many processes the job
    left behind (this process, a child subreaper, kills them).
    """
    started = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: object = proc.wait(timeout=timeout)
            ended = time.time()
        except subprocess.TimeoutExpired:
            ended = time.time()
            code = "timeout"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # autoresume.sh stops its launcher
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, started, ended, len(kill_descendants())


def analyse(run_dir: Path, started: float, ended: float, max_steps: int) -> dict:
    """Goodput and recovery figures from rank 0's progress log and the fault records."""
    bench = run_dir / "bench"
    starts: dict[int, float] = {}
    fit_ends: list[float] = []
    steps: list[tuple[int, int, float]] = []  # (pid, step, time) in log order
    for line in (bench / "progress.log").read_text().splitlines() if (bench / "progress.log").exists() else []:
        fields = line.split()
        if fields[0] == "start":
            starts[int(fields[1])] = float(fields[2])
        elif fields[0] == "step":
            steps.append((int(fields[1]), int(fields[2]), float(fields[3])))
        elif fields[0] == "end":
            fit_ends.append(float(fields[3]))
    faults = sorted((json.loads(p.read_text()) for p in bench.glob("fault_*.json")), key=lambda f: f["time"])

    # Step durations within each process; a process's first step counts at its median.
    by_pid: dict[int, list[tuple[int, float]]] = {}
    for pid, step, t in steps:
        by_pid.setdefault(pid, []).append((step, t))
    durations: dict[tuple[int, int], float] = {}
    for pid, entries in by_pid.items():
        gaps = [b[1] - a[1] for a, b in zip(entries, entries[1:], strict=False)]
        typical = statistics.median(gaps) if gaps else 0.0
        durations[(pid, entries[0][0])] = typical
        for (_, t0), (step, t1) in zip(entries, entries[1:], strict=False):
            durations[(pid, step)] = t1 - t0
    last_completion: dict[int, tuple[int, float]] = {}
    for pid, step, t in steps:
        last_completion[step] = (pid, t)
    useful = sum(durations[(pid, step)] for step, (pid, _) in last_completion.items() if step <= max_steps)
    completed = max(last_completion) if last_completion else 0

    recoveries = []
    for fault in faults:
        after = [(pid, step, t) for pid, step, t in steps if t > fault["time"] and starts.get(pid, 0) > fault["time"]]
        if not after:
            continue
        pid, step, t = after[0]
        before = [s for p, s, tt in steps if tt <= fault["time"]]
        recoveries.append({
            "fault": fault["fault"], "kind": fault["kind"], "fault_step": fault["step"], "fault_time": fault["time"],
            "to_process_started_s": round(starts[pid] - fault["time"], 3),
            "to_first_step_s": round(t - fault["time"], 3),
            "steps_redone": (max(before) if before else 0) - (step - 1),
        })
    # The arithmetic is ft_report's too (launcher/events/goodput.py): one definition of the figures.
    figures = run_figures(started, ended, useful, [
        Recovery(kind=r["kind"], failed_at=r["fault_time"], recovered_at=r["fault_time"] + r["to_first_step_s"],
                 restarted_at=r["fault_time"] + r["to_process_started_s"]) for r in recoveries],
        kinds=("hang", "kill"))
    return {
        "wall_s": figures["wall_s"],
        "useful_step_s": figures["useful_s"],
        "goodput": figures["goodput"],
        "steps_completed": completed,
        "processes_rank0": len(starts),
        "faults_injected": len(faults),
        "faults_recovered": len(recoveries),
        "mttr_s": figures["mttr_s"],
        "mttr_by_kind_s": figures["mttr_by_kind_s"],
        "fault_to_process_started_by_kind_s": figures["to_restart_by_kind_s"],
        "recoveries": recoveries,
        "median_step_s": round(statistics.median(durations.values()), 5) if durations else None,
        # Where the rest of a fault-free run's wall time goes: before the first step, after the last.
        "start_to_first_step_s": round(steps[0][2] - started, 2) if steps else None,
        "last_step_to_exit_s": round(ended - steps[-1][2], 2) if steps else None,
        # of which: rank 0's trainer.fit returned -> autoresume.sh exited (process and launcher exit)
        "fit_returned_to_exit_s": round(ended - fit_ends[-1], 2) if fit_ends else None,
    }


def one_run(tool: str, args: argparse.Namespace, faults: int, keep_dir: Path | None) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"ftb-goodput-{tool}-"))
    try:
        run_dir = base / "run"
        tmp = base / "tmp"
        run_dir.mkdir()
        tmp.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore",
               "TMPDIR": str(tmp)}
        env.pop("FAULT_TOL_FINISHED_FLAG_FILE", None)
        command = build_command(tool, args, run_dir, faults)
        code, started, ended, leftovers = run_job(command, env, args.run_timeout, base / "job.log")
        result = {"tool": tool, "faults_planned": faults, "exit_code": code, "processes_left_behind": leftovers,
                  "finished_flag": (run_dir / "finished.flag").exists(),
                  **analyse(run_dir, started, ended, args.max_steps)}
        history = run_dir / "history.tsv"
        result["autoresume_attempts"] = max(0, len(history.read_text().splitlines()) - 1) if history.exists() else 0
        # Every restart (in-job or a new attempt) starts a new rank-0 process: the ones that no
        # planned fault explains are failures of the tool (or of the machine).
        result["unplanned_restarts"] = max(0, result["processes_rank0"] - 1 - result["faults_injected"])
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(base / "job.log", keep_dir / f"goodput_{tool}_{faults}f_{int(started)}.log")
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", nargs="+", choices=("ours", "ours_cold", "nvrx"), default=None,
                        help="ours, ours_cold (--no-warm-restarts) and/or nvrx (default: ours, + nvrx with "
                        "--peer-python)")
    parser.add_argument("--peer-python", default=None, help="interpreter of the venv with NVRx installed")
    parser.add_argument("--runs", type=int, default=2, help="runs with faults per tool (alternating tools)")
    parser.add_argument("--baseline-runs", type=int, default=1, help="fault-free runs per tool")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.015)
    parser.add_argument("--fault-every", type=float, default=6.0)
    parser.add_argument("--max-faults", type=int, default=4)
    parser.add_argument("--hb-timeout", type=float, default=3.0, help="rank_heartbeat_timeout, both tools")
    parser.add_argument("--run-timeout", type=float, default=300.0, help="stop a run after this many seconds")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each run's output here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tools = args.tools or (["ours", "nvrx"] if args.peer_python else ["ours"])
    become_subreaper()
    runs: dict[str, list[dict]] = {tool: [] for tool in tools}
    baselines: dict[str, list[dict]] = {tool: [] for tool in tools}
    for run in range(max(args.runs, args.baseline_runs)):
        order = tools if run % 2 == 0 else list(reversed(tools))
        for tool in order:
            if run < args.runs:
                runs[tool].append(one_run(tool, args, args.max_faults, args.log_dir))
        for tool in order:
            if run < args.baseline_runs:
                baselines[tool].append(one_run(tool, args, 0, args.log_dir))

    def figures(results: list[dict]) -> dict:
        ok = [r for r in results if r["finished_flag"]]
        out = {"runs": len(results), "finished": len(ok),
               "faults_injected": sum(r["faults_injected"] for r in results),
               "faults_recovered": sum(r["faults_recovered"] for r in results),
               "unplanned_restarts": sum(r["unplanned_restarts"] for r in results),
               "steps_redone_per_fault": summarize([x["steps_redone"] for r in ok for x in r["recoveries"]], 1)
               if any(r["recoveries"] for r in ok) else None}
        for key in ("goodput", "wall_s", "mttr_s", "start_to_first_step_s", "last_step_to_exit_s",
                    "fit_returned_to_exit_s", "useful_step_s"):
            values = [r[key] for r in ok if r[key] is not None]
            out[key] = summarize(values, 4) if values else None
        for kind in ("hang", "kill"):
            values = [r["mttr_by_kind_s"][kind] for r in ok if r["mttr_by_kind_s"][kind] is not None]
            out[f"mttr_{kind}_s"] = summarize(values, 3) if values else None
            values = [r["fault_to_process_started_by_kind_s"][kind] for r in ok
                      if r["fault_to_process_started_by_kind_s"][kind] is not None]
            out[f"to_process_started_{kind}_s"] = summarize(values, 3) if values else None
        return out

    result = {
        "settings": {k: getattr(args, k) for k in ("max_steps", "checkpoint_every", "step_time", "fault_every",
                                                   "max_faults", "hb_timeout", "runs", "baseline_runs")},
        "tools": {tool: {"with_faults": figures(runs[tool]), "fault_free": figures(baselines[tool]),
                         "runs": runs[tool], "baseline_runs": baselines[tool]} for tool in tools},
    }
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
