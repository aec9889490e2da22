"""Run every benchmark scenario with repeated, paired runs and write ``docs/benchmarks.md``.

``make bench`` runs it for ptl-resiliency (and plain torchrun where it applies); ``make
bench-peer`` also passes ``--peer-python .venv-peer/bin/python``, the interpreter of a separate
venv with NVIDIA nvidia-resiliency-ext 0.4.1 (NVRx), and every scenario then runs with both, in
alternating order (ABBA: ours, peer, peer, ours, ...) so that a change in the machine's load
affects both alike. Where two tools are compared, each run of one is paired with the run of the
other that came next to it and the ratio is taken per pair; the table gives the median ratio
with its min-max.

Scenarios (``--only`` picks some; each is a script in ``bench/`` that prints JSON with ``--json``):

  client     bench/client_overhead.py   us per heartbeat / section open+close (median, p99)
  hang       bench/hang_detection.py    detection latency past the timeout, default settings
  restart    bench/restart_latency.py   worker failure -> replacements started -> gloo group ready
  footprint  bench/monitor_footprint.py memory of launcher/monitors/template; monitor CPU at 10 Hz
  lightning  bench/lightning_overhead.py step time each Lightning callback adds (paired blocks)
  goodput    bench/goodput.py           2-rank Lightning job with faults under autoresume.sh
  soak       bench/soak.py              >= 10 min 2-rank job with jitter under calculated timeouts:
                                        false kills and the detection latency of injected hangs
  straggler  bench/straggler_overhead.py per-step cost of straggler detection's measurement (paired)
  scale      bench/scale.py             a restart of 64 and 128 simulated nodes (store operations, latency)
                                        and of 16 real ft_launchers (recovered, nothing left behind)

Raw results go to ``bench/results/<UTC time>.json`` and each scenario's output to
``bench/results/logs/`` (git-ignored). ``--quick`` runs few, short repetitions (to check that
everything works; the figures are then rough). ``--render-only FILE`` re-renders the markdown
from a raw results file. With ``--only``, the sections of the scenarios not run are kept from the
existing page (a note says from which run).

Run: ``python bench/run_all.py [--peer-python PY] [--quick] [--only client hang ...] [--note TEXT]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import goodput_realistic  # noqa: E402
from bench._util import REPO, become_subreaper, kill_descendants, summarize  # noqa: E402
from bench.gpu_scenarios import report as gpu_report  # noqa: E402
from bench.scale import DOC_HISTORY as SCALE_HISTORY  # noqa: E402
from bench.scale import DOC_INTRO as SCALE_INTRO  # noqa: E402
from bench.scale import DOC_TITLE as SCALE_TITLE  # noqa: E402

SCENARIOS = ("client", "hang", "restart", "footprint", "lightning", "goodput", "goodput_realistic", "soak", "straggler",
             "scale")

# Repetitions and sizes: (full, quick).
SETTINGS = {
    "client_reps": (5, 2), "client_calls": (10_000, 5_000),
    "hang_blocks": (3, 1), "hang_runs_per_block": (3, 2), "hang_timeout": (1.0, 1.0),
    "restart_runs": (3, 1), "restart_crashes": (3, 2),
    "footprint_reps": (2, 1), "footprint_seconds": (12.0, 4.0),
    "lightning_reps": (3, 1), "lightning_pairs": (3000, 300),
    "goodput_runs": (2, 1), "goodput_baseline_runs": (1, 1), "goodput_max_steps": (1500, 500),
    "goodput_max_faults": (4, 2), "goodput_fault_every": (6.0, 4.0),
    "goodput_realistic_args": ([], ["--quick"]),
    # The soak: >= 10 minutes with the default minimums; then a shorter run with the old ones.
    "soak_duration": (660.0, 150.0), "soak_old_duration": (240.0, 90.0),
    "straggler_reps": (3, 1), "straggler_blocks": (60, 10),
    "scale_sim_nodes": ([64, 128], [64]), "scale_full_nodes": (16, 8),
}
SCENARIO_TIMEOUT_S = 1800


class Context:
    """Interpreters, settings and where outputs go; runs one benchmark script as a subprocess."""

    def __init__(self, args: argparse.Namespace, work: Path, logs: Path) -> None:
        self.args = args
        self.quick = args.quick
        self.python = {"ours": sys.executable}
        if args.peer_python:
            self.python["nvrx"] = args.peer_python
        self.impls = list(self.python)
        self.work = work
        self.logs = logs
        self.commands: dict[str, list[str]] = {}

    def setting(self, name: str) -> Any:
        return SETTINGS[name][1 if self.quick else 0]

    def run_json(self, scenario: str, python: str, script: str, script_args: list[str],
                 any_exit: bool = False) -> dict:
        """Run ``python bench/<script> <args> --json``; return the JSON object it printed last (with
        ``any_exit``, also when the script exited non-zero: its JSON then says what failed)."""
        command = [python, str(REPO / "bench" / script), *script_args, "--json"]
        shown = " ".join(_display(c) for c in _without_log_args(command))
        self.commands.setdefault(scenario, [])
        if shown not in self.commands[scenario]:
            self.commands[scenario].append(shown)
        tmp = Path(tempfile.mkdtemp(prefix="t", dir=self.work))  # short: Unix socket paths go here
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)}
        log_path = self.logs / f"{scenario}.log"
        with open(log_path, "ab") as log:
            log.write(f"\n==== {datetime.datetime.now().isoformat(timespec='seconds')} {shown}\n".encode())
            log.flush()
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=log, start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=SCENARIO_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                raise RuntimeError(f"{shown} timed out after {SCENARIO_TIMEOUT_S} s (see {log_path})") from None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # nothing of a finished run may stay
                proc.wait()
                left = kill_descendants()  # orphans of a script killed at its time limit
                if left:
                    log.write(f"run_all: killed {len(left)} process(es) left behind: {left}\n".encode())
                shutil.rmtree(tmp, ignore_errors=True)
            log.write(out)
        if proc.returncode != 0 and not any_exit:
            raise RuntimeError(f"{shown} exited with {proc.returncode} (see {log_path})")
        for line in reversed(out.decode(errors="replace").splitlines()):
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    return value
        raise RuntimeError(f"{shown} printed no JSON object (see {log_path})")


def _without_log_args(command: list[str]) -> list[str]:
    """The command without the options that only say where its logs go."""
    out, skip = [], False
    for arg in command:
        if skip:
            skip = False
        elif arg in ("--log-dir", "--log"):
            skip = True
        else:
            out.append(arg)
    return out


def _display(arg: str) -> str:
    """An argument as a reader would type it: paths relative to the repository, venvs by name."""
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(arg, REPO)
        if not rel.startswith(".."):
            return rel
    if arg == sys.executable:
        return ".venv/bin/python"
    return arg


def abba(items: list[str], rep: int) -> list[str]:
    return list(items) if rep % 2 == 0 else list(reversed(items))


# ----------------------------------------------------------------------------- scenarios


def scenario_client(ctx: Context) -> dict:
    per: dict[str, list[dict]] = {impl: [] for impl in ctx.impls}
    for rep in range(ctx.setting("client_reps")):
        for impl in abba(ctx.impls, rep):
            per[impl].append(ctx.run_json("client", ctx.python[impl], "client_overhead.py",
                                          ["--calls", str(ctx.setting("client_calls")), "--impl", impl]))
    return {"runs": per}


def scenario_hang(ctx: Context) -> dict:
    # "ours" captures the hung rank's stacks before the kill (the default); "ours_nostacks" has
    # stack_capture_budget 0, to show what the capture adds.
    variants = [*ctx.impls, "ours_nostacks"]
    samples: dict[str, list[float]] = {variant: [] for variant in variants}
    for rep in range(ctx.setting("hang_blocks")):
        for variant in abba(variants, rep):
            impl = "ours" if variant == "ours_nostacks" else variant
            stacks = ["--stacks", "off"] if variant == "ours_nostacks" else []
            result = ctx.run_json("hang", ctx.python[impl], "hang_detection.py",
                                  ["--runs", str(ctx.setting("hang_runs_per_block")),
                                   "--timeout", str(ctx.setting("hang_timeout")), "--impl", impl, *stacks])
            samples[variant] += result["samples_s"]
    return {"samples_s": samples, "timeout_s": ctx.setting("hang_timeout")}


def scenario_restart(ctx: Context) -> dict:
    tools = ["ft_launcher", "ft_launcher_cold", "torchrun"] + (["nvrx"] if "nvrx" in ctx.python else [])
    script_args = ["--runs", str(ctx.setting("restart_runs")), "--crashes", str(ctx.setting("restart_crashes")),
                   "--tools", *tools, "--log-dir", str(ctx.logs)]
    if "nvrx" in ctx.python:
        script_args += ["--peer-python", ctx.python["nvrx"]]
    return ctx.run_json("restart", sys.executable, "restart_latency.py", script_args)


def scenario_footprint(ctx: Context) -> dict:
    tools = ["ours", "ours_cold", "torchrun"] + (["nvrx"] if "nvrx" in ctx.python else [])
    per: dict[str, list[dict]] = {tool: [] for tool in tools}
    for rep in range(ctx.setting("footprint_reps")):
        for tool in abba(tools, rep):
            script_args = ["--tool", tool, "--seconds", str(ctx.setting("footprint_seconds")),
                           "--log", str(ctx.logs / "footprint_launchers.log")]
            if tool == "nvrx":
                script_args += ["--peer-python", ctx.python["nvrx"]]
            per[tool].append(ctx.run_json("footprint", sys.executable, "monitor_footprint.py", script_args))
    return {"runs": per}


def scenario_lightning(ctx: Context) -> dict:
    per: dict[str, list[dict]] = {impl: [] for impl in ctx.impls}
    for rep in range(ctx.setting("lightning_reps")):
        for impl in abba(ctx.impls, rep):
            # The empty Callback (Lightning's own cost) is the same in both venvs: measured once.
            # NVRx's hooks wait for a reply, hence fewer direct calls (the same figure, sooner).
            callbacks, hook_calls = (("empty,heartbeats,sections", 20000) if impl == "ours"
                                     else ("heartbeats,sections", 2000))
            per[impl].append(ctx.run_json("lightning", ctx.python[impl], "lightning_overhead.py",
                                          ["--pairs", str(ctx.setting("lightning_pairs")), "--hook-calls",
                                           str(hook_calls), "--callbacks", callbacks, "--impl", impl]))
    return {"runs": per}


def scenario_goodput(ctx: Context) -> dict:
    script_args = ["--tools", *ctx.impls, "--runs", str(ctx.setting("goodput_runs")),
                   "--baseline-runs", str(ctx.setting("goodput_baseline_runs")),
                   "--max-steps", str(ctx.setting("goodput_max_steps")),
                   "--max-faults", str(ctx.setting("goodput_max_faults")),
                   "--fault-every", str(ctx.setting("goodput_fault_every")), "--log-dir", str(ctx.logs)]
    if "nvrx" in ctx.python:
        script_args += ["--peer-python", ctx.python["nvrx"]]
    return ctx.run_json("goodput", sys.executable, "goodput.py", script_args)


def scenario_goodput_realistic(ctx: Context) -> dict:
    script_args = [*ctx.setting("goodput_realistic_args"), "--log-dir", str(ctx.logs)]
    if "nvrx" in ctx.python:
        script_args += ["--peer-python", ctx.python["nvrx"]]
    return ctx.run_json("goodput_realistic", sys.executable, "goodput_realistic.py", script_args)


def render_goodput_realistic(result: dict, peer: bool) -> list[str]:
    return _error_section(goodput_realistic.DOC_TITLE, result) or goodput_realistic.doc_section(result)


def scenario_soak(ctx: Context) -> dict:
    runs = {}
    for minimums, key in (("default", "soak_duration"), ("old", "soak_old_duration")):
        duration = ctx.setting(key)
        runs[minimums] = ctx.run_json("soak", sys.executable, "soak.py",
                                      ["--duration", f"{duration:g}", "--minimums", minimums,
                                       "--log", str(ctx.logs / f"soak_{minimums}_job.log")])
    return {"runs": runs}


def scenario_straggler(ctx: Context) -> dict:
    # Ours only: the reference's straggler Detector needs CUDA (CUPTI), see bench/straggler_overhead.py.
    runs: dict[str, list[dict]] = {"1": [], "10": []}  # by profiling_interval
    for rep in range(ctx.setting("straggler_reps")):
        for interval in abba(list(runs), rep):
            runs[interval].append(ctx.run_json("straggler", sys.executable, "straggler_overhead.py",
                                               ["--blocks", str(ctx.setting("straggler_blocks")),
                                                "--profiling-interval", interval]))
    return {"runs": runs}


def scenario_scale(ctx: Context) -> dict:
    # ft-barrier only: torch's c10d rendezvous stalls at 64 simulated nodes (docs/benchmarks.md's history).
    sim = ctx.run_json("scale", sys.executable, "scale.py",
                       ["sim", "--backend", "ft-barrier", "--nodes", *map(str, ctx.setting("scale_sim_nodes"))])
    # exit 1 when a node did not recover or something was left: the JSON says which, and the page shows it
    full = ctx.run_json("scale", sys.executable, "scale.py",
                        ["full", "--backend", "ft-barrier", "--nodes", str(ctx.setting("scale_full_nodes"))],
                        any_exit=True)
    return {"sim": sim.get("sim", []), "full": full.get("full", [])}


RUNNERS: dict[str, Callable[[Context], dict]] = {
    "client": scenario_client, "hang": scenario_hang, "restart": scenario_restart,
    "footprint": scenario_footprint, "lightning": scenario_lightning, "goodput": scenario_goodput,
    "goodput_realistic": scenario_goodput_realistic,
    "soak": scenario_soak, "straggler": scenario_straggler, "scale": scenario_scale,
}


# ----------------------------------------------------------------------------- machine


def _read(path: str) -> str:
    try:
        with open(path) as stream:
            return stream.read()
    except OSError:
        return ""


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in _read("/proc/stat").splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields), idle


def busy_fraction(seconds: float) -> float:
    """Share of all CPUs busy during ``seconds`` (this process sleeps meanwhile)."""
    total0, idle0 = _cpu_times()
    time.sleep(seconds)
    total1, idle1 = _cpu_times()
    return 0.0 if total1 == total0 else 1.0 - (idle1 - idle0) / (total1 - total0)


def package_versions(python: str) -> dict[str, str]:
    code = ("import json, sys, importlib.metadata as m\n"
            "out = {'python': sys.version.split()[0]}\n"
            "for name in ('torch', 'lightning', 'nvidia-resiliency-ext'):\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    try:
        return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                                         check=True).stdout)
    except (subprocess.SubprocessError, ValueError):
        return {}


def machine_info(ctx: Context) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal")), 0)
    os_name = next((line.split("=", 1)[1].strip().strip('"') for line in _read("/etc/os-release").splitlines()
                    if line.startswith("PRETTY_NAME=")), platform.system())
    return {
        "cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
        "os": f"{os_name}, kernel {platform.release()}",
        "versions": {impl: package_versions(python) for impl, python in ctx.python.items()},
    }


# ----------------------------------------------------------------------------- rendering


def med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_range(summary: dict | None, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    """``median (min–max)``, or ``-`` when there is no figure."""
    if not summary:
        return "-"
    m, lo, hi = (summary[k] * scale for k in ("median", "min", "max"))
    unit = f" {unit}" if unit else ""
    if summary.get("n", 2) == 1 or lo == hi:
        return f"{m:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit} ({lo:.{digits}f}–{hi:.{digits}f})"


def of(values: list[float], digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    values = [v for v in values if v is not None]
    return fmt_range(summarize(values, 9) if values else None, digits, scale, unit)


def ratio_cell(peer: list[float | None], ours: list[float | None], digits: int = 1) -> str:
    """Per-pair ratios peer/ours: ``×median (min–max)``."""
    ratios = [p / o for p, o in zip(peer, ours, strict=False) if p is not None and o is not None and o > 0]
    if not ratios:
        return "-"
    s = summarize(ratios, 9)
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"×{s['median']:.{digits}f}"
    return f"×{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def render(data: dict) -> str:
    machine, results, meta = data["machine"], data["results"], data["meta"]
    peer = "nvrx" in machine["versions"]
    ours_v = machine["versions"].get("ours", {})
    lines: list[str] = []
    add = lines.append
    add("# Benchmarks")
    add("")
    add("Generated by `bench/run_all.py` (`make bench`; `make bench-peer` adds NVIDIA "
        "nvidia-resiliency-ext, \"NVRx\"). Do not edit by hand: run it again.")
    add("")
    if meta.get("notes"):
        for note in meta["notes"]:
            add(f"> **Note:** {note}")
            add(">")
        lines.pop()
        add("")
    add("| machine | |")
    add("| --- | --- |")
    add(f"| date | {meta['date']} (took {meta['wall_s'] / 60:.1f} min{', quick mode' if meta['quick'] else ''}) |")
    add(f"| CPU | {machine['cpu']}, {machine['cores']} cores |")
    add(f"| RAM | {machine['ram_gib']} GiB |")
    add(f"| OS | {machine['os']} |")
    add(f"| Python, torch, lightning | {ours_v.get('python', '?')}, {ours_v.get('torch', '?')}, "
        f"{ours_v.get('lightning', '?')} |")
    if peer:
        pv = machine["versions"]["nvrx"]
        add(f"| peer venv (`.venv-peer`) | nvidia-resiliency-ext {pv.get('nvidia-resiliency-ext', '?')}, "
            f"Python {pv.get('python', '?')}, torch {pv.get('torch', '?')}, lightning {pv.get('lightning', '?')} |")
    add(f"| other load on the machine | CPUs {meta['busy_before'] * 100:.0f}% busy just before the run, "
        f"{meta['busy_after'] * 100:.0f}% just after (3 s samples, while no benchmark ran) |")
    add("")
    add("How to reproduce: `make bench` (ours and torchrun; about 9 min on this 2-core machine kind, "
        "plus 16 min for the soak and 2-3 min for the scale runs) or `make bench-peer` (the same plus NVRx 0.4.1, "
        "installed into `.venv-peer` "
        "on first use, 1.5 min; 16 min plus the soak) regenerate this page; "
        "`make bench BENCH_ARGS='--only restart goodput'` runs some scenarios (keeping the others' sections), "
        "`BENCH_ARGS=--quick` a short functional run. Each section lists the exact commands it ran: every "
        "script in `bench/` prints its figures on its own (as JSON with `--json`, as text without). Raw "
        "results and every process's output go to `bench/results/` (git-ignored).")
    add("")
    add("Every figure is the **median over repeated runs, with (min–max)**. Runs of the tools compared "
        "alternate (ABBA order) and each is paired with its neighbour; ratios are taken per pair "
        "(other tool / ours: above 1 means ours is faster or smaller) and given as median (min–max). "
        "\"ours\" is ptl-resiliency from this repository.")
    add("")
    sections = [("client", render_client), ("hang", render_hang), ("restart", render_restart),
                ("footprint", render_footprint), ("lightning", render_lightning), ("goodput", render_goodput),
                ("goodput_realistic", render_goodput_realistic), ("soak", render_soak), ("straggler", render_straggler),
                ("scale", render_scale)]
    number = 0
    for key, fn in sections:
        if key not in results:
            continue
        number += 1
        body = fn(results[key], peer)
        add(f"## {number}. {body[0]}")
        add("")
        lines.extend(body[1:])
        if isinstance(results[key], dict) and results[key].get("error"):
            add(f"**This scenario failed:** `{results[key]['error']}`")
            add("")
        commands = meta.get("commands", {}).get(key, [])
        if commands:
            add("Reproduce (from the repository root; `make bench` runs exactly these):")
            add("")
            add("```bash")
            lines.extend(commands)
            add("```")
            add("")
    if peer:
        add("## Reference: the NVRx figures quoted in the issue")
        add("")
        add("Measured on this machine kind with NVRx 0.4.1 when the benchmark issue (7) was filed, on another "
            "machine of the kind and another day; they differ from the NVRx figures above (most: the client "
            "calls, which wait for another process to be scheduled), so compare tools only within one run: "
            "heartbeat 65 µs, section pair 156 µs; "
            "hang detection 2.0 s past the timeout (default settings: uniform over the 5 s check interval); "
            "failure → new processes 0.44 s (torchrun 0.37 s); failure → gloo group ready 3.0 s (torchrun "
            "2.9 s, of which ~2.3 s is `import torch` in the new workers); monitor RSS 157 MB; Lightning "
            "heartbeat callback +0.29 ms per step.")
        add("")
    add("## What could not be compared")
    add("")
    add("- **torchrun** has no hang detection, no rank monitors and no Lightning callback: it appears in "
        "the restart and memory scenarios only. Under faults it would wait for a hung rank until the "
        "collective's timeout (30 min with gloo), so goodput with hangs does not apply.")
    add("- **NVRx's simulated faults** (`simulated_fault_params`) and its GPU health checks need CUDA: "
        "the faults here are made by the workers themselves (`SIGSTOP`/`SIGKILL` at a planned time), "
        "identically for both tools. On this CPU machine NVRx logs NVML tracebacks at start "
        "(harmless; its GPU/NIC health checks disable themselves).")
    add("- **NVRx's sections callback** wraps `trainer.strategy.training_step` rather than using "
        "callback hooks, so its own hook code cannot be timed apart from the step (`-` in that column).")
    add("- **NVRx's local checkpoints** (`checkpointing.local`): their asynchronous save calls "
        "`torch.cuda.synchronize()` and its `BasicTensorAwareStateDict` asserts CUDA tensors; on CPU only a "
        "synchronous save with a state wrapper the user writes runs (`bench/nvrx_local_checkpoint_cpu.py`, "
        "[local-checkpoints.md](local-checkpoints.md#cost)), so NVRx's column of the node-loss goodput section "
        "uses its periodic checkpoint.")
    add("")
    for line in MULTINODE_SECTION:
        add(line)
    lines.extend(gpu_report.doc_section(last_gpu_check()))
    return "\n".join(lines).rstrip("\n") + "\n"


def last_gpu_check() -> dict | None:
    """The last GPU run ``make gpu-check GPU_CHECK_ARGS=--record`` kept (``None``: none yet)."""
    path = REPO / "bench" / "gpu_check_last.json"
    return json.loads(path.read_text()) if path.exists() else None


# Measured apart from `make bench`: it needs the multi-node SLURM cluster (docs/multinode.md).
# Re-measure with bench/multinode_scale.py and update these lines.
MULTINODE_SECTION = (
    "## Reference: multi-node scale (node crash -> survivors back in the process group)",
    "",
    "Not run by `make bench`: it needs the multi-node SLURM cluster of `make test-cluster` "
    "([multinode.md](multinode.md)). `bench/multinode_scale.py` on 4 cluster nodes sharing this machine's 2 "
    "cores: N nodes with `--nnodes N-1:N`, one gloo rank per node; node N is crashed (`fault.sh crash`); "
    "time until every survivor's new workers completed their first collective. Warm: ft_launcher's default "
    "warm restarts; cold: `--no-warm-restarts`. One run each (2026-11-23, with `poll_interval`: `make "
    "test-cluster`'s cluster, `SLURM_CLUSTER_NODES=4 start.sh`, then `.venv/bin/python "
    "bench/multinode_scale.py`), load average next to each figure.",
    "",
    "| restart | nodes | crash -> survivors in the process group (s) | load (1 min) |",
    "|---|---|---|---|",
    "| warm | 2 | 7.0 | 0.9 |",
    "| warm | 3 | 7.3 | 1.7 |",
    "| warm | 4 | 9.5 | 2.3 |",
    "| cold | 2 | 8.6 | 2.7 |",
    "| cold | 3 | 9.7 | 2.5 |",
    "| cold | 4 | 10.2 | 2.4 |",
    "",
    "Growth from 2 to 4 nodes: 1.36x warm, 1.19x cold (goal 1.5x). Before `poll_interval` (torch's 1 s "
    "rendezvous waits and cache; same day): 7.5 / 8.8 / 11.0 s warm, 9.3 / 11.3 / 14.7 s cold, 1.47x and "
    "1.58x.",
    "",
    "Each added node adds a launcher, a monitor and a worker on the same 2 cores, so this grows with CPU "
    "contention more than with the rendezvous. Where the time goes (3 nodes, the crash test): 0.4 s until "
    "the crash is seen, 3.5 s until the failure is decided (2 s of it waiting for the lost node's view of "
    "the failure), 2.5 s of rendezvous (the 2 s last call; the lost node's keep-alive expiry overlaps the "
    "wait), 2.7 s for the new workers' process group (measured before `poll_interval`).",
    "",
)


def render_straggler(result: dict, peer: bool) -> list[str]:
    title = "Straggler detection: per-step cost of the measurement"
    if (err := _error_section(title, result)):
        return err
    runs = result["runs"]

    def cell(key: str, interval: str = "1") -> str:
        return of([r[key] for r in runs[interval]], 2)

    return [title,
            "`bench/straggler_overhead.py`, one process, CPU time of the process per step (`time.process_time`: "
            "robust to the machine's load), ABBA blocks with the same model attached to `ComputeTimer` and "
            "detached block by block; added = median of the paired differences. Three steps: a module call "
            "(forward wrapper only, no backward), the smallest step with a backward (one parameter: the "
            "wrapper and the gradient hook, as the autograd engine calls it) and a whole one-rank gloo DDP step "
            "(forward, backward, all-reduce, SGD). The timer's own Python code is also timed alone (a hot loop "
            "of the wrapper around a no-op and the hook). With the wall clock and `profiling_interval=1` one "
            "step in three is sampled (`WALL_CLOCK_SAMPLE_EVERY`); with `profiling_interval=10` every 10th step, "
            "the gradient hook registered for it only. Per-step medians: every step of the smallest step timed on its "
            "own, variants in rotating blocks (the timer as configured, never sampling, sampling every step, a "
            "pass-through wrapper with a no-op hook), each variant's median minus the plain median. "
            "The reference's `StragglerDetectionCallback` "
            "cannot run on this CPU machine (its `Detector` needs CUDA: CUPTI, and `torch.cuda.synchronize()` "
            f"in every report). {len(runs['1'])} runs each.",
            "",
            "| measure | µs |",
            "| --- | --- |",
            f"| timer's own code per step (hot loop) | {cell('timer_code_us')} |",
            f"| forward wrapper added to a module call (no backward: every step timed) | "
            f"{cell('forward_wrapper_added_us')} |",
            f"| module call without the wrapper | {cell('forward_call_us')} |",
            f"| added to the smallest step with a backward, `profiling_interval=1` (default), block means | "
            f"{cell('minimal_step_added_us')} |",
            f"| per-step median added: an unsampled step (2 of 3) | {cell('minimal_step_median_added_unsampled_us')} |",
            f"| per-step median added: a sampled step (1 of 3) | {cell('minimal_step_median_added_sampled_us')} |",
            f"| per-step median added: a pass-through wrapper and a no-op gradient hook (any hooking) | "
            f"{cell('minimal_step_median_added_passthrough_us')} |",
            f"| per-step median added: the default, all steps together | "
            f"{cell('minimal_step_median_added_default_us')} |",
            f"| smallest step without the timer | {cell('minimal_step_us')} |",
            f"| added to a whole DDP step, `profiling_interval=1` (default) | {cell('ddp_step_added_us')} |",
            f"| added to a whole DDP step, `profiling_interval=10` | {cell('ddp_step_added_us', '10')} |",
            f"| DDP step without the timer | {cell('ddp_step_us')} |",
            f"| samples per step, `profiling_interval=1` | {cell('samples_per_step')} |",
            ""]


def _kb(n: int) -> str:
    """Bytes as kB or MB (10^3, 10^6)."""
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _leftovers(row: dict) -> str:
    """What a full-launcher run left behind, or ``none``."""
    parts = []
    if row.get("left_behind"):
        parts.append(f"{len(row['left_behind'])} process(es) alive")
    if row.get("left_in_tmpdir"):
        shown = ", ".join(f"`{p}`" for p in row["left_in_tmpdir"][:4])
        parts.append(f"{len(row['left_in_tmpdir'])} entries in the launchers' TMPDIR ({shown})")
    if row.get("new_shared_entries"):
        parts.append("new " + ", ".join(f"`{p}`" for p in row["new_shared_entries"][:4]))
    return "; ".join(parts) or "none"


SCALE_ANCHOR = '<a id="scale"></a>'
"""A link target that stays when the section's number changes (docs/launcher.md links to it)."""


def render_scale(result: dict, peer: bool) -> list[str]:
    title = SCALE_TITLE
    if (err := _error_section(title, result)):
        return [title, SCALE_ANCHOR, "", *err[1:-1], "", *SCALE_INTRO, *SCALE_HISTORY]
    out = [title, SCALE_ANCHOR, "", *SCALE_INTRO,
           "**Simulation** (`bench/scale.py sim --backend ft-barrier`): one TCPStore server alone in the bench's "
           "process; per node ft_launcher's barrier rendezvous (`--rdzv-backend ft-barrier`) built by its own code, "
           "its own store connection, the real `StoreChannel` and `StoreWatchdog` (one connection per node with "
           "TCP keep-alive). Simulated: the agent loop and the failure (no workers; every node fails at once, "
           "publishes a one-rank view, gathers the others' and joins the next round); nodes are threads in 8 "
           "processes. After the first round the sim waits until the store is quiet (*settle*: every probe "
           "answered within 0.1 s for 1 s), runs 3 s, then fails every node. Store operations of one failure "
           "(fail -> every node in the next round; every phase: rendezvous, keep-alive, host names, views, "
           "shutdown poll, the workers' store address), all nodes; bytes sent / received. One run per size.",
           "",
           "| nodes | store ops per failure: per node | total (bytes sent / received) | of which restart rendezvous "
           "| views gathered (median / max) | restart rendezvous (median / max) | failure -> all nodes back (max) "
           "| settle after the first round (slowest probe) | load (1 min) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result.get("sim", []):
        if "stalled" in row:
            out.append(f"| {row['nodes']} | stalled: {row['stalled']} | | | | | | | {row['load1']:g} |")
            continue
        ops, sent, received = (sum(r[k] for r in row["failure"].values()) for k in range(3))
        rdzv = row["failure"].get("rendezvous", [0, 0, 0])
        settle = row.get("settle")
        settled = ("-" if not settle else
                   f"{settle['s']:.1f} s ({settle['slowest_probe_s']:.2f} s)" if settle["settled"]
                   else f"not quiet within {settle['s']:.0f} s ({settle['slowest_probe_s']:.2f} s)")
        n = row["nodes"]
        views, rdzv1 = row["exchange_s"], row["rdzv1_s"]
        out.append(f"| {n} | {ops / n:.1f} | {ops} ({_kb(sent)} / {_kb(received)}) "
                   f"| {rdzv[0]} ({rdzv[0] / n:.1f}/node) | {views['median']:.2f} / {views['max']:.2f} s "
                   f"| {rdzv1['median']:.2f} / {rdzv1['max']:.2f} s | {row['restart_s']['max']:.2f} s "
                   f"| {settled} | {row['load1']:g} |")
    out += ["",
            "**Full launchers** (`bench/scale.py full --backend ft-barrier`): N real `ft_launcher`s on 127.0.0.1, "
            "one gloo rank each (`tests/workers/ft_worker.py`), heartbeat timeout 3 s; the last node's rank hangs "
            "in cycle 0. *Recovered*: the node ran 2 cycles and exited 0. *Left behind*, checked after every "
            "launcher exited: a process of the run still alive (the launchers' sessions, and orphans re-parented "
            "to the bench, a child subreaper), anything in the launchers' private `TMPDIR` (run directories, "
            "sockets, temporary files), a new `/tmp/ft-*`, `/tmp/torchelastic_*` or `/dev/shm` entry. Store "
            "operations from each launcher's cycle 0 to its cycle 1 (training, the failure, the restart), all "
            "nodes. *Failure -> all back*: the first node's detection of the failure -> the last node's new "
            "workers started.",
            "",
            "| nodes | every node recovered | cycles | exit codes | left behind | restart rendezvous (median / max) "
            "| failure -> all back | warm restarts | store ops cycle 0 -> 1: total (per node) | of which rendezvous "
            "| wall | load (1 min) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result.get("full", []):
        n = row["nodes"]
        cycles = f"{row['cycles'][0]} on every node" if len(set(row["cycles"])) == 1 else str(row["cycles"])
        codes = f"all {row['exit_codes'][0]}" if len(set(row["exit_codes"])) == 1 else str(row["exit_codes"])
        recovered = "yes" if row["nodes_recovered"] == n else f"**no**: {row['nodes_recovered']} of {n}"
        total = sum(r[0] for r in row["cycle0_to_cycle1_total"].values())
        rdzv = row["cycle0_to_cycle1_total"].get("rendezvous", [0, 0, 0])[0]
        counted = row.get("counted_nodes", n) or 1
        r1 = row.get("restart_rendezvous_s")
        restart_rdzv = "-" if not r1 else f"{r1['median']:.2f} / {r1['max']:.2f} s"
        back = row.get("failure_to_all_started_s")
        out.append(f"| {n} | {recovered} | {cycles} | {codes} | {_leftovers(row)} | {restart_rdzv} "
                   f"| {'-' if back is None else f'{back:.2f} s'} | {row.get('warm_restarts', '-')} of {n} "
                   f"| {total} ({total / counted:.0f}) | {rdzv} ({rdzv / counted:.1f}) "
                   f"| {row['wall_s']:.0f} s | {row['load1']:g} |")
    out.append("")
    return [*out, *SCALE_HISTORY]


def _error_section(title: str, result: dict) -> list[str] | None:
    if isinstance(result, dict) and result.get("error") and len(result) == 1:
        return [title, "No figures: the scenario failed.", ""]
    return None


def render_client(result: dict, peer: bool) -> list[str]:
    title = "Client call cost"
    if (err := _error_section(title, result)):
        return err
    runs = result["runs"]
    out = [title,
           "One rank's `RankMonitorClient` connected to a real rank monitor (`RankMonitorServer.run_in_subprocess`); "
           "each call is timed on its own (`perf_counter_ns`, timer overhead subtracted), "
           f"{runs['ours'][0].get('calls', '') or 'N'} calls per kind per run after a warm-up; the table gives, over "
           f"{len(runs['ours'])} runs, the median of each run's median and p99. Ours stores into shared memory; "
           "NVRx sends a message and waits for the monitor's reply.",
           ""]
    head = "| call | ours median | ours p99 |"
    sep = "| --- | --- | --- |"
    if peer:
        head += " NVRx median | NVRx p99 | NVRx / ours (median) | NVRx / ours (p99) |"
        sep += " --- | --- | --- | --- |"
    out += [head, sep]
    for call, label in (("heartbeat", "`send_heartbeat()`"), ("section_pair", "`start_section()` + `end_section()`")):
        o_med = [r[call]["median_us"] for r in runs["ours"]]
        o_p99 = [r[call]["p99_us"] for r in runs["ours"]]
        row = f"| {label} | {of(o_med, 2, unit='µs')} | {of(o_p99, 2, unit='µs')} |"
        if peer:
            p_med = [r[call]["median_us"] for r in runs["nvrx"]]
            p_p99 = [r[call]["p99_us"] for r in runs["nvrx"]]
            row += (f" {of(p_med, 1, unit='µs')} | {of(p_p99, 1, unit='µs')} | {ratio_cell(p_med, o_med, 0)} |"
                    f" {ratio_cell(p_p99, o_p99, 0)} |")
        out.append(row)
    out.append("")
    return out


def render_hang(result: dict, peer: bool) -> list[str]:
    title = "Hang detection latency past the timeout"
    if (err := _error_section(title, result)):
        return err
    samples = result["samples_s"]
    out = [title,
           f"A real monitor and a real rank: the rank sends heartbeats, then stops. Latency = the moment the "
           f"benchmark sees the rank die − (last heartbeat + `rank_heartbeat_timeout` = {result['timeout_s']:g} s): "
           "the monitor's wake-up, the capture of the rank's Python stacks before the kill (ours, default "
           "`stack_capture_budget` 2 s: py-spy when installed, else the client's faulthandler signal; "
           "\"ours, no stacks\": budget 0), `SIGKILL` and process exit. Every other setting is the default "
           "(`workload_check_interval` 5 s: NVRx checks on that interval, ours sleeps until the deadline). "
           "Each run is a new monitor and rank.",
           "",
           "| tool | runs | latency past the timeout |" + (" NVRx − ours (medians) |" if peer else ""),
           "| --- | --- | --- |" + (" --- |" if peer else "")]
    ours_med = med(samples["ours"])
    for impl, label in (("ours", "ours"), ("ours_nostacks", "ours, no stacks"), ("nvrx", "NVRx")):
        if impl not in samples:
            continue
        row = f"| {label} | {len(samples[impl])} | {of(samples[impl], 3, unit='s')} |"
        if peer:
            row += (f" +{med(samples['nvrx']) - ours_med:.2f} s |" if impl == "nvrx" and ours_med is not None else " |")
        out.append(row)
    out.append("")
    return out


def render_restart(result: dict, peer: bool) -> list[str]:
    title = "Restart: worker failure → replacements started → process group ready"
    if (err := _error_section(title, result)):
        return err
    any_tool = next(iter(result.values()))
    out = [title,
           f"A 2-rank job (`bench/restart_worker.py`): rank 1 exits with code 1 right after the gloo group "
           f"formed; the launcher restarts the group. {any_tool['runs']} runs × {any_tool['crashes_per_run']} "
           "crashes per tool, tools alternating run by run. *Started*: crash → the last replacement worker "
           "runs its first Python statement. *Ready*: crash → `init_process_group` + one `all_reduce` done "
           "in all new workers. `--monitor-interval 0.1` and spare `--max-restarts` for every launcher, "
           "otherwise defaults, except that torchrun gets `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (ours "
           "sets it itself): with torch's default, restarted gloo groups here read the previous round's "
           "peer addresses and fail (\"Connection refused\") or hang (`restart_latency.py --tools "
           "torchrun_default` shows it). *Unplanned restarts*: restarts beyond the planned crashes (a "
           "restarted group that failed to form). "
           "Ratios pair each run's median with the neighbouring run of ft_launcher (warm).",
           "",
           "| tool | → replacements started | → process group ready | ready: tool / ft_launcher | "
           "unplanned restarts | failed runs | processes left behind |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    base = result.get("ft_launcher")
    labels = {"ft_launcher": "ft_launcher (ours, warm restarts)",
              "ft_launcher_cold": "ft_launcher --no-warm-restarts (ours)",
              "torchrun": "torchrun (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`)",
              "torchrun_default": "torchrun (defaults)", "nvrx": "NVRx 0.4.1 ft_launcher"}
    for tool in ("ft_launcher", "ft_launcher_cold", "torchrun", "torchrun_default", "nvrx"):
        if tool not in result:
            continue
        r = result[tool]
        ratio = "-"
        if base and tool != "ft_launcher":
            ratio = ratio_cell([m[1] for m in r["per_run_medians_s"]], [m[1] for m in base["per_run_medians_s"]], 1)
        out.append(f"| {labels[tool]} | {fmt_range(r['failure_to_processes_started_s'], 2, unit='s')} | "
                   f"{fmt_range(r['failure_to_process_group_ready_s'], 2, unit='s')} | {ratio} | "
                   f"{r['unplanned_restarts']} | {len(r['failed_runs'])}"
                   f"{' (' + ', '.join(map(str, r['failed_runs'])) + ')' if r['failed_runs'] else ''} | "
                   f"{r.get('processes_left_behind', '-')} |")
    out.append("")
    return out


def render_footprint(result: dict, peer: bool) -> list[str]:
    title = "Footprint: memory per process, monitor CPU at 10 heartbeats/s"
    if (err := _error_section(title, result)):
        return err
    runs = result["runs"]
    reps = len(next(iter(runs.values())))
    window = next(iter(runs.values()))[0]["window_s"]
    out = [title,
           f"A real launcher with 2 workers (`bench/monitor_footprint.py`), measured after one restart (so "
           f"ours runs its warm template, trampolines and forked workers), while each worker sends 10 "
           f"heartbeats/s for {window:.0f} s; {reps} runs per tool. Memory from `/proc/<pid>/smaps_rollup` "
           "in MB (10⁶ bytes): **RSS** (resident), **PSS** (shared pages divided among the processes "
           "mapping them: the figures add up), **USS** (private: freed when the process ends). A forked "
           "process shares its parent's pages: NVRx forks its monitors from the launcher, ours forks the "
           "workers from the template, so compare PSS and the totals. Monitor CPU: its threads' time on "
           "CPU (`schedstat`) over the window, per minute, each monitor of each run.",
           "",
           "| tool | process | count | RSS MB | PSS MB | USS MB |",
           "| --- | --- | --- | --- | --- | --- |"]
    labels = {"ours": "ours (warm restarts)", "ours_cold": "ours --no-warm-restarts", "torchrun": "torchrun",
              "nvrx": "NVRx 0.4.1"}
    roles = ("launcher", "monitor", "warm_template", "trampoline", "worker")
    totals = []
    for tool in ("ours", "ours_cold", "torchrun", "nvrx"):
        if tool not in runs:
            continue
        for role in roles:
            entries = [p for r in runs[tool] for p in r["processes"] if p["role"] == role]
            if not entries:
                continue
            count = round(len(entries) / len(runs[tool]))
            cells = " | ".join(of([p[k] for p in entries], 1, 1 / 1000) for k in ("rss_kb", "pss_kb", "uss_kb"))
            each = " (each)" if count > 1 else ""
            out.append(f"| {labels[tool]} | {role.replace('_', ' ')}{each} | {count} | {cells} |")
        ft = [sum(p["pss_kb"] for p in r["processes"] if p["role"] != "worker") for r in runs[tool]]
        node = [sum(p["pss_kb"] for p in r["processes"]) for r in runs[tool]]
        cpu = [c for r in runs[tool] for c in r["monitor_cpu_s_per_min_at_10hz"]]
        totals.append((labels[tool], ft, node, cpu))
    out += ["", "| tool | PSS of launcher + monitors + template + trampolines | PSS of all, with the 2 workers | "
            "monitor CPU per minute at 10 Hz (each) |", "| --- | --- | --- | --- |"]
    for label, ft, node, cpu in totals:
        out.append(f"| {label} | {of(ft, 0, 1 / 1000, 'MB')} | {of(node, 0, 1 / 1000, 'MB')} | "
                   f"{of(cpu, 3, 1.0, 's') if cpu else '- (no monitor)'} |")
    out.append("")
    return out


def render_lightning(result: dict, peer: bool) -> list[str]:
    title = "Lightning step overhead of each callback"
    if (err := _error_section(title, result)):
        return err
    runs = result["runs"]
    first = runs["ours"][0]["results"][0]
    out = [title,
           f"One process, one `Trainer.fit` of BoringModel on CPU (`bench/lightning_overhead.py`): the callback "
           f"is taken out of `trainer.callbacks` and put back in alternating single-step blocks (ABBA), "
           f"{first['cpu']['pairs']} block pairs per callback per run, connected to a real monitor all along; "
           "added time per step = median over pairs of (with − without). *Wall* is what the step loses "
           "(NVRx's calls wait for the monitor's reply, which needs a CPU); *CPU* is the training thread's "
           "CPU time, which other processes disturb less. An empty `Callback` is the reference: Lightning "
           f"itself spends that much calling a callback's per-step hooks. {len(runs['ours'])} runs per tool, "
           "alternating.",
           "",
           "| callback | tool | added wall µs/step | added CPU µs/step | own hook code µs/step (hot loop) "
           "| step without it, CPU µs |",
           "| --- | --- | --- | --- | --- | --- |"]
    labels = {"empty": "empty `Callback`", "heartbeats": "`FaultToleranceCallback`",
              "sections": "`FaultToleranceSectionsCallback`"}
    values: dict[tuple[str, str], list[dict]] = {}
    for impl, impl_runs in runs.items():
        for run in impl_runs:
            for r in run["results"]:
                values.setdefault((r["callback"], impl), []).append(r)
    for callback in ("empty", "heartbeats", "sections"):
        for impl in ("ours", "nvrx"):
            rs = values.get((callback, impl))
            if not rs or (callback == "empty" and impl == "nvrx"):
                continue
            own = [r["own_hook_code_us_per_step"] for r in rs if r["own_hook_code_us_per_step"] is not None]
            out.append(f"| {labels[callback]} | {'NVRx' if impl == 'nvrx' else 'ours'} | "
                       f"{of([r['wall']['added_us_per_step_median'] for r in rs], 1)} | "
                       f"{of([r['cpu']['added_us_per_step_median'] for r in rs], 1)} | "
                       f"{of(own, 2) if own else '-'} | "
                       f"{of([r['cpu']['step_us_without_callback_median'] for r in rs], 0)} |")
    if peer:
        out += ["", "| callback | added wall: NVRx / ours | added wall: NVRx − ours |", "| --- | --- | --- |"]
        for callback in ("heartbeats", "sections"):
            o = [r["wall"]["added_us_per_step_median"] for r in values.get((callback, "ours"), [])]
            p = [r["wall"]["added_us_per_step_median"] for r in values.get((callback, "nvrx"), [])]
            diffs = [b - a for a, b in zip(o, p, strict=False)]
            out.append(f"| {labels[callback]} | {ratio_cell(p, o, 0)} | {of(diffs, 0, unit='µs')} |")
        out.append("")
        out.append("(A ratio is unstable when ours adds next to nothing: the difference is the robust figure.)")
    out.append("")
    return out


def render_goodput(result: dict, peer: bool) -> list[str]:
    title = "Goodput under faults"
    if (err := _error_section(title, result)):
        return err
    s = result["settings"]
    tools = result["tools"]
    out = [title,
           f"A 2-rank Lightning DDP job on CPU (`bench/goodput_train.py`: BoringModel, {s['step_time'] * 1000:.0f} ms "
           f"of sleep per step standing in for compute, gloo) trains {s['max_steps']} steps with a checkpoint every "
           f"{s['checkpoint_every']} steps, under `scripts/autoresume.sh --mode local` and each tool's "
           f"`ft_launcher` (`--max-restarts` covers every fault: the launcher's in-job restarts handle them, "
           f"autoresume.sh ends the job when the finished flag appears and would start a new launcher if "
           f"restarts ran out). Rank 1 makes {s['max_faults']} faults, one after every {s['fault_every']:g} s "
           f"of training of its process, alternately a hang (`SIGSTOP`) and a kill (`SIGKILL`). Equal timeouts: "
           f"first heartbeat 60 s, then `rank_heartbeat_timeout` {s['hb_timeout']:g} s; other settings default. "
           f"{s['runs']} runs with faults and {s['baseline_runs']} without per tool, alternating.",
           "",
           "- **goodput** = useful step time / wall time (autoresume.sh start → exit). Useful step time: for each "
           "of the steps the final model descends from (the last completion of each step), its duration; "
           "everything else — start-up, imports, checkpoints, detection, restarts, steps redone after a "
           "restart — is lost time.",
           "(A checkpoint save lands in the duration of the step after it: milliseconds here. The absolute "
           "goodput belongs to this small job, whose start-up is long next to its training; the comparison "
           "between tools is the point.)",
           "- **time to recover** = fault → first training step completed by the replacement processes. "
           "Split: fault → replacement processes started (detection, stopping, restarting) and the rest "
           "(interpreter, imports, Lightning and DDP set-up, checkpoint load, one step).",
           "",
           "| tool | goodput with faults | goodput without faults | wall time with faults | "
           "mean time to recover | hang: time to recover | hang: → processes started | kill: time to recover | "
           "kill: → processes started | faults recovered | unplanned restarts |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tool, label in (("ours", "ours"), ("ours_cold", "ours --no-warm-restarts"), ("nvrx", "NVRx 0.4.1")):
        if tool not in tools:
            continue
        f, b = tools[tool]["with_faults"], tools[tool]["fault_free"]
        out.append(f"| {label} | {fmt_range(f['goodput'], 3)} | {fmt_range(b['goodput'], 3)} | "
                   f"{fmt_range(f['wall_s'], 1, unit='s')} | {fmt_range(f['mttr_s'], 2, unit='s')} | "
                   f"{fmt_range(f['mttr_hang_s'], 2, unit='s')} | "
                   f"{fmt_range(f['to_process_started_hang_s'], 2, unit='s')} | "
                   f"{fmt_range(f['mttr_kill_s'], 2, unit='s')} | "
                   f"{fmt_range(f['to_process_started_kill_s'], 2, unit='s')} | "
                   f"{f['faults_recovered']}/{f['faults_injected']} | {f['unplanned_restarts']} |")
    out += ["", "Where the time of a run goes (runs without faults, then with faults):", "",
            "| tool | faults | wall time | useful step time | autoresume.sh start → first step | last step → exit "
            "| of which rank 0's `fit` returned → exit |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for tool, label in (("ours", "ours"), ("ours_cold", "ours --no-warm-restarts"), ("nvrx", "NVRx 0.4.1")):
        if tool not in tools:
            continue
        for key, faults in (("fault_free", "none"), ("with_faults", str(s["max_faults"]))):
            f = tools[tool][key]
            out.append(f"| {label} | {faults} | {fmt_range(f['wall_s'], 1, unit='s')} | "
                       f"{fmt_range(f.get('useful_step_s'), 1, unit='s')} | "
                       f"{fmt_range(f.get('start_to_first_step_s'), 1, unit='s')} | "
                       f"{fmt_range(f.get('last_step_to_exit_s'), 1, unit='s')} | "
                       f"{fmt_range(f.get('fit_returned_to_exit_s'), 1, unit='s')} |")
    left = {tool: sum(r.get("processes_left_behind", 0) for r in v["runs"] + v["baseline_runs"])
            for tool, v in tools.items()}
    out += ["", "Processes still alive after autoresume.sh exited (the harness kills them): " +
            ", ".join(f"{'NVRx' if t == 'nvrx' else t} {n}" for t, n in left.items()) + "."]
    if peer and "nvrx" in tools and "ours" in tools:
        o_runs, p_runs = tools["ours"]["runs"], tools["nvrx"]["runs"]
        out += ["", "| paired runs with faults | NVRx / ours |", "| --- | --- |",
                f"| wall time | {ratio_cell([r['wall_s'] for r in p_runs], [r['wall_s'] for r in o_runs], 2)} |",
                f"| goodput (ours / NVRx) | "
                f"{ratio_cell([r['goodput'] for r in o_runs], [r['goodput'] for r in p_runs], 2)} |",
                f"| mean time to recover | "
                f"{ratio_cell([r['mttr_s'] for r in p_runs], [r['mttr_s'] for r in o_runs], 1)} |"]
    out.append("")
    return out


def render_soak(result: dict, peer: bool) -> list[str]:
    title = "Soak: no false kills under calculated timeouts, and how fast real hangs are caught"
    if (err := _error_section(title, result)):
        return err
    runs = result["runs"]
    main = runs.get("default") or next(iter(runs.values()))
    s = main["settings"]
    out = [title,
           f"A 2-rank training loop (`bench/soak_train.py`: `ft_core.client.integration`, gloo on CPU) under "
           f"`scripts/autoresume.sh --mode local` and `ft_launcher`, for {s['duration'] / 60:.0f} minutes of job time "
           f"with realistic jitter: step times of {s['step_time'] * 1000:.0f} ms median with a log-normal spread "
           f"and a Pareto tail ({s['tail_p'] * 100:g} % of steps, up to 40x), "
           f"pauses of 0.5-3 s ({s['pause_p'] * 100:g} % "
           f"of steps on each rank, in a step or between steps: the other rank waits in the next all-reduce), a slow "
           f"first step (2-6 s) in every run, an evaluation of {s['eval_steps']} steps every {s['eval_every']} steps, "
           f"a checkpoint of 0.2-3 s every {s['ckpt_every']} steps, and a resume in the middle (SIGUSR1 to "
           f"autoresume.sh at {s['resume_at']:.0f} s: the graceful stop saves, the next attempt resumes). The section "
           "timeouts start configured (600 s) and are calculated by the job (`calculate_timeouts=True`): `step` and "
           "`checkpointing` after the first checkpoint, `setup` and out-of-section in every run that resumed; "
           "`safety_factor` 5. Real hangs are injected into the same run (a rank sleeps in a step, in a "
           "checkpoint, or between steps until its monitor stops it). *False kills*: failures in a cycle without an "
           "injected hang (a healthy rank stopped; goal 0). *Latency*: the hang's start → the first failure record "
           "of its cycle (the timeout in force, plus the monitor's wake-up and report). Minimums: *default* are the "
           "`min_calculated_*` defaults (section 60 s, out-of-section 120 s); *old* are 1 s (initial heartbeat 10 s), "
           "what the client applied before these config fields existed.",
           "",
           "| minimums | job time | false kills | hangs caught | pauses (longest) | longest step "
           "| smallest calculated `step` timeout in force | resumed at step | finished |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, run in runs.items():
        caught = sum(1 for h in run["hangs"] if h["detected"])
        smallest = run.get("smallest_step_timeout_s")
        out.append(f"| {name} | {run['wall_s'] / 60:.1f} min | **{run['false_kills']}** | "
                   f"{caught}/{len(run['hangs'])} | "
                   f"{run['pauses']} ({run['longest_pause_s']:.1f} s) | {run.get('longest_step_s', 0.0):.1f} s | "
                   f"{'-' if smallest is None else f'{smallest:.2f} s'} | "
                   f"{', '.join(str(x) for x in run['resumed_at_steps'][1:]) or '-'} | "
                   f"{'yes' if run['finished'] else 'no'} |")
    out += ["", "Injected hangs (default minimums):", "",
            "| hang | on rank | caught after | timeout that fired | named | ",
            "| --- | --- | --- | --- | --- |"]
    for hang in main["hangs"]:
        fired = "-" if hang["timeout_s"] is None else f"{hang['detected_kind']} {hang['timeout_s']:g} s"
        if hang.get("section"):
            fired += f" (`{hang['section']}`)"
        caught = "not caught" if hang["latency_s"] is None else f"{hang['latency_s']:.2f} s"
        out.append(f"| in {hang['where'].replace('_', ' ')} (step {hang['step']}) | {hang['rank']} | "
                   f"{caught} | {fired} | rank {hang['detected_rank']} |")
    old = runs.get("old")
    if old and old["false_kill_records"]:
        out += ["", "What killed healthy ranks with the old minimums (first records):", ""]
        for record in old["false_kill_records"][:4]:
            out.append(f"- cycle {record['cycle']}, rank {record['rank']}: {record['cause']}")
    out.append("")
    return out


def merge_pages(new: str, old: str, ran: list[str]) -> str:
    """``new`` with the sections of the scenarios it lacks taken from ``old`` (an earlier page)."""

    def split(text: str) -> tuple[list[str], list[tuple[str, list[str]]], list[str]]:
        head, sections, tail, current = [], [], [], None
        for line in text.splitlines():
            if line.startswith("## "):
                title = line[3:].split(". ", 1)[1] if line[3:].split(". ", 1)[0].isdigit() else line[3:]
                current = (title, [])
                sections.append(current)
            elif current is None:
                head.append(line)
            else:
                current[1].append(line)
        numbered = [sec for sec in sections if sec[0] not in ("What could not be compared",)
                    and not sec[0].startswith("Reference:")]
        tail_sections = [sec for sec in sections if sec not in numbered]
        for title, body in tail_sections:
            tail += [f"## {title}", *body]
        return head, numbered, tail

    new_head, new_sections, new_tail = split(new)
    _, old_sections, _ = split(old)
    old_date = next((line.split("|")[2].strip() for line in old.splitlines() if line.startswith("| date |")), "?")
    by_title = {title: body for title, body in new_sections}
    kept = [(title, body) for title, body in old_sections if title not in by_title]
    order = [t for t, _ in old_sections] + [t for t, _ in new_sections if t not in dict(old_sections)]
    merged = dict(kept) | by_title
    lines = list(new_head)
    if kept:
        at = next((i for i, line in enumerate(lines) if line.startswith("| machine |")), len(lines))
        lines[at:at] = [f"> **Note:** the sections {', '.join(t for t, _ in kept)} are from an earlier run "
                        f"({old_date}); this run ({', '.join(ran)}) replaced the others.", ""]
    for number, title in enumerate(order, start=1):
        lines += [f"## {number}. {title}", *merged[title]]
    return "\n".join(lines + new_tail).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer-python", default=None, help="python of the venv with NVRx (make bench-peer)")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="few, short repetitions (a functional check)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--note", action="append", default=[], help="a remark printed at the top of the page")
    parser.add_argument("--render-only", type=Path, default=None, help="re-render the page from a results file")
    args = parser.parse_args()

    if args.render_only:
        data = json.loads(args.render_only.read_text())
        args.out.write_text(render(data))
        print(f"run_all: wrote {args.out}")
        return 0
    if args.peer_python and not Path(args.peer_python).exists():
        parser.error(f"--peer-python {args.peer_python!r} does not exist (make bench-peer creates .venv-peer)")

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    logs = args.results_dir / "logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ftb"))
    become_subreaper()
    ctx = Context(args, work, logs)
    started = time.monotonic()
    meta: dict[str, Any] = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
                            "quick": args.quick, "notes": list(args.note)}
    try:
        machine = machine_info(ctx)
        meta["busy_before"] = busy_fraction(3.0)
        results: dict[str, Any] = {}
        for scenario in args.only:
            t0 = time.monotonic()
            print(f"run_all: {scenario} ...", flush=True)
            try:
                results[scenario] = RUNNERS[scenario](ctx)
            except Exception as exc:  # one broken scenario must not lose the others' figures
                results[scenario] = {"error": str(exc)}
                print(f"run_all: {scenario} FAILED: {exc}", flush=True)
            print(f"run_all: {scenario} took {time.monotonic() - t0:.0f} s", flush=True)
        meta["busy_after"] = busy_fraction(3.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["wall_s"] = time.monotonic() - started
    meta["commands"] = ctx.commands
    busiest = max(meta["busy_before"], meta["busy_after"])
    if busiest > 0.15:
        meta["notes"].append(f"other processes kept the CPUs {busiest * 100:.0f}% busy around this run "
                             "(see the machine table): absolute figures are inflated, ratios less so.")
    data = {"machine": machine, "meta": meta, "results": results}
    raw = args.results_dir / f"{stamp}.json"
    raw.write_text(json.dumps(data, indent=1))
    page = render(data)
    if set(args.only) != set(SCENARIOS) and args.out.exists():
        page = merge_pages(page, args.out.read_text(), list(args.only))
    args.out.write_text(page)
    print(f"run_all: wrote {args.out} and {raw} in {meta['wall_s'] / 60:.1f} min", flush=True)
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("error") and len(v) == 1]
    if failed:
        print(f"run_all: scenarios that failed: {', '.join(failed)} (logs in {logs})", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
