"""The GPU check's decisions: parsing what the runs left and judging each scenario. Pure, stdlib only.

Every function here takes text or records (the launcher's event log, parsed) and returns figures
or a :class:`~bench.gpu_scenarios.report.Result`, so ``tests/unit/test_gpu_check.py`` checks them
on CPU with made-up inputs; ``bench/gpu_scenarios/scenarios.py`` gathers the inputs on a GPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.gpu_scenarios.report import Result

# What torch's NCCL watchdog writes when it, not our monitor, ended a collective (torch 2.8-2.15).
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck"
                       r"|Some NCCL operations have failed or timed out|NCCL watchdog thread terminated")
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected[^\n]*")


def parse_events(text: str) -> list[dict[str, Any]]:
    """The records of an event log (JSON lines); lines that are not JSON objects are skipped."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "event" in record:
            records.append(record)
    return records


def events(records: Iterable[Mapping[str, Any]], kind: str, cycle: int | None = None) -> list[Mapping[str, Any]]:
    """The records of ``kind`` (of ``cycle`` when given), in log order."""
    return [r for r in records if r.get("event") == kind and (cycle is None or r.get("cycle") == cycle)]


def two_rank_plan(gpus: int, shared_ok: bool | None, shared_reason: str = "") -> str | None:
    """Why a scenario that needs 2 NCCL ranks cannot run here, or ``None`` when it can.

    Args:
        gpus: CUDA devices visible.
        shared_ok: Whether 2 NCCL ranks on one device formed a group and all-reduced (``None``: not
            tried, as with 2 or more devices).
        shared_reason: What NCCL said when it refused.
    """
    if gpus >= 2:
        return None
    if gpus < 1:
        return "no CUDA device"
    if shared_ok:
        return None
    said = f" ({shared_reason})" if shared_reason else ""
    return f"needs 2 GPUs: NCCL refuses 2 ranks on this machine's one GPU{said}"


def nccl_refusal(text: str) -> str:
    """NCCL's reason in a failed 2-ranks-on-one-GPU probe's output, shortened to one line."""
    found = _DUPLICATE_GPU.search(text)
    if found:
        return found.group(0).strip()
    lines = [line.strip() for line in text.splitlines() if "Error" in line or "error" in line]
    return (lines[-1] if lines else "no output")[:200]


def watchdog_fired(text: str) -> str | None:
    """The first line where torch's NCCL watchdog acted, or ``None``."""
    for line in text.splitlines():
        if _WATCHDOG.search(line):
            return line.strip()[:200]
    return None


def parse_compute_apps(csv_text: str) -> list[tuple[int, float]]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``: (pid, MiB) pairs."""
    apps = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            try:
                apps.append((int(parts[0]), float(parts[1].split()[0])))
            except (ValueError, IndexError):
                apps.append((int(parts[0]), float("nan")))
    return apps


def maps_have_cuda(maps_text: str) -> bool:
    """Whether a ``/proc/<pid>/maps`` text maps the CUDA driver (``libcuda.so``): a CUDA context needs it."""
    return any("libcuda.so" in line for line in maps_text.splitlines())


def proc_state(stat_text: str) -> str:
    """The state letter of a ``/proc/<pid>/stat`` line (``R``, ``S``, ``D``, ``Z``...)."""
    return stat_text.rsplit(")", 1)[1].split()[0]


def _finished(records: Sequence[Mapping[str, Any]], rc: int | None) -> str | None:
    if rc is None:
        return "the launcher did not end within its bound"
    if rc != 0:
        result = events(records, "result")
        said = f" ({result[-1].get('message') or result[-1].get('reason') or ''})" if result else ""
        return f"the launcher exited with {rc}{said}"
    return None


def judge_nccl_hang(records: Sequence[Mapping[str, Any]], *, rc: int | None, hang_at: float | None,
                    heartbeat_timeout: float, output: str, left: Sequence[int], d_state: Sequence[int],
                    gpu_apps_after: Sequence[int]) -> Result:
    """Scenario 1: the hang in the collective is the monitor's catch, not NCCL's, and nothing is left.

    Args:
        records: The launcher's event log.
        rc: The launcher's exit code (``None``: killed at the bound).
        hang_at: Epoch when rank 1 stopped calling the collective (its marker file).
        heartbeat_timeout: The ``rank_heartbeat_timeout`` the run had.
        output: Everything the launcher and its workers printed.
        left: Pids of ours still alive after the launcher ended.
        d_state: Pids seen in ``D`` state (uninterruptible) while or after they were stopped.
        gpu_apps_after: Pids the GPU still listed as compute processes after the run.
    """
    problems = []
    figures: dict[str, Any] = {}
    roots = [f for f in events(records, "failure", 0) if f.get("role") == "root"] or events(records, "failure", 0)
    if not roots:
        problems.append("no failure recorded in cycle 0")
    else:
        root = roots[0]
        figures["cause"] = root.get("cause_kind")
        if root.get("cause_kind") != "hang":
            problems.append(f"the first failure was {root.get('cause_kind')!r} ({root.get('cause')}), not a hang")
        if hang_at is not None and root.get("detected_at") is not None:
            latency = float(root["detected_at"]) - hang_at
            figures["detected_after_s"] = round(latency, 2)
            if latency > heartbeat_timeout + 15:
                problems.append(f"detected {latency:.1f} s after the hang (timeout {heartbeat_timeout} s)")
    restarted = events(records, "cycle_start", 1)
    if restarted and restarted[0].get("since_failure_s") is not None:
        figures["failure_to_restart_s"] = round(float(restarted[0]["since_failure_s"]), 2)
    elif not problems:
        problems.append("no second cycle started")
    fired = watchdog_fired(output)
    figures["nccl_watchdog_fired"] = fired is not None
    if fired:
        problems.append(f"NCCL's watchdog acted: {fired}")
    if left:
        problems.append(f"processes left after the run: {sorted(left)}")
    if d_state:
        problems.append(f"processes in D state: {sorted(d_state)}")
    if gpu_apps_after:
        problems.append(f"the GPU still lists processes after the run: {sorted(gpu_apps_after)}")
    figures["left"] = len(left)
    done = _finished(records, rc)
    if done:
        problems.append(done)
    return Result("nccl_hang", "fail" if problems else "pass", "; ".join(problems), figures)


def judge_gpu_memory(samples: Sequence[Mapping[str, Any]], *, rc: int | None, records: Sequence[Mapping[str, Any]],
                     fraction: float) -> Result:
    """Scenario 2: at each restarted worker's start the dead worker's memory was free and its pid gone.

    Args:
        samples: What the worker wrote at the start of each cycle: ``cycle``, ``free_mib``,
            ``total_mib``, ``apps`` (pids the GPU listed), ``old_pids`` (the earlier workers'),
            ``alloc_ok`` (the allocation of ``fraction`` of the memory), ``alloc_error``.
        rc: The launcher's exit code.
        records: The event log.
        fraction: The share of the device's memory each worker takes.
    """
    problems = []
    figures: dict[str, Any] = {}
    by_cycle = {int(s["cycle"]): s for s in samples}
    if 0 not in by_cycle:
        return Result("gpu_memory", "fail", "the first worker wrote no sample", figures)
    base_free = float(by_cycle[0]["free_mib"])
    figures["free_at_start_gib"] = round(base_free / 1024, 1)
    for cycle in (1, 2):
        sample = by_cycle.get(cycle)
        if sample is None:
            problems.append(f"no restarted worker of cycle {cycle} wrote a sample")
            continue
        free = float(sample["free_mib"])
        figures[f"cycle{cycle}_free_gib"] = round(free / 1024, 1)
        # The earlier worker held `fraction` of the memory: if any of it is still held the new worker
        # sees less than the first one did, by about that much.
        if free < base_free - 0.25 * fraction * float(sample["total_mib"]):
            problems.append(f"cycle {cycle} started with {free:.0f} MiB free, the first worker had {base_free:.0f}")
        stale = sorted(set(sample.get("apps", [])) & set(sample.get("old_pids", [])))
        if stale:
            problems.append(f"cycle {cycle}: the GPU still listed dead workers {stale}")
        if not sample.get("alloc_ok"):
            problems.append(f"cycle {cycle}: the first allocation failed: {sample.get('alloc_error')}")
        start = events(records, "cycle_start", cycle)
        if start and start[0].get("since_failure_s") is not None:
            figures[f"cycle{cycle}_failure_to_restart_s"] = round(float(start[0]["since_failure_s"]), 2)
    done = _finished(records, rc)
    if done:
        problems.append(done)
    return Result("gpu_memory", "fail" if problems else "pass", "; ".join(problems), figures)


def judge_warm(records: Sequence[Mapping[str, Any]], *, rc: int | None, losses: Mapping[int, Sequence[float]],
               template_maps_cuda: bool | None, worker_device: str | None) -> Result:
    """Scenario 3: the template stayed CUDA-free and the warm-started worker trained as the first did.

    Args:
        records: The event log.
        rc: The launcher's exit code.
        losses: Per cycle, the losses of the steps it trained (from step 0, the same seed).
        template_maps_cuda: Whether the template mapped ``libcuda.so`` (``None``: not seen alive).
        worker_device: The device the restarted worker trained on, as it reported it.
    """
    problems = []
    figures: dict[str, Any] = {}
    ready = events(records, "warm_template_ready")
    if not ready:
        problems.append("no warm template became ready")
    else:
        figures["template_cuda_initialized"] = bool(ready[0].get("cuda_initialized"))
        if ready[0].get("cuda_initialized") is not False:
            problems.append(f"the template reported cuda_initialized={ready[0].get('cuda_initialized')!r}")
    if template_maps_cuda is not None:
        figures["template_maps_libcuda"] = template_maps_cuda
        if template_maps_cuda:
            problems.append("the template process maps libcuda.so")
    start = events(records, "cycle_start", 1)
    if not start or start[0].get("warm_start") is not True:
        problems.append("the restarted worker did not start warm"
                        + (f" ({start[0].get('cold_reason')})" if start and start[0].get("cold_reason") else ""))
    figures["device"] = worker_device or "?"
    if not worker_device or not worker_device.startswith("cuda"):
        problems.append(f"the restarted worker trained on {worker_device!r}, not a GPU")
    first, second = list(losses.get(0, [])), list(losses.get(1, []))
    common = min(len(first), len(second))
    if common == 0:
        problems.append("no losses to compare")
    else:
        worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(first[:common], second[:common], strict=True))
        figures["steps_compared"] = common
        figures["max_rel_loss_diff"] = float(f"{worst:.3g}")
        if worst > 1e-4:
            problems.append(f"the warm-started worker's losses differ from the first's (relative {worst:.2g})")
    done = _finished(records, rc)
    if done:
        problems.append(done)
    return Result("warm_template", "fail" if problems else "pass", "; ".join(problems), figures)


_REPORT = re.compile(r"^report \d+: step (\d+) individual (\S+) median compute ([\d.]+) ms over (\d+) samples")
_STEPS = re.compile(r"^(\d+) steps in ([\d.]+) s")


def parse_straggler_check(text: str) -> dict[str, Any]:
    """What ``bench/straggler_cuda_check.py`` printed: its verdict, reports and timing."""
    reports = []
    parsed: dict[str, Any] = {"ok": None, "reports": reports, "steps": None, "seconds": None}
    for line in text.splitlines():
        line = line.strip()
        if m := _REPORT.match(line):
            score = None if m.group(2) == "None" else float(m.group(2))
            reports.append({"step": int(m.group(1)), "individual": score, "median_ms": float(m.group(3)),
                            "samples": int(m.group(4))})
        elif m := _STEPS.match(line):
            parsed["steps"], parsed["seconds"] = int(m.group(1)), float(m.group(2))
        elif line.startswith("CUDA path:"):
            parsed["ok"] = line == "CUDA path: OK"
            parsed["verdict"] = line
    return parsed


def judge_straggler(parsed: Mapping[str, Any], rc: int | None, reference: str) -> Result:
    """Scenario 4 from :func:`parse_straggler_check`'s output; ``reference`` says about the reference's cost."""
    figures: dict[str, Any] = {"reports": len(parsed["reports"])}
    if parsed.get("steps") and parsed.get("seconds"):
        figures["step_ms"] = round(1000 * parsed["seconds"] / parsed["steps"], 3)
    medians = [r["median_ms"] for r in parsed["reports"] if r["samples"]]
    if medians:
        figures["compute_median_ms"] = f"{min(medians):.3f}-{max(medians):.3f}"
    figures["vs_reference"] = reference
    if rc is None:
        return Result("straggler_cuda", "fail", "did not end within its bound", figures)
    if rc == 0 and parsed.get("ok"):
        return Result("straggler_cuda", "pass", "", figures)
    return Result("straggler_cuda", "fail", parsed.get("verdict") or f"exit code {rc}, no verdict", figures)


def judge_example(records: Sequence[Mapping[str, Any]], *, rc: int | None, output: str, fault: str,
                  max_steps: int) -> tuple[list[str], dict[str, Any]]:
    """One example run of scenario 5: (problems, figures) for a ``rank_hung`` or ``rank_killed`` fault."""
    problems = []
    figures: dict[str, Any] = {}
    if not re.search(r"GPU available: True \(cuda\), used: True", output):
        problems.append(f"{fault}: Lightning did not train on the GPU")
    roots = [f for f in events(records, "failure") if f.get("role") == "root"] or events(records, "failure")
    want = "hang" if fault == "rank_hung" else ("exit", "signal")
    if not roots:
        problems.append(f"{fault}: no failure recorded")
    elif roots[0].get("cause_kind") not in ((want,) if isinstance(want, str) else want):
        problems.append(f"{fault}: the failure was {roots[0].get('cause_kind')!r}, expected {want}")
    starts = events(records, "cycle_start")
    if len(starts) < 2:
        problems.append(f"{fault}: not restarted")
    elif starts[1].get("since_failure_s") is not None:
        figures[f"{fault}_restart_s"] = round(float(starts[1]["since_failure_s"]), 2)
    if not re.search(rf"fit returned at step {max_steps} of {max_steps}", output):
        problems.append(f"{fault}: training did not reach step {max_steps}")
    done = _finished(records, rc)
    if done:
        problems.append(f"{fault}: {done}")
    return problems, figures


def judge_jit(records: Sequence[Mapping[str, Any]], *, rc: int | None, resumed_step: int | None) -> Result:
    """Scenario 6: a ``state_saved`` by the blocked survivor, and the restart resumed from its step.

    A ``state_not_saved`` record fails the scenario with its reason: the check then says why not.
    """
    figures: dict[str, Any] = {}
    saved = events(records, "state_saved")
    declined = events(records, "state_not_saved")
    if not saved:
        why = declined[0].get("reason") if declined else "no state_saved or state_not_saved record"
        return Result("jit_state_gpu", "fail", f"no state saved: {why}", figures)
    record = saved[0]
    figures.update({"rank": record.get("rank"), "source": record.get("source"), "step": record.get("step"),
                    "mib": round(float(record.get("bytes") or 0) / 2**20, 1),
                    "save_s": record.get("seconds")})
    problems = []
    if record.get("source") != "blocked":
        problems.append(f"saved by the {record.get('source')!r} path, not by a rank blocked in the collective")
    if resumed_step is None:
        problems.append("the restarted ranks did not resume from the saved state")
    elif record.get("step") is not None and resumed_step != record.get("step"):
        problems.append(f"resumed at step {resumed_step}, saved step {record.get('step')}")
    figures["resumed_step"] = resumed_step
    done = _finished(records, rc)
    if done:
        problems.append(done)
    return Result("jit_state_gpu", "fail" if problems else "pass", "; ".join(problems), figures)

