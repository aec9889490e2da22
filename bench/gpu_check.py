"""``make gpu-check``: the GPU path (NCCL, CUDA contexts, CUDA events) in one command (issue 34).

Finds an interpreter whose torch sees CUDA (``--python``, ``GPU_CHECK_PYTHON``, ``.venv/bin/python``,
this one, ``python3`` on PATH), then runs the six scenarios of ``bench/gpu_scenarios`` on the GPUs
it sees, each bounded, all within ``--budget`` seconds (480 by default), prints a table (scenario,
result, figures) and writes it as JSON (``--json``, default ``bench/results/gpu-check.json``).
``--record`` also writes the table into ``docs/benchmarks.md`` and ``bench/gpu_check_last.json``.

Without CUDA it says so in one line and exits 0, every scenario skipped (the JSON is written too).
Exit code 1 when a scenario failed or broke. Needs no network: a missing ``ft_launcher`` command is
made from the interpreter (``python -m launcher``), the repository is put on ``PYTHONPATH``, and a
missing PyYAML/filelock/Lightning is installed with pip only when pip can reach an index.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import become_subreaper  # noqa: E402
from bench.gpu_scenarios import report  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENT = REPO / "bench" / "gpu_scenarios" / "workers" / "environment.py"
LAST = REPO / "bench" / "gpu_check_last.json"


def candidates(explicit: str | None) -> list[str]:
    """Interpreters to try, in order, without duplicates or missing ones."""
    found, seen = [], set()
    for path in (explicit, os.environ.get("GPU_CHECK_PYTHON"), str(REPO / ".venv" / "bin" / "python"),
                 sys.executable, shutil.which("python3")):
        if not path or not os.path.exists(path):
            continue
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            found.append(path)
    return found


def describe(python: str) -> dict:
    """What ``python``'s torch says about CUDA (:mod:`bench.gpu_scenarios.workers.environment`)."""
    try:
        out = subprocess.run([python, str(ENVIRONMENT)], capture_output=True, text=True, timeout=120, check=False)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        info = {"torch": None, "cuda": False, "reason": f"could not ask it: {exc}"}
    return info | {"python": python}


def find_cuda(explicit: str | None) -> dict:
    """The first interpreter with CUDA, else the reasons of every one tried (``cuda`` false)."""
    tried = []
    for python in candidates(explicit):
        info = describe(python)
        if info.get("cuda"):
            return info
        tried.append(f"{python}: {info.get('reason')}")
    return {"cuda": False, "torch": None, "reason": "; ".join(tried) or "no Python interpreter found"}


def ensure_modules(python: str, modules: dict[str, str]) -> list[str]:
    """Import ``modules`` (import name -> pip name) in ``python``; pip-install the missing (bounded).

    Returns the import names still missing afterwards.
    """
    def missing() -> list[str]:
        code = ("import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] "
                "if importlib.util.find_spec(m) is None))")
        out = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=60, check=False)
        return out.stdout.split()

    absent = missing()
    if absent:
        print(f"gpu-check: installing {', '.join(modules[m] for m in absent)} for {python}", flush=True)
        try:
            subprocess.run([python, "-m", "pip", "install", "-q", *(modules[m] for m in absent)],
                           timeout=180, check=False)
        except subprocess.TimeoutExpired:
            pass
        absent = missing()
    return absent


def launcher_shim(python: str, folder: Path) -> Path:
    """A folder with an ``ft_launcher`` command running ``python -m launcher`` (for ``make demo``)."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "ft_launcher"
    shim.write_text(f'#!/bin/sh\nexec "{python}" -m launcher "$@"\n')
    shim.chmod(0o755)
    return folder


def run_all(env_info: dict, only: list[str], budget_s: float, work: Path) -> list[report.Result]:
    """Every chosen scenario on this machine's GPUs, in order, within ``budget_s``."""
    from bench.gpu_scenarios import decide, scenarios

    python = env_info["python"]
    gpus = len(env_info.get("devices", []))
    absent = ensure_modules(python, {"yaml": "pyyaml", "filelock": "filelock"})
    if absent:
        return report.all_skipped(f"{python} lacks {', '.join(absent)} and pip could not install it", only)
    lightning = env_info.get("lightning")
    if "examples_gpu" in only and not lightning and not ensure_modules(python, {"lightning": "lightning"}):
        lightning = "installed"
    bin_dir = launcher_shim(python, work / "bin")
    ctx = scenarios.Context(python=python, gpus=gpus, work=work, deadline=time.monotonic() + budget_s,
                            env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
    needs_two = [i for i in only if report.BY_ID[i].ranks == 2]
    if gpus == 1 and needs_two:
        ok, said = scenarios.probe_two_ranks_one_gpu(ctx)
        env_info["two_ranks_one_gpu"] = ok if ok else f"refused: {said}"
        ctx.two_ranks = decide.two_rank_plan(gpus, ok, said)
    runners = {"nccl_hang": scenarios.nccl_hang, "gpu_memory": scenarios.gpu_memory,
               "warm_template": scenarios.warm_template, "straggler_cuda": scenarios.straggler_cuda,
               "examples_gpu": lambda c: scenarios.examples_gpu(c, lightning),
               "jit_state_gpu": scenarios.jit_state_gpu}
    results = []
    for scenario_id in only:
        if ctx.left() < 20:
            results.append(report.Result(scenario_id, "skipped", f"time budget of {budget_s:.0f} s spent"))
            continue
        print(f"gpu-check: {scenario_id} ...", flush=True)
        started = time.monotonic()
        try:
            result = runners[scenario_id](ctx)
        except Exception as exc:  # one broken scenario must not lose the others' results
            traceback.print_exc()
            result = report.Result(scenario_id, "error", f"{type(exc).__name__}: {exc}")
        result.seconds = result.seconds or round(time.monotonic() - started, 1)
        print(f"gpu-check: {scenario_id}: {result.result} {result.reason}".rstrip(), flush=True)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=None, help="interpreter whose torch has CUDA (default: found)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "gpu-check.json",
                        help="where the results go (default: bench/results/gpu-check.json)")
    parser.add_argument("--only", nargs="+", choices=[s.id for s in report.SCENARIOS],
                        default=[s.id for s in report.SCENARIOS])
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all scenarios (default 480)")
    parser.add_argument("--record", action="store_true",
                        help="also write the table into docs/benchmarks.md and bench/gpu_check_last.json")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs of every run)")
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    started = time.monotonic()
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    env_info = find_cuda(args.python)
    if not env_info.get("cuda"):
        results = report.all_skipped("no CUDA", args.only)
        report.write_json(args.json, report.to_json(results, env_info, time.monotonic() - started, date))
        print(f"gpu-check: no CUDA ({env_info.get('reason')}): {len(results)} scenarios skipped; "
              f"results in {args.json}")
        return 0
    devices = env_info.get("devices", [])
    env_info["gpu_summary"] = f"{len(devices)} x {devices[0]}" if devices else "?"
    print(f"gpu-check: {env_info['gpu_summary']}, torch {env_info['torch']}, NCCL {env_info.get('nccl')}, "
          f"python {env_info['python']}", flush=True)
    become_subreaper()  # the workers' orphans come back here, to be counted and ended
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        results = run_all(env_info, args.only, args.budget, work)
    finally:
        if args.keep:
            print(f"gpu-check: logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    document = report.to_json(results, env_info, time.monotonic() - started, date)
    report.write_json(args.json, document)
    print("\n".join(report.table_lines(results)))
    print(f"{report.summary_line(results)}; {document['wall_s']} s; results in {args.json}")
    if args.record:
        report.write_json(LAST, document)
        page = REPO / "docs" / "benchmarks.md"
        page.write_text(report.replace_section(page.read_text(), report.doc_section(document)))
        print(f"gpu-check: recorded in {page} and {LAST}")
    return report.exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
