"""Soak: a long 2-rank job with realistic jitter under calculated timeouts; false kills and the
detection latency of real hangs.

Runs ``bench/soak_train.py`` (see its docstring: heavy-tailed step times, 0.5-3 s pauses, a slow
first step per run, an evaluation every N steps, checkpoints of 0.2-3 s) under
``scripts/autoresume.sh --mode local`` and ``ft_launcher`` with 2 ranks, gloo on CPU, for
``--duration`` seconds of job time. The section timeouts start configured (generous) and are
calculated by the job itself (``calculate_timeouts=True``: ``step`` and ``checkpointing`` after the
first checkpoint, ``setup`` and out-of-section in every run that resumed), bounded below by the
``min_calculated_*`` config fields: their defaults, or ``--minimums old`` (1 s, 10 s for the
initial heartbeat: what the client applied before these fields existed).

Along the way:

- ``--resume-at`` seconds after the start the driver sends SIGUSR1 to autoresume.sh: the graceful
  stop saves, every rank exits 0, and the next attempt resumes (a resume in the middle);
- ``--hangs`` plans real hangs (``kind@seconds``, kind ``step``, ``checkpointing`` or
  ``out_of_section``; alternately on rank 1 and rank 0): the rank sleeps there until its monitor
  stops it and ft_launcher restarts the group.

Reported: **false kills** (failures ft_launcher recorded in a cycle without an injected hang:
a healthy rank stopped; goal 0), and for each injected hang the **detection latency** (hang start
-> first failure record of its cycle), with the timeout that fired and which rank it named; also
the jitter that actually happened (pauses, the longest step seen) and the timeouts in force at
the end. ``--json`` prints one JSON object.

Run: ``python bench/soak.py [--duration 660] [--minimums default|old] [--json]`` (about
``--duration`` plus a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import REPO, become_subreaper, emit, kill_descendants  # noqa: E402
from launcher.events.records import CycleStart, Failure, read_events  # noqa: E402

AUTORESUME = REPO / "scripts" / "autoresume.sh"
TRAIN = REPO / "bench" / "soak_train.py"
OLD_MINIMUMS = {"min_calculated_initial_heartbeat_timeout": 10, "min_calculated_heartbeat_timeout": 1,
                "min_calculated_section_timeout": 1, "min_calculated_out_of_section_timeout": 1}
CONFIGURED = {"setup": 600, "step": 600, "checkpointing": 600, "out_of_section": 600}


def parse_hangs(text: str) -> list[dict]:
    hangs = []
    for index, item in enumerate(t for t in text.split(",") if t):
        kind, _, at = item.partition("@")
        if kind not in ("step", "checkpointing", "out_of_section"):
            raise SystemExit(f"--hangs: unknown kind {kind!r} in {item!r} (step, checkpointing, out_of_section)")
        hangs.append({"at": float(at), "rank": 1 if index % 2 == 0 else 0, "where": kind})
    return hangs


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=660.0, help="seconds of job time (>= 600 for the soak)")
    parser.add_argument("--resume-at", type=float, default=None, help="SIGUSR1 to autoresume.sh then (default: 40%%)")
    parser.add_argument("--hangs", default=None,
                        help="kind@seconds,... (default: step@20%%,checkpointing@55%%,out_of_section@75%%)")
    parser.add_argument("--minimums", choices=("default", "old"), default="default")
    parser.add_argument("--step-time", type=float, default=0.05, help="median seconds of compute per step")
    parser.add_argument("--pause-p", type=float, default=0.01, help="probability of a 0.5-3 s pause per step and rank")
    parser.add_argument("--tail-p", type=float, default=0.02, help="probability of a Pareto-tailed step")
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--eval-steps", type=int, default=20)
    parser.add_argument("--ckpt-every", type=int, default=150)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the run here (default: a temp dir)")
    parser.add_argument("--log", type=Path, default=None, help="append the job's output here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    d = args.duration
    resume_at = 0.4 * d if args.resume_at is None else args.resume_at
    hangs = parse_hangs(args.hangs if args.hangs is not None
                        else f"step@{0.2 * d:.0f},checkpointing@{0.55 * d:.0f},out_of_section@{0.75 * d:.0f}")

    become_subreaper()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="soak-"))
    run_dir = work / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    events_path = run_dir / "events.jsonl"
    start = time.time()
    plan = {"start": start, "duration": d, "hangs": hangs, "seed": args.seed, "step_time": args.step_time,
            "pause_p": args.pause_p, "tail_p": args.tail_p, "eval_every": args.eval_every,
            "eval_steps": args.eval_steps, "ckpt_every": args.ckpt_every}
    (work / "plan.json").write_text(json.dumps(plan))
    sections = ",".join(f"{k}:{v}" for k, v in CONFIGURED.items() if k != "out_of_section")
    ft_params = {"initial_rank_heartbeat_timeout": "null", "rank_heartbeat_timeout": "null",
                 "rank_section_timeouts": sections, "rank_out_of_section_timeout": CONFIGURED["out_of_section"]}
    if args.minimums == "old":
        ft_params.update(OLD_MINIMUMS)
    launcher_args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "20", "--monitor-interval", "0.1",
                     "--ft-event-log", str(events_path)]
    launcher_args += [f"--ft-param-{k}={v}" for k, v in ft_params.items()]
    command = ["bash", str(AUTORESUME), "--mode", "local", "--run-dir", str(run_dir), "--max-failures", "3",
               "--launcher", str(Path(sys.executable).parent / "ft_launcher"),
               "--launcher-args", " ".join(launcher_args), "--", str(TRAIN), "--run-dir", str(run_dir),
               "--plan", str(work / "plan.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    log = open(args.log, "ab") if args.log else open(work / "job.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    resumed_sent = None
    deadline = start + d + 900
    try:
        while proc.poll() is None:
            now = time.time()
            if resumed_sent is None and now - start >= resume_at:
                os.kill(proc.pid, signal.SIGUSR1)  # the walltime warning: graceful stop, then a new attempt
                resumed_sent = now
            if now > deadline:
                raise RuntimeError(f"the soak job did not end within {d + 900:.0f} s (see {work})")
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_descendants()
        log.close()
    wall = time.time() - start
    result = analyse(run_dir, events_path, plan, hangs, resumed_sent)
    result.update(wall_s=round(wall, 1), exit_code=proc.returncode, minimums=args.minimums,
                  settings={k: plan[k] for k in ("duration", "step_time", "pause_p", "tail_p", "eval_every",
                                                  "eval_steps", "ckpt_every", "seed")} | {"resume_at": resume_at},
                  work_dir=str(work))
    emit(result, args.json)
    return 0


def analyse(run_dir: Path, events_path: Path, plan: dict, hangs: list[dict], resumed_sent: float | None) -> dict:
    events = list(read_events(events_path)) if events_path.exists() else []
    bench = run_dir / "bench"
    notes = read_jsonl(bench / "rank0.jsonl") + read_jsonl(bench / "rank1.jsonl")
    markers = sorted((json.loads(p.read_text()) for p in bench.glob("hang_*.json")), key=lambda m: m["started_at"])
    # Launcher runs are told apart by the launcher's pid; cycles within one by their number.
    failures = [e for e in events if isinstance(e, Failure) and e.cause_kind != "terminated"]
    by_cycle: dict[tuple[int | None, int | None], list[Failure]] = {}
    for failure in failures:
        by_cycle.setdefault((failure.pid, failure.cycle), []).append(failure)
    starts = [e for e in events if isinstance(e, CycleStart)]

    def detected(failure: Failure) -> float:
        return failure.detected_at or failure.ts or 0.0

    def cycle_of(moment: float) -> tuple[int | None, int | None] | None:
        before = [e for e in starts if (e.ts or 0.0) <= moment]
        return (before[-1].pid, before[-1].cycle) if before else None

    injected = []
    explained = set()
    for marker in markers:
        key = cycle_of(marker["started_at"])
        # the root's record (the rank the launcher blames), else the earliest
        found = sorted(by_cycle.get(key, []), key=lambda f: (f.effective_role != "root", detected(f)))
        first = found[0] if found else None
        if key is not None and first is not None:
            explained.add(key)
        injected.append({
            "where": marker["where"], "rank": marker["rank"], "step": marker["step"],
            "detected": first is not None,
            "latency_s": None if first is None else round(detected(first) - marker["started_at"], 3),
            "timeout_s": None if first is None else first.timeout,
            "detected_kind": None if first is None else first.hang_kind or first.cause_kind,
            "detected_rank": None if first is None else first.rank,
            "section": None if first is None else first.section,
        })
    false_kills = [f for key, group in by_cycle.items() if key not in explained for f in group]
    pauses = [n for n in notes if n["event"] == "pause"]
    saves = [n for n in notes if n["event"] == "save" and n.get("timeouts")]
    last_timeouts = saves[-1]["timeouts"] if saves else None
    smallest_step_timeout = min((s["timeouts"]["section"].get("step") for s in saves
                                 if s["timeouts"]["section"].get("step") is not None), default=None)
    stops = [n for n in notes if n["event"] == "stop"]
    starts_notes = [n for n in notes if n["event"] == "start"]
    history = (run_dir / "history.tsv").read_text().splitlines()[1:] if (run_dir / "history.tsv").exists() else []
    ends = [n for n in notes if n["event"] == "end"]
    return {
        "false_kills": len(false_kills),
        "false_kill_records": [{k: getattr(f, k) for k in ("cycle", "rank", "cause", "hang_kind", "section", "timeout",
                                                           "elapsed")} for f in false_kills],
        "hangs_planned": len(hangs),
        "hangs": injected,
        "failures_recorded": len(failures),
        "cycles": len(starts),
        "attempts": [line.split("\t")[-1] for line in history],
        "graceful_stop": {"sent_at_s": None if resumed_sent is None else round(resumed_sent - plan["start"], 1),
                          "stopped_at_step": sorted({s["step"] for s in stops}),
                          "ranks_stopped": len(stops)},
        "resumed_at_steps": [n["step"] for n in starts_notes if n["rank"] == 0],
        "pauses": len(pauses),
        "longest_pause_s": max((p["seconds"] for p in pauses), default=0.0),
        "longest_step_s": max((n.get("longest_step_s", 0.0) for n in saves), default=0.0),
        "final_step": ends[0]["step"] if ends else None,
        "timeouts_at_end": last_timeouts,
        "smallest_step_timeout_s": smallest_step_timeout,
        "finished": (run_dir / "finished.flag").exists(),
    }


if __name__ == "__main__":
    sys.exit(main())
