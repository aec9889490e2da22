"""Goodput with a node loss (no survivor on that node): a spare takes its place, healed from a peer or not.

The realistic configuration of ``bench/goodput_realistic.py`` (``bench/goodput_realistic_train.py``: a
DDP loop on CPU, gloo, 210 MB of model and optimizer state, a real ``torch.save`` checkpoint every
``--checkpoint-every`` steps), run as a job of two nodes on this machine: two ft_launchers with a c10d
rendezvous on 127.0.0.1, one rank each, each with its own ``TMPDIR`` (so its own run directory and
node-local just-in-time state directory), plus a third launcher started once the job runs: a spare
waiting in the rendezvous. Node ``a`` hosts the rendezvous store; node ``b`` is lost.

At a seeded step after the first checkpoint (``--seed``), node b's rank records the fault and stops
itself; the bench then SIGKILLs node b's launcher and all of its processes at once: a node loss, no
survivor on that node, nothing saved there. Node a's rank gets gloo's error from its lost peer, its
launcher restarts the workers, the spare joins the next round in b's place:

- ``ours_jit``: ft_launcher as it ships: a's rank saves its just-in-time state in its exception
  path, the spare (no local state) receives it from node a through the rendezvous store (healing),
  and both resume at the step of the loss;
- ``ours_nojit``: ``--ft-jit-state false``: both resume from the last periodic checkpoint.

The periodic checkpoint and the bench's records (rank 0's progress log, the fault record) are in
one directory every node reads, as a global checkpoint on a shared file system would be; the
just-in-time state is only ever node-local.

Per node loss (``goodput_realistic.fault_costs``, from rank 0's progress log and every node's event
log): steps lost, seconds lost split into detection (the loss -> node a's launcher acts: its failure
record, or its restart record when the spare's arrival restarts it first), save
(-> its ``state_saved`` record), heal (the spare's ``state_healed`` transfer), restart (the rest
until the replacement resumed: stop, rendezvous with the spare, start, load) and redone work;
goodput as ``bench/goodput.py`` computes it, with the loss and in a fault-free run of nodes a and b
(``--baseline-runs``). The fault-free run has no spare: a spare that waits when the job ends makes the
node whose rank exits last restart it with the spare (torch's "another node entered the rendezvous"),
redoing the steps since the last checkpoint, while the other node waits in torch's exit barrier
(300 s); seen here on 2026-11-29 (ft_launcher declines such a restart since: docs/multinode.md), not a
cost of a node loss.

Run: ``python bench/goodput_node_loss.py [--json]`` prints the table; ``--quick``: a small state and
a short run (a functional check, used by tests/integration/test_goodput_node_loss.py);
``--peer-python .venv-peer/bin/python`` adds NVRx 0.4.1's ft_launcher (``make bench-peer`` builds that
venv), which resumes from the periodic checkpoint: its local checkpoints do not run here (their
asynchronous save needs CUDA: ``bench/nvrx_local_checkpoint_cpu.py``, docs/local-checkpoints.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._util import REPO, become_subreaper, descendants, emit, kill_descendants, summarize  # noqa: E402
from bench.goodput import analyse, launcher_path  # noqa: E402
from bench.goodput_realistic import TRAIN, _cell, _events, _median, fault_costs, read_progress  # noqa: E402

TOOLS = ("ours_nojit", "ours_jit", "nvrx")
NODES = ("a", "b", "spare")
QUICK = {"max_steps": 240, "checkpoint_every": 80, "rows": 4096, "step_time": 0.01, "hb_timeout": 3.0,
         "baseline_runs": 0}
# the reference scenarios' settings: a lost node's keep-alive lapses after 2 s, a slow start still joins
RDZV_CONF = "join_timeout=60,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2"


def plan_node_loss(seed: int, max_steps: int, checkpoint_every: int) -> int:
    """The step of the node loss: seeded, after the first periodic checkpoint and its restart's
    first steps (so that ours without just-in-time state has a checkpoint to lose work against),
    not in the last 20 steps."""
    low, high = checkpoint_every + max(1, checkpoint_every // 10), max_steps - 20
    if high <= low:
        raise SystemExit(f"goodput_node_loss: --max-steps {max_steps} leaves no step after the first checkpoint "
                         f"(--checkpoint-every {checkpoint_every}) for the node loss")
    return random.Random(seed).randrange(low, high)


def node_command(tool: str, args: argparse.Namespace, name: str, port: int, run_dir: Path, events: Path,
                 faults: list[dict[str, Any]]) -> list[str]:
    """One node's ft_launcher (ours, or NVRx's with ``--peer-python``) around the training job: 2 nodes
    of 1 rank, c10d on 127.0.0.1."""
    impl = "nvrx" if tool == "nvrx" else "ours"
    ours = [] if impl == "nvrx" else ["--warm-preload", "torch,torch.distributed,torch._dynamo",
                                      "--ft-event-log", str(events), "--ft-jit-state",
                                      "true" if tool == "ours_jit" else "false"]
    command = [str(launcher_path(impl, args.peer_python)), "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"node-loss-{port}",
               "--rdzv-conf", f"{RDZV_CONF},is_host={'true' if name == 'a' else 'false'}",
               "--max-restarts", "3", "--monitor-interval", "0.1",
               "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", str(args.hb_timeout),
               *ours, str(TRAIN), "--run-dir", str(run_dir), "--impl", impl, "--max-steps", str(args.max_steps),
               "--checkpoint-every", str(args.checkpoint_every), "--step-time", str(args.step_time),
               "--rows", str(args.rows), "--faults", json.dumps(faults), "--fault-rank", "-1"]
    return command + (["--jit"] if tool == "ours_jit" else [])


def kill_node(pid: int) -> list[int]:
    """SIGKILL a node: its launcher and every process under it (its workers run in sessions of their
    own, so the launcher's process group does not hold them), the launcher first."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)  # it forks no more while its tree is read
    victims = [pid, *descendants(pid)]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    return victims


def _live(pid: int) -> bool:
    """Not a zombie (this process, a subreaper, reaps the killed node's orphans afterwards)."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            return stream.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def _has_event(path: Path, kind: str) -> bool:
    return any(e.get("event") == kind for e in _events(path))


def _wait(condition: Any, deadline: float, procs: dict[str, subprocess.Popen]) -> bool:
    """Poll ``condition`` until it holds, the deadline passes or a launcher exits early."""
    while time.time() < deadline:
        if condition():
            return True
        if any(p.poll() is not None for p in procs.values()):
            return bool(condition())
        time.sleep(0.05)
    return False


def drive(tool: str, args: argparse.Namespace, base: Path, run_dir: Path, loss_step: Optional[int]) -> dict[str, Any]:
    """Start nodes a and b, then the spare; lose node b at its fault record; wait for the end."""
    port = _free_port()
    faults = [{"step": loss_step, "kind": "node"}] if loss_step is not None else []
    procs: dict[str, subprocess.Popen] = {}
    logs, info = {}, {"killed": None, "spare_waiting_at_loss": None}
    deadline = time.time() + args.run_timeout
    events = {name: base / name / "events.jsonl" for name in NODES}

    def start(name: str) -> None:
        tmp = base / name / "tmp"
        tmp.mkdir(parents=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore",
               "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
        for key in [k for k in env if k.startswith(("FT_", "PET_", "TORCHELASTIC_", "FAULT_TOL_"))]:
            del env[key]  # a launcher's own variables, if this runs under one
        logs[name] = open(base / name / "launcher.log", "wb")  # noqa: SIM115 - closed in the caller's finally
        procs[name] = subprocess.Popen(
            node_command(tool, args, name, port, run_dir, events[name], faults if name == "b" else []),
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=logs[name], stderr=subprocess.STDOUT,
            start_new_session=True)

    try:
        progress = run_dir / "bench" / "progress.log"
        start("a")  # the store's host first: the others connect to it (and retry until it listens)
        if tool != "nvrx":  # NVRx writes no event log
            _wait(lambda: _has_event(events["a"], "launcher_start"), deadline, procs)
        start("b")
        _wait(lambda: _has_event(events["b"], "cycle_start") if tool != "nvrx" else progress.exists(), deadline, procs)
        if loss_step is not None:  # the round of a and b is complete: it waits as a spare
            start("spare")
        record = run_dir / "bench" / "fault_0.json"
        while time.time() < deadline and any(procs[n].poll() is None for n in procs if n != "b" or loss_step is None):
            if info["killed"] is None and record.exists() and procs["b"].poll() is None:
                fault = json.loads(record.read_text())
                kill_node(procs["b"].pid)
                info["killed"] = {"after_record_s": round(time.time() - fault["time"], 3)}
                info["spare_waiting_at_loss"] = (_has_event(events["spare"], "monitors_started") if tool != "nvrx"
                                                 else None)  # no event log to tell
            time.sleep(0.05)
        info["exit_codes"] = {name: p.poll() if p.poll() is not None else "timeout" for name, p in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_node(proc.pid)
            proc.wait()
        for log in logs.values():
            log.close()
    info["events"] = [e for name in NODES for e in _events(events[name])]
    return info


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_loss_costs(progress: list[list[str]], fault: Optional[dict[str, Any]],
                    events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The loss's cost: ``goodput_realistic.fault_costs``'s parts, with two differences. Detection
    ends at the first record of a surviving launcher that acted on the loss: its failure record
    (its rank got gloo's error) or its restart record (torch's "another node entered the
    rendezvous": the spare joined first); and the spare's healing is split off the restart."""
    if fault is None:
        return []
    after = [e for e in events if float(e.get("ts", 0)) >= fault["time"] - 0.5]
    acted = sorted([float(e["detected_at"]) for e in after if e.get("event") == "failure" and e.get("detected_at")]
                   + [float(e["ts"]) for e in after if e.get("event") == "restart"])
    known = [{"event": "failure", "role": "root", "detected_at": acted[0]}] if acted else []
    others = [e for e in events if e.get("event") != "failure"]
    costs = fault_costs(progress, [fault], known + others)
    for cost in costs:
        healed = [e for e in after if e.get("event") == "state_healed" and e.get("role") == "received"]
        failed = [e for e in after if e.get("event") == "state_heal_failed"]
        cost["heal_s"] = round(float(healed[0]["seconds"]), 3) if healed else None
        cost["heal_bytes"] = healed[0].get("bytes") if healed else None
        cost["heal_failed"] = failed[0].get("reason") if failed else None
        if cost["heal_s"] is not None:
            cost["restart_s"] = round(cost["restart_s"] - cost["heal_s"], 3)
    return costs


def one_run(tool: str, args: argparse.Namespace, loss_step: Optional[int], keep_dir: Optional[Path]) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"ftb-nodeloss-{tool}-"))
    try:
        run_dir = base / "run"
        run_dir.mkdir()
        load = [os.getloadavg()[0]]
        started = time.time()
        info = drive(tool, args, base, run_dir, loss_step)
        ended = time.time()
        load.append(os.getloadavg()[0])
        progress = read_progress(run_dir / "bench" / "progress.log")
        record = run_dir / "bench" / "fault_0.json"
        fault = json.loads(record.read_text()) if record.exists() else None
        result = {"tool": tool, "node_loss_planned": loss_step, "exit_codes": info["exit_codes"],
                  "killed": info["killed"], "spare_waiting_at_loss": info["spare_waiting_at_loss"],
                  "left_behind": [_cmdline(p) for p in descendants(os.getpid()) if _live(p)],
                  "load_average": [round(v, 1) for v in load],
                  "finished_flag": (run_dir / "finished.flag").exists(),
                  **analyse(run_dir, started, ended, args.max_steps)}
        kill_descendants()  # and reap the zombies
        result["processes_left_behind"] = len(result["left_behind"])
        result["fault_costs"] = node_loss_costs(progress, fault, info["events"])
        ckpts = [float(f[3]) for f in progress if f[0] == "ckpt"]
        result["checkpoint_s"] = summarize(ckpts, 3) if ckpts else None
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            for name in NODES:
                for file in ("launcher.log", "events.jsonl"):
                    if (base / name / file).exists():
                        shutil.copy(base / name / file, keep_dir / f"nodeloss_{tool}_{int(started)}_{name}_{file}")
            if (run_dir / "bench" / "progress.log").exists():
                shutil.copy(run_dir / "bench" / "progress.log",
                            keep_dir / f"nodeloss_{tool}_{int(started)}_progress.log")
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def tool_figures(with_loss: list[dict], fault_free: list[dict]) -> dict[str, Any]:
    """One tool's figures (medians over its runs)."""
    costs = [c for r in with_loss for c in r["fault_costs"]]
    goodput = _median([r["goodput"] for r in with_loss if r["finished_flag"]])
    baseline = _median([r["goodput"] for r in fault_free if r["finished_flag"]])
    return {
        "runs": len(with_loss), "finished": sum(r["finished_flag"] for r in with_loss),
        "losses_injected": sum(r["faults_injected"] for r in with_loss), "losses_recovered": len(costs),
        "spare_waiting": sum(bool(r["spare_waiting_at_loss"]) for r in with_loss),
        "resumed_from": sorted({c["source"] for c in costs}),
        "steps_lost_median": _median([c["steps_lost"] for c in costs]),
        "steps_lost_max": max((c["steps_lost"] for c in costs), default=None),
        **{f"{part}_median_s": _median([c[f"{part}_s"] for c in costs])
           for part in ("lost", "detection", "save", "heal", "restart", "redone")},
        "heal_mb": _median([c["heal_bytes"] / 1e6 for c in costs if c.get("heal_bytes")]),
        "goodput": goodput, "goodput_fault_free": baseline,
        "goodput_ratio": round(goodput / baseline, 3) if goodput and baseline else None,
        "step_s": _median([r["median_step_s"] for r in fault_free + with_loss if r["finished_flag"]]),
        "checkpoint_s": _median([r["checkpoint_s"]["median"] for r in with_loss + fault_free if r["checkpoint_s"]]),
        "processes_left_behind": sum(r["processes_left_behind"] for r in with_loss + fault_free),
    }


def table(figures: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md: one column per tool."""
    names = {"ours_nojit": "ours, no JIT (`--ft-jit-state false`)", "ours_jit": "ours, JIT state + healing",
             "nvrx": "NVRx 0.4.1"}
    rows = [("node losses recovered / injected", lambda f: f"{f['losses_recovered']}/{f['losses_injected']}"),
            ("resumed from", lambda f: ", ".join(f["resumed_from"]) or "-"),
            ("steps lost (median / max)", lambda f: f"{_cell(f['steps_lost_median'])} / {_cell(f['steps_lost_max'])}"),
            ("seconds lost (median)", lambda f: _cell(f["lost_median_s"], " s")),
            ("- detection", lambda f: _cell(f["detection_median_s"], " s")),
            ("- save (survivor's just-in-time state)", lambda f: _cell(f["save_median_s"], " s")),
            ("- heal (spare receives it from node a)", lambda f: _cell(f["heal_median_s"], " s")
             + (f" ({f['heal_mb']:.0f} MB)" if f["heal_mb"] else "")),
            ("- restart (stop, rendezvous with the spare, start, load)", lambda f: _cell(f["restart_median_s"], " s")),
            ("- redone work", lambda f: _cell(f["redone_median_s"], " s")),
            ("goodput with the node loss", lambda f: _cell(f["goodput"])),
            ("goodput fault-free", lambda f: _cell(f["goodput_fault_free"])),
            ("with the loss / fault-free", lambda f: _cell(f["goodput_ratio"])),
            ("step time (median)", lambda f: _cell(f["step_s"], " s")),
            ("periodic checkpoint, torch.save (median)", lambda f: _cell(f["checkpoint_s"], " s"))]
    tools = list(figures)
    lines = ["| | " + " | ".join(names.get(t, t) for t in tools) + " |", "| --- |" + " --- |" * len(tools)]
    lines += [f"| {label} | " + " | ".join(cell(figures[t]) for t in tools) + " |" for label, cell in rows]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=None,
                        help="default: ours_nojit ours_jit, and nvrx with --peer-python")
    parser.add_argument("--peer-python", default=None, help="interpreter of the venv with NVRx installed")
    parser.add_argument("--runs", type=int, default=1, help="runs with a node loss per tool")
    parser.add_argument("--baseline-runs", type=int, default=1, help="fault-free runs per tool")
    parser.add_argument("--max-steps", type=int, default=1200)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--step-time", type=float, default=0.01)
    parser.add_argument("--rows", type=int, default=409_600, help="embedding rows: state = rows x 512 bytes")
    parser.add_argument("--seed", type=int, default=0, help="of the node loss's step")
    parser.add_argument("--hb-timeout", type=float, default=5.0, help="rank_heartbeat_timeout")
    parser.add_argument("--run-timeout", type=float, default=400.0)
    parser.add_argument("--quick", action="store_true",
                        help="a functional check, the options not given set to " + json.dumps(QUICK))
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each run's logs here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:  # its values, except where given on the command line
        unset = object()
        given = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(QUICK, unset)))
        for key, value in QUICK.items():
            if getattr(given, key) is unset:
                setattr(args, key, value)
    args.tools = args.tools or [t for t in TOOLS if t != "nvrx" or args.peer_python]
    if "nvrx" in args.tools and not args.peer_python:
        parser.error("--tools nvrx needs --peer-python")
    become_subreaper()
    loss_step = plan_node_loss(args.seed, args.max_steps, args.checkpoint_every)
    runs: dict[str, list[dict]] = {t: [] for t in args.tools}
    baselines: dict[str, list[dict]] = {t: [] for t in args.tools}
    for index in range(max(args.runs, args.baseline_runs)):
        for tool in args.tools if index % 2 == 0 else list(reversed(args.tools)):
            if index < args.runs:
                runs[tool].append(one_run(tool, args, loss_step, args.log_dir))
            if index < args.baseline_runs:
                baselines[tool].append(one_run(tool, args, None, args.log_dir))
    figures = {t: tool_figures(runs[t], baselines[t]) for t in args.tools}
    every = [v for t in args.tools for r in runs[t] + baselines[t] for v in r["load_average"]]
    result = {
        "settings": {k: getattr(args, k) for k in ("max_steps", "checkpoint_every", "step_time", "rows", "seed",
                                                   "hb_timeout", "runs", "baseline_runs")},
        "state_mb": round(args.rows * 64 * 4 * 2 / 1e6, 1), "node_loss_step": loss_step, "cores": os.cpu_count(),
        "load_average": [min(every), max(every)] if every else None,
        "figures": figures, "table": table(figures), "runs": {t: runs[t] + baselines[t] for t in args.tools},
    }
    emit(result, args.json)
    if not args.json:
        print("\n" + result["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
