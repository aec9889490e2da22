"""``make demo``: a 2-rank Lightning training on CPU hangs, is restarted, resumes and finishes.

Run from the repository root (``make demo`` first creates ``.venv``)::

    .venv/bin/python examples/demo/run_demo.py

What it runs: ``scripts/autoresume.sh`` in local mode starts ``ft_launcher`` (2 ranks, gloo on
CPU, one rank monitor per rank) on ``examples/lightning_heartbeats.py``, whose
``FaultToleranceCallback`` sends a heartbeat after every step. A few seconds in, the simulated
fault freezes rank 1 (``SIGSTOP``, as a rank stuck in a collective would be). Its heartbeats stop,
and so do rank 0's, which waits for rank 1 in the gradient all-reduce. The monitors see the
heartbeat timeout pass and stop both ranks; ``ft_launcher`` restarts them; they resume from the
last checkpoint and train to the end; rank 0 creates the finished flag, so ``autoresume.sh``
stops. The demo streams the key lines, then prints a summary built from ``ft_launcher``'s event
log (``--ft-event-log``): what failed and when, how long detection and restart took, and where
the calculated timeouts were saved.

Everything goes to ``--run-dir`` (default ``runs/demo``, replaced on every run): ``demo.log`` (the
full output), ``ft_events.jsonl``, the checkpoints, the timeouts file, ``history.tsv`` and the
flag. Exit code 0 when everything above happened, 1 otherwise (the reason is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
AUTORESUME = REPO / "scripts" / "autoresume.sh"
TRAIN_SCRIPT = REPO / "examples" / "lightning_heartbeats.py"
MARKER = ".ptlr-demo"
HEARTBEAT_TIMEOUT_S = 3.0
STOP_GRACE_S = 30.0

# Output lines worth showing while the demo runs (everything goes to demo.log).
_SHOWN = re.compile(
    r"\[ft_launcher\] |autoresume\.sh: |simulated fault .*(scheduled on this rank|sending)|ERROR: rank"
    r"|training from step|training completed|saved calculated timeouts|cycle \d+: started workers"
)
_FAULT_LINE = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank (?P<rank>\d+)\] .*simulated fault "
    r"(?P<kind>\w+): sending (?P<signal>SIG\w+)"
)
_START_LINE = re.compile(r"\[rank 0\] lightning_heartbeats: training from step (?P<step>\d+) to step (?P<end>\d+)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "demo",
                        help="where everything goes; replaced on every run (default: runs/demo)")
    parser.add_argument("--max-steps", type=int, default=120, help="training is complete at this step")
    parser.add_argument("--fault-delay", type=float, default=4.0,
                        help="seconds from the callback's setup to the simulated hang")
    parser.add_argument("--timeout", type=float, default=170.0,
                        help="stop the run (and fail) if it takes longer than this many seconds")
    parser.add_argument("--quiet", action="store_true", help="do not stream the key lines, print only the summary")
    args = parser.parse_args()
    if args.max_steps < 20:
        parser.error(f"--max-steps must be at least 20 (checkpoints every 10 steps), got {args.max_steps}")
    if args.fault_delay <= 0 or args.timeout <= 0:
        parser.error(f"--fault-delay and --timeout must be positive, got {args.fault_delay} and {args.timeout}")
    return args


def find_launcher() -> str:
    """``ft_launcher`` next to this interpreter (the venv's), else the one on PATH."""
    candidate = Path(sys.executable).parent / "ft_launcher"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("ft_launcher")
    if found is None:
        raise SystemExit("run_demo: ft_launcher not found next to this Python or on PATH; run `make venv` first")
    return found


def prepare_run_dir(run_dir: Path) -> None:
    """Start from an empty run directory, deleting only one that an earlier demo created."""
    if run_dir.exists():
        if not (run_dir / MARKER).exists() and any(run_dir.iterdir()):
            raise SystemExit(f"run_demo: {run_dir} exists and was not created by the demo; "
                             "refusing to delete it (pass another --run-dir)")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / MARKER).write_text("created by examples/demo/run_demo.py; deleted by its next run\n")


def build_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    launcher_args = [
        "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
        # Restarted workers fork from a template that already imported Lightning.
        "--warm-preload", "torch,torch.distributed,lightning.pytorch",
        "--ft-param-initial_rank_heartbeat_timeout", "60",
        "--ft-param-rank_heartbeat_timeout", str(HEARTBEAT_TIMEOUT_S),
        "--ft-event-log", str(run_dir / "ft_events.jsonl"),
    ]
    command = ["bash", str(AUTORESUME), "--mode", "local", "--run-dir", str(run_dir),
               "--launcher", find_launcher(), "--max-failures", "2", "--max-attempts", "3",
               "--launcher-args", "--standalone"]
    for arg in launcher_args:
        command += ["-a", arg]  # one argument each: paths may contain spaces
    return command + [
        "--", str(TRAIN_SCRIPT), "--run-dir", str(run_dir), "--max-steps", str(args.max_steps),
        "--simulate-fault", "rank_hung", "--fault-rank", "1", "--fault-delay", str(args.fault_delay),
    ]


def run(command: list[str], log_path: Path, timeout: float, quiet: bool) -> int:
    """Run ``command`` in its own session, log all output, echo the key lines; stop it on timeout."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # two ranks on a small CPU: no OpenMP spinning
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    deadline = time.monotonic() + timeout
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        try:
            assert proc.stdout is not None
            os.set_blocking(proc.stdout.fileno(), True)
            for line in _lines_until(proc, deadline):
                log.write(line)
                if not quiet and _SHOWN.search(line):
                    print("  | " + line.rstrip()[:200], flush=True)
            if proc.poll() is None:
                print(f"run_demo: still running after {timeout:.0f} s; stopping it", flush=True)
                _stop(proc)
                return 124
            return proc.wait()
        except BaseException:
            _stop(proc)
            raise


def _lines_until(proc: subprocess.Popen[str], deadline: float):
    """Yield output lines until the process closes its output or the deadline passes."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if not selector.select(min(remaining, 1.0)):
                continue
            line = proc.stdout.readline()
            if not line:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                return
            yield line


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the run's process group (autoresume.sh stops the launcher), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# ---------------------------------------------------------------------- summary


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def _clock(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch).strftime("%H:%M:%S.%f")[:-3]


def _fault_times(log_text: str) -> dict[int, tuple[float, str]]:
    """When each rank's simulated fault fired (from the worker's log line), by rank."""
    found = {}
    for line in log_text.splitlines():
        match = _FAULT_LINE.search(line)
        if match:
            stamp = datetime.datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found[int(match["rank"])] = (stamp, match["signal"])
    return found


def summarize(events: list[dict[str, Any]], log_text: str, run_dir: Path, exit_code: int,
              wall_s: float) -> tuple[list[str], list[str]]:
    """Return (summary lines, problems); no problems means the demo showed what it should."""
    lines: list[str] = []
    problems: list[str] = []
    cycles = [e for e in events if e["event"] == "cycle_start"]
    failures = sorted((e for e in events if e["event"] == "failure" and e.get("cause_kind") != "terminated"),
                      key=lambda e: float(e.get("detected_at") or e["ts"]))
    results = [e for e in events if e["event"] == "result"]
    ready = {e["cycle"]: e for e in events if e["event"] == "workers_ready"}
    faults = _fault_times(log_text)

    def row(label: str, text: str) -> None:
        lines.append(f"{label:<14}{text}")

    for rank, (fired, sig) in sorted(faults.items()):
        row("what failed", f"{_clock(fired)}  rank {rank} froze (simulated fault: {sig}, as a rank stuck in "
                           "a collective or a driver call would)")
    first_detection: Optional[float] = None
    for failure in failures:
        detected = float(failure.get("detected_at") or failure["ts"])
        first_detection = detected if first_detection is None else first_detection
        row("detected" if failure is failures[0] else "", f"{_clock(detected)}  cycle {failure['cycle']}, rank "
            f"{failure['rank']} (pid {failure.get('worker_pid')}): {failure['cause']}")
        if failure.get("cause_kind") != "hang":
            continue
        if failure["rank"] in faults:
            row("", f"  = {detected - faults[failure['rank']][0]:.2f} s after it froze; its monitor sent "
                    f"{failure.get('signal')} and ft_launcher decided: {failure['decision']}")
        elif faults:
            frozen, (fired, _sig) = next(iter(sorted(faults.items())))
            row("", f"  = {detected - fired:.2f} s after rank {frozen} froze: rank {failure['rank']} was waiting "
                    f"for it in the gradient all-reduce, so its heartbeats stopped too")
    if not failures:
        row("detected", "nothing")
    restarts = [c for c in cycles if c["cycle"] > 0]
    for cycle in restarts:
        start = float(cycle["ts"])
        text = f"{_clock(start)}  cycle {cycle['cycle']} started"
        if first_detection is not None:
            text += f" {start - first_detection:.2f} s after the hang was detected"
        back = ready.get(cycle["cycle"])
        if back is not None and first_detection is not None:
            text += (f"; both ranks were watched again (connected to their monitors) "
                     f"{float(back['ts']) - first_detection:.2f} s after detection")
        row("restarted", text)
    starts = list(_START_LINE.finditer(log_text))
    if len(starts) >= 2:
        row("resumed", f"cycle {len(cycles) - 1} trained from the checkpoint at step {starts[-1]['step']} to "
                       f"step {starts[-1]['end']} (cycle 0 had started at step {starts[0]['step']})")
    history = run_dir / "history.tsv"
    attempts = history.read_text(encoding="utf-8").splitlines()[1:] if history.exists() else []
    if results:
        result = results[-1]
        row("result", f"{_clock(float(result['ts']))}  ft_launcher: {result['outcome']} after "
                      f"{result.get('cycles')} cycle(s); autoresume.sh: {len(attempts)} attempt(s), last: "
                      f"{attempts[-1].split(chr(9))[-1] if attempts else '-'}")
    flag = run_dir / "finished.flag"
    if flag.exists():
        row("flag file", f"{flag}")
    else:
        problems.append(f"no finished flag at {flag}")
    state = run_dir / "ft_state" / "_ft_state.json"
    if state.exists():
        hb = json.loads(state.read_text(encoding="utf-8")).get("hb_timeouts", {})
        row("timeouts file", f"{state}")
        row("", f"  calculated from this run for the next one: first heartbeat within "
                f"{hb.get('initial') or 0:.2f} s, then every {hb.get('subsequent') or 0:.2f} s "
                f"(this run used {HEARTBEAT_TIMEOUT_S:g} s, from the command line)")
    else:
        problems.append(f"no timeouts file at {state}")
    row("event log", f"{run_dir / 'ft_events.jsonl'}")
    row("full output", f"{run_dir / 'demo.log'}")
    row("wall time", f"{wall_s:.1f} s (autoresume.sh exit code {exit_code})")

    if exit_code != 0:
        problems.append(f"autoresume.sh exited with {exit_code}")
    if not any(f.get("cause_kind") == "hang" for f in failures):
        problems.append("no hang was detected")
    if not restarts:
        problems.append("the workers were never restarted")
    if not results or results[-1]["outcome"] != "succeeded":
        problems.append("the last ft_launcher run did not succeed")
    return lines, problems


def main() -> int:
    args = parse_args()
    run_dir = args.run_dir.resolve()
    prepare_run_dir(run_dir)
    command = build_command(args, run_dir)
    print(f"demo: 2-rank Lightning DDP on CPU under scripts/autoresume.sh and ft_launcher; rank 1 will "
          f"hang about {args.fault_delay:g} s after setup (heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s)",
          flush=True)
    print(f"demo: output in {run_dir / 'demo.log'}", flush=True)
    started = time.monotonic()
    try:
        exit_code = run(command, run_dir / "demo.log", args.timeout, args.quiet)
    except KeyboardInterrupt:
        print("demo: interrupted; the run was stopped", flush=True)
        return 130
    wall_s = time.monotonic() - started
    log_text = (run_dir / "demo.log").read_text(encoding="utf-8", errors="replace")
    lines, problems = summarize(read_events(run_dir / "ft_events.jsonl"), log_text, run_dir, exit_code, wall_s)
    print("\n==== demo summary ====")
    for line in lines:
        print(line)
    if problems:
        print("demo FAILED: " + "; ".join(problems))
        return 1
    print("demo OK: the hang was detected, the workers were restarted, training resumed and finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
