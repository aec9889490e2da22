"""Goodput under faults, realistic configuration (issue 32): what each fault costs, with and without
just-in-time state, side by side with NVRx.

``bench/goodput.py`` measures recovery on a toy state whose checkpoints cost milliseconds and come
every 2 s. Here the state is what makes a failure expensive: ``bench/goodput_realistic_train.py``
trains a 2-rank DDP loop (gloo, CPU) whose model and optimizer state is 210 MB, writes a real
checkpoint (``torch.save`` of the whole state, about 0.5-1 s here) every ``--checkpoint-every`` 500
steps, and its rank 1 makes ``--faults`` faults at random steps (``--seed``): hangs (``SIGSTOP``) and
crashes (``SIGKILL``), alternately. The same faults at the same steps for every tool:

- ``ours_nojit``: ft_launcher with ``--ft-jit-state false``: every fault resumes from the last
  periodic checkpoint;
- ``ours_jit``: ft_launcher as it ships (just-in-time state on), the loop calling ``track_state`` /
  ``load_jit_state``: the survivors save their state before they are stopped;
- ``nvrx``: NVRx 0.4.1's ft_launcher (``--peer-python``, the venv of ``make bench-peer``): resumes
  from the periodic checkpoint.

Each runs under ``scripts/autoresume.sh --mode local`` with in-job restarts, as ``goodput.py`` does,
with the same heartbeat timeouts for every tool (``--hb-timeout``) and ``--monitor-interval 0.1``.

Per fault, from rank 0's progress log, the fault records and (ours) the launcher's event log:

- steps lost = the step it failed at - the step the restart resumed from;
- seconds lost = fault -> the step it failed at is completed again, split into *detection* (fault ->
  the launcher's failure record: its monitor saw the crash or the hang's deadline), *save* (detection
  -> the ``state_saved`` record: the launcher waited for the survivors' save), *restart* (-> the
  replacement resumed: stop, restart, imports, rendezvous, loading the state) and *redone* (-> the
  failed step completed again). NVRx writes no event log: its detection and restart are one figure;
- goodput = useful step time / wall time as ``goodput.py`` computes it (``analyse``), with faults and
  in a fault-free run of the same tool (``--baseline-runs``); steady-state cost of just-in-time state =
  ours_jit's fault-free step time against ours_nojit's.

Run: ``python bench/goodput_realistic.py [--peer-python .venv-peer/bin/python] [--json]``; ``--quick``:
a small state and a short run (a functional check, used by tests/integration/test_goodput_realistic.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import REPO, become_subreaper, emit, summarize  # noqa: E402
from bench.goodput import analyse, launcher_path, run_job  # noqa: E402

TRAIN = REPO / "bench" / "goodput_realistic_train.py"
AUTORESUME = REPO / "scripts" / "autoresume.sh"
TOOLS = ("ours_nojit", "ours_jit", "nvrx")
QUICK = {"max_steps": 160, "checkpoint_every": 50, "rows": 4096, "faults": 2, "step_time": 0.01, "hb_timeout": 3.0,
         "baseline_runs": 0}
NVRX_MISSING = ("NVRx not measured: no --peer-python given (its venv: `make bench-peer` installs "
                "nvidia-resiliency-ext 0.4.1 into .venv-peer)")


def plan_faults(seed: int, count: int, max_steps: int, checkpoint_every: int) -> list[dict[str, Any]]:
    """``count`` faults at random steps (seeded), one in each of ``count`` equal stretches of the
    run, alternately hangs and kills; none in the first tenth of a checkpoint interval (the restart's
    own first steps) nor in the last 20 steps."""
    rng = random.Random(seed)
    low, high = max(1, checkpoint_every // 10), max_steps - 20
    if count <= 0 or high - low < count:
        return []
    width = (high - low) / count
    return [{"step": rng.randrange(int(low + k * width), int(low + (k + 1) * width)),
             "kind": "hang" if k % 2 == 0 else "kill"} for k in range(count)]


def build_command(tool: str, args: argparse.Namespace, run_dir: Path, faults: list[dict[str, Any]]) -> list[str]:
    """autoresume.sh around the tool's ft_launcher around the training job."""
    launcher_args = [
        "--nproc-per-node", "2", "--max-restarts", str(len(faults) + 2), "--monitor-interval", "0.1",
        "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", str(args.hb_timeout),
    ]
    if tool != "nvrx":
        launcher_args += ["--warm-preload", "torch,torch.distributed,torch._dynamo",
                          "--ft-event-log", str(run_dir / "ft_events.jsonl"),
                          "--ft-jit-state", "true" if tool == "ours_jit" else "false"]
    command = ["bash", str(AUTORESUME), "--mode", "local", "--run-dir", str(run_dir),
               "--launcher", str(launcher_path("nvrx" if tool == "nvrx" else "ours", args.peer_python)),
               "--max-failures", "2", "--max-attempts", "3", "--launcher-args", "--standalone"]
    for arg in launcher_args:
        command += ["-a", arg]
    command += ["--", str(TRAIN), "--run-dir", str(run_dir), "--impl", "nvrx" if tool == "nvrx" else "ours",
                "--max-steps", str(args.max_steps), "--checkpoint-every", str(args.checkpoint_every),
                "--step-time", str(args.step_time), "--rows", str(args.rows), "--faults", json.dumps(faults)]
    return command + (["--jit"] if tool == "ours_jit" else [])


def read_progress(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill
    return found


def fault_costs(progress: list[list[str]], faults: list[dict[str, Any]],
                events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recorded fault's cost (see the module docstring), from the progress lines, the fault
    records and the launcher's event records (none for NVRx)."""
    resumes = [(int(f[1]), int(f[2]), f[3], float(f[4])) for f in progress if f[0] == "resume"]
    steps = [(int(f[1]), int(f[2]), float(f[3])) for f in progress if f[0] == "step"]
    roots = sorted(float(e["detected_at"]) for e in events if e.get("event") == "failure"
                   and e.get("role") == "root" and e.get("detected_at") is not None)
    saved = sorted((float(e["ts"]), e) for e in events if e.get("event") == "state_saved")
    costs = []
    for fault in sorted(faults, key=lambda f: f["time"]):
        after = [r for r in resumes if r[3] > fault["time"]]
        if not after:
            continue
        pid, resumed_step, source, resumed_at = after[0]
        step = fault["step"]
        again = [t for p, s, t in steps if p == pid and s == step]
        done_again = resumed_at if resumed_step >= step else (again[0] if again else None)
        detected = next((t for t in roots if t >= fault["time"] - 0.5), None)
        detection = None if detected is None else max(0.0, detected - fault["time"])
        save = None
        if detected is not None:
            late = [ts for ts, e in saved if detected - 1.0 <= ts <= resumed_at]
            save = max(0.0, late[0] - detected) if late else 0.0
        restart = resumed_at - fault["time"] - (detection or 0.0) - (save or 0.0)
        costs.append({
            "fault": fault["fault"], "kind": fault["kind"], "step": step, "resumed_step": resumed_step,
            "source": source, "steps_lost": step - resumed_step,
            "detection_s": None if detection is None else round(detection, 3),
            "save_s": None if save is None else round(save, 3),
            "restart_s": round(restart, 3),
            "redone_s": None if done_again is None else round(done_again - resumed_at, 3),
            "lost_s": None if done_again is None else round(done_again - fault["time"], 3),
        })
    return costs


def one_run(tool: str, args: argparse.Namespace, faults: list[dict[str, Any]], keep_dir: Optional[Path]) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"ftb-realistic-{tool}-"))
    try:
        run_dir, tmp = base / "run", base / "tmp"
        run_dir.mkdir()
        tmp.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore",
               "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
        env.pop("FAULT_TOL_FINISHED_FLAG_FILE", None)
        load = [os.getloadavg()[0]]
        code, started, ended, leftovers = run_job(build_command(tool, args, run_dir, faults), env, args.run_timeout,
                                                  base / "job.log")
        load.append(os.getloadavg()[0])
        progress = read_progress(run_dir / "bench" / "progress.log")
        recorded = [json.loads(p.read_text()) for p in (run_dir / "bench").glob("fault_*.json")]
        result = {"tool": tool, "faults_planned": len(faults), "exit_code": code, "processes_left_behind": leftovers,
                  "load_average": [round(v, 1) for v in load],
                  "finished_flag": (run_dir / "finished.flag").exists(),
                  **analyse(run_dir, started, ended, args.max_steps)}
        result["fault_costs"] = fault_costs(progress, recorded, _events(run_dir / "ft_events.jsonl"))
        ckpts = [float(f[3]) for f in progress if f[0] == "ckpt"]
        result["checkpoint_s"] = summarize(ckpts, 3) if ckpts else None
        saves = [e for e in _events(run_dir / "ft_events.jsonl") if e.get("event") == "state_saved"]
        result["jit_saves"] = [{k: e.get(k) for k in ("step", "bytes", "seconds", "source")} for e in saves]
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(base / "job.log", keep_dir / f"realistic_{tool}_{len(faults)}f_{int(started)}.log")
            for name in ("ft_events.jsonl", "bench/progress.log"):
                if (run_dir / name).exists():
                    shutil.copy(run_dir / name, keep_dir / f"realistic_{tool}_{len(faults)}f_{int(started)}_"
                                f"{name.replace('/', '_')}")
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _median(values: list[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def tool_figures(with_faults: list[dict], fault_free: list[dict]) -> dict[str, Any]:
    """The side-by-side figures of one tool (medians over its faults and runs)."""
    costs = [c for r in with_faults for c in r["fault_costs"]]
    goodput = _median([r["goodput"] for r in with_faults if r["finished_flag"]])
    baseline = _median([r["goodput"] for r in fault_free if r["finished_flag"]])
    step_s = _median([r["median_step_s"] for r in fault_free if r["finished_flag"]])
    return {
        "runs": len(with_faults), "finished": sum(r["finished_flag"] for r in with_faults),
        "faults_injected": sum(r["faults_injected"] for r in with_faults), "faults_recovered": len(costs),
        "steps_lost_median": _median([c["steps_lost"] for c in costs]),
        "steps_lost_max": max((c["steps_lost"] for c in costs), default=None),
        **{f"{part}_median_s": _median([c[f"{part}_s"] for c in costs])
           for part in ("lost", "detection", "save", "restart", "redone")},
        "goodput": goodput, "goodput_fault_free": baseline,
        "goodput_ratio": round(goodput / baseline, 3) if goodput and baseline else None,
        "fault_free_step_s": step_s,
        "checkpoint_s": _median([r["checkpoint_s"]["median"] for r in with_faults + fault_free if r["checkpoint_s"]]),
        "unplanned_restarts": sum(max(0, r["processes_rank0"] - 1 - r["faults_injected"]) for r in with_faults),
        "processes_left_behind": sum(r["processes_left_behind"] for r in with_faults + fault_free),
    }


def _cell(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def table(figures: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md: one column per tool."""
    names = {"ours_nojit": "ours, no JIT", "ours_jit": "ours, JIT", "nvrx": "NVRx 0.4.1"}
    rows = [("faults recovered / injected", lambda f: f"{f['faults_recovered']}/{f['faults_injected']}"),
            ("steps lost per fault (median / max)", lambda f: f"{_cell(f['steps_lost_median'])} / "
                                                              f"{_cell(f['steps_lost_max'])}"),
            ("seconds lost per fault (median)", lambda f: _cell(f["lost_median_s"], " s")),
            ("- detection", lambda f: _cell(f["detection_median_s"], " s")),
            ("- save (just-in-time state)", lambda f: _cell(f["save_median_s"], " s")),
            ("- restart (stop, start, load)", lambda f: _cell(f["restart_median_s"], " s")),
            ("- redone work", lambda f: _cell(f["redone_median_s"], " s")),
            ("goodput with faults", lambda f: _cell(f["goodput"])),
            ("goodput fault-free", lambda f: _cell(f["goodput_fault_free"])),
            ("with faults / fault-free", lambda f: _cell(f["goodput_ratio"])),
            ("fault-free step time (median)", lambda f: _cell(f["fault_free_step_s"], " s")),
            ("periodic checkpoint, torch.save (median)", lambda f: _cell(f["checkpoint_s"], " s")),
            ("unplanned restarts", lambda f: str(f["unplanned_restarts"]))]
    tools = list(figures)
    lines = ["| | " + " | ".join(names.get(t, t) for t in tools) + " |", "| --- |" + " --- |" * len(tools)]
    lines += [f"| {label} | " + " | ".join(cell(figures[t]) for t in tools) + " |" for label, cell in rows]
    return "\n".join(lines)


DOC_TITLE = "Goodput under faults, realistic: 210 MB of state, with and without just-in-time state"


def doc_section(result: dict) -> list[str]:
    """docs/benchmarks.md's section for one result of this script (``bench/run_all.py`` renders it):
    the title, what ran, the side-by-side table, what is not measured."""
    s = result["settings"]
    faults = ", ".join(f"{f['kind']} at step {f['step']}" for f in result["planned_faults"]) or "none"
    out = [DOC_TITLE,
           f"`bench/goodput_realistic.py`: a 2-rank DDP loop on CPU (`bench/goodput_realistic_train.py`, gloo) whose "
           f"model and optimizer state is {result['state_mb']:.0f} MB (an embedding table of {s['rows']} x 64 floats "
           f"with sparse gradients and Adagrad's state of the same size), {s['step_time'] * 1000:.0f} ms of sleep per "
           f"step standing in for compute, trains {s['max_steps']} steps; rank 0 writes a real checkpoint "
           f"(`torch.save` of the whole state) every {s['checkpoint_every']} steps. Rank 1 makes the same "
           f"{len(result['planned_faults'])} faults in every run with faults, at random steps (seed {s['seed']}): "
           f"{faults}. `scripts/autoresume.sh --mode local` around each tool's `ft_launcher` (in-job restarts), "
           f"`rank_heartbeat_timeout` {s['hb_timeout']:g} s for every tool; ours with `--warm-preload "
           f"torch,torch.distributed,torch._dynamo` (DDP's constructor imports `torch._dynamo`: 13 s on this loaded "
           f"machine). {s['runs']} run(s) with faults and {s['baseline_runs']} without per tool.",
           "",
           "- **steps lost** = the step it failed at − the step the restart resumed from; **seconds lost** = fault → "
           "that step completed again, split into *detection* (→ the launcher's failure record), *save* (→ its "
           "`state_saved` record: the launcher waited for the survivors' save), *restart* (→ the replacement "
           "resumed: stop, restart, imports, rendezvous, DDP, loading the state) and *redone* work (→ the failed "
           "step completed again). NVRx writes no event log: its detection is in its restart figure.",
           "- **goodput** = useful step time / wall time (as in the section above); the ratio compares it with a "
           "fault-free run of the same tool. Medians over the faults.",
           "", result["table"], ""]
    load = result.get("load_average")
    out += [f"Other processes loaded the machine (1-minute load average {load[0]:g}–{load[1]:g} on "
            f"{result.get('cores', '?')} cores, sampled during the runs): the steps of one run were up to twice as "
            "slow as another's, and a slower step makes the fixed start-up a smaller share of the wall time, so the "
            "goodput figures compare poorly between runs; the seconds per fault compare better, the steps lost "
            "per fault do not depend on the load." if load else
            "Goodput depends on the machine's load (a slower step makes the fixed start-up a smaller share of "
            "the wall time): the seconds per fault compare better, the steps lost per fault do not depend on it.",
            ""]
    if result.get("nvrx"):
        out += [f"**{result['nvrx']}**", ""]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=None,
                        help="default: ours_nojit ours_jit, and nvrx with --peer-python")
    parser.add_argument("--peer-python", default=None, help="interpreter of the venv with NVRx installed")
    parser.add_argument("--runs", type=int, default=1, help="runs with faults per tool")
    parser.add_argument("--baseline-runs", type=int, default=1, help="fault-free runs per tool")
    parser.add_argument("--max-steps", type=int, default=1200)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--step-time", type=float, default=0.01)
    parser.add_argument("--rows", type=int, default=409_600, help="embedding rows: state = rows x 512 bytes")
    parser.add_argument("--faults", type=int, default=2, help="faults per run, alternately hang and kill")
    parser.add_argument("--seed", type=int, default=0, help="of the fault steps")
    parser.add_argument("--hb-timeout", type=float, default=5.0, help="rank_heartbeat_timeout, every tool")
    parser.add_argument("--run-timeout", type=float, default=400.0)
    parser.add_argument("--quick", action="store_true",
                        help="a functional check, the options not given set to " + json.dumps(QUICK))
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each run's output here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:  # its values, except where given on the command line
        unset = object()  # argparse leaves attributes the namespace already has when not given
        given = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(QUICK, unset)))
        for key, value in QUICK.items():
            if getattr(given, key) is unset:
                setattr(args, key, value)
    tools = args.tools or [t for t in TOOLS if t != "nvrx" or args.peer_python]
    if "nvrx" in tools and not args.peer_python:
        parser.error("--tools nvrx needs --peer-python")
    become_subreaper()
    faults = plan_faults(args.seed, args.faults, args.max_steps, args.checkpoint_every)
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    baselines: dict[str, list[dict]] = {t: [] for t in tools}
    for index in range(max(args.runs, args.baseline_runs)):
        order = tools if index % 2 == 0 else list(reversed(tools))
        for tool in order:
            if index < args.runs:
                runs[tool].append(one_run(tool, args, faults, args.log_dir))
            if index < args.baseline_runs:
                baselines[tool].append(one_run(tool, args, [], args.log_dir))
    figures = {t: tool_figures(runs[t], baselines[t]) for t in tools}
    result = {
        "settings": {k: getattr(args, k) for k in ("max_steps", "checkpoint_every", "step_time", "rows", "faults",
                                                   "seed", "hb_timeout", "runs", "baseline_runs")},
        "state_mb": round(args.rows * 64 * 4 * 2 / 1e6, 1), "planned_faults": faults, "cores": os.cpu_count(),
        "nvrx": None if "nvrx" in tools else NVRX_MISSING,
        "load_average": [min(v for t in tools for r in runs[t] + baselines[t] for v in r["load_average"]),
                         max(v for t in tools for r in runs[t] + baselines[t] for v in r["load_average"])]
        if any(runs[t] + baselines[t] for t in tools) else None,
        "figures": figures, "table": table(figures),
        "runs": {t: runs[t] + baselines[t] for t in tools},
    }
    emit(result, args.json)
    if not args.json:
        print("\n" + result["table"] + ("\n\n" + NVRX_MISSING if "nvrx" not in tools else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
