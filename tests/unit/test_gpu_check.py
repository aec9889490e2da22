"""Issue 34: ``make gpu-check`` skips cleanly without CUDA, and its pure parts (parsing, the table,
the decisions) hold on CPU. The scenarios themselves need a GPU (docs/benchmarks.md, GPU check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_scenarios import decide, report
from bench.gpu_scenarios.report import Result

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_without_cuda_one_line_exit_0_every_scenario_skipped_and_json_written(tmp_path):
    out = tmp_path / "gpu.json"
    # This machine's torch is CPU-only: the check must find no CUDA in any interpreter it tries.
    run = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--python", sys.executable,
                          "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=100, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA"), run.stdout
    document = json.loads(out.read_text())
    results = report.from_json(document)
    assert [r.id for r in results] == [s.id for s in report.SCENARIOS]
    assert {r.result for r in results} == {"skipped"}
    assert document["machine"]["cuda"] is False


def test_table_has_one_row_per_result_with_reason_and_figures():
    lines = report.table_lines([
        Result("nccl_hang", "pass", "", {"detected_after_s": 10.43, "nccl_watchdog_fired": False}),
        Result("jit_state_gpu", "skipped", "needs 2 GPUs | NCCL"),
    ])
    assert lines[0] == "| # | scenario | result | figures |"
    assert lines[2].startswith("| 1 | nccl_hang: ")
    assert "| pass | detected_after_s 10.4; nccl_watchdog_fired no |" in lines[2]
    assert "| skipped: needs 2 GPUs / NCCL | - |" in lines[3]  # a | in a reason cannot break the row
    assert report.summary_line([Result("nccl_hang", "pass"), Result("gpu_memory", "fail"),
                                Result("warm_template", "pass")]) == "gpu-check: 2 pass, 1 fail"


def test_exit_code_fails_only_on_fail_or_error():
    assert report.exit_code(report.all_skipped("no CUDA")) == 0
    assert report.exit_code([Result("nccl_hang", "pass"), Result("gpu_memory", "error", "boom")]) == 1


def test_results_refuse_unknown_outcomes_and_scenarios():
    with pytest.raises(ValueError, match="result must be one of"):
        Result("nccl_hang", "ok")
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        Result("nope", "pass")


def test_json_round_trip_and_docs_section_replaced_in_place():
    results = [Result("nccl_hang", "pass", "", {"left": 0}), *report.all_skipped("x", ["gpu_memory"])]
    document = report.to_json(results, {"gpu_summary": "1 x NVIDIA H200", "torch": "2.11", "nccl": "2.27.5"},
                              12.34, "today")
    assert report.from_json(json.loads(json.dumps(document))) == results
    page = "# B\n\n## 1. A\n\ntext\n\n" + "\n".join(report.doc_section(None)) + "\n## Reference: other\n\nkept\n"
    new = report.replace_section(page, report.doc_section(document))
    assert "No GPU run recorded yet" not in new and "| 1 | nccl_hang" in new and "1 x NVIDIA H200" in new
    assert new.endswith("## Reference: other\n\nkept\n") and new.startswith("# B\n\n## 1. A\n\ntext\n")
    assert report.replace_section("# B\n", report.doc_section(None)).count(report.SECTION_TITLE) == 1
    with pytest.raises(ValueError, match="not a gpu-check results document"):
        report.from_json({"format": 99})


def test_the_benchmarks_page_carries_the_gpu_section_as_run_all_renders_it():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    last = REPO / "bench" / "gpu_check_last.json"
    section = report.doc_section(json.loads(last.read_text()) if last.exists() else None)
    assert "\n".join(section).strip() in page


def test_two_rank_plan_needs_two_gpus_unless_nccl_shares_one():
    assert decide.two_rank_plan(2, None) is None
    assert decide.two_rank_plan(1, True) is None
    reason = decide.two_rank_plan(1, False, "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000")
    assert reason.startswith("needs 2 GPUs") and "Duplicate GPU" in reason
    text = "noise\nncclInvalidUsage\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n"
    assert decide.nccl_refusal(text) == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"


def test_parsers_of_nvidia_smi_proc_and_event_logs():
    assert decide.parse_compute_apps("1234, 81920\n5678, 10 MiB\nNo running processes found\n") == [
        (1234, 81920.0), (5678, 10.0)]
    assert decide.maps_have_cuda("7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n")
    assert not decide.maps_have_cuda("7f00-7f10 r-xp 0 08:01 1 /opt/torch/lib/libtorch_cpu.so\n")
    assert decide.proc_state("42 (python (x)) D 1 42 42 0") == "D"
    records = decide.parse_events('{"event": "failure", "cycle": 0}\nnot json\n[1]\n'
                                  '{"event": "cycle_start", "cycle": 1}')
    assert [r["event"] for r in records] == ["failure", "cycle_start"]
    assert decide.events(records, "cycle_start", 1) == [records[1]] and decide.events(records, "failure", 1) == []
    assert decide.watchdog_fired("ok\n[rank0]:[E] Watchdog caught collective operation timeout: WorkNCCL(...)\n")
    assert decide.watchdog_fired("[ft_launcher] cycle 0: rank 1 hung\n") is None


def _hang_records(cause_kind="hang", detected_at=1010.5):
    return [{"event": "failure", "cycle": 0, "role": "root", "cause_kind": cause_kind, "cause": "x",
             "detected_at": detected_at},
            {"event": "cycle_start", "cycle": 1, "since_failure_s": 3.2}]


def test_nccl_hang_passes_only_when_ours_caught_it_and_nothing_was_left():
    good = dict(rc=0, hang_at=1000.0, heartbeat_timeout=10.0, output="", left=[], d_state=[], gpu_apps_after=[])
    result = decide.judge_nccl_hang(_hang_records(), **good)
    assert result.result == "pass", result.reason
    assert result.figures["detected_after_s"] == 10.5 and result.figures["failure_to_restart_s"] == 3.2
    watchdog = decide.judge_nccl_hang(
        _hang_records(), **(good | {"output": "[E] Watchdog caught collective operation timeout"}))
    assert watchdog.result == "fail" and "NCCL's watchdog acted" in watchdog.reason
    crashed = decide.judge_nccl_hang(_hang_records(cause_kind="signal"), **good)
    assert crashed.result == "fail" and "not a hang" in crashed.reason
    leftovers = decide.judge_nccl_hang(_hang_records(), **(good | {"left": [77], "d_state": [77]}))
    assert "left after the run: [77]" in leftovers.reason and "D state: [77]" in leftovers.reason
    late = decide.judge_nccl_hang(_hang_records(detected_at=1100.0), **good)
    assert late.result == "fail" and "detected 100.0 s after" in late.reason
    assert "did not end" in decide.judge_nccl_hang(_hang_records(), **(good | {"rc": None})).reason


def _sample(cycle, free, apps=(), old=(), ok=True):
    return {"cycle": cycle, "free_mib": free, "total_mib": 140000.0, "apps": list(apps), "old_pids": list(old),
            "alloc_ok": ok, "alloc_error": None if ok else "CUDA out of memory"}


def test_gpu_memory_fails_when_a_dead_worker_still_holds_memory_or_is_listed():
    records = [{"event": "cycle_start", "cycle": 1, "since_failure_s": 2.0},
               {"event": "cycle_start", "cycle": 2, "since_failure_s": 2.5}]
    samples = [_sample(0, 139000.0), _sample(1, 138900.0, apps=[11], old=[10]), _sample(2, 139000.0)]
    result = decide.judge_gpu_memory(samples, rc=0, records=records, fraction=0.6)
    assert result.result == "pass", result.reason
    assert result.figures["cycle1_failure_to_restart_s"] == 2.0
    held = decide.judge_gpu_memory([samples[0], _sample(1, 55000.0, ok=False), samples[2]], rc=0,
                                   records=records, fraction=0.6)
    assert held.result == "fail" and "cycle 1 started with 55000 MiB free" in held.reason
    assert "first allocation failed" in held.reason
    listed = decide.judge_gpu_memory([samples[0], _sample(1, 139000.0, apps=[10, 11], old=[10]), samples[2]],
                                     rc=0, records=records, fraction=0.6)
    assert "still listed dead workers [10]" in listed.reason
    assert "no restarted worker of cycle 2" in decide.judge_gpu_memory(samples[:2], rc=1, records=records,
                                                                       fraction=0.6).reason


def test_warm_template_decision():
    records = [{"event": "warm_template_ready", "pid": 5, "cuda_initialized": False},
               {"event": "cycle_start", "cycle": 1, "warm_start": True}]
    losses = {0: [1.0, 0.9, 0.8], 1: [1.0, 0.9, 0.8, 0.7]}
    ok = decide.judge_warm(records, rc=0, losses=losses, template_maps_cuda=False, worker_device="cuda:0")
    assert ok.result == "pass", ok.reason
    assert ok.figures["steps_compared"] == 3
    bad = decide.judge_warm([{"event": "warm_template_ready", "pid": 5, "cuda_initialized": True},
                             {"event": "cycle_start", "cycle": 1, "warm_start": False, "cold_reason": "template died"}],
                            rc=0, losses={0: [1.0], 1: [2.0]}, template_maps_cuda=True, worker_device="cpu")
    for text in ("cuda_initialized=True", "maps libcuda.so", "did not start warm (template died)",
                 "not a GPU", "losses differ"):
        assert text in bad.reason


STRAGGLER_OUTPUT = """\
report 0: step 310 individual 1.0 median compute 1.210 ms over 100 samples
report 1: step 620 individual 0.99 median compute 1.215 ms over 100 samples
report 2: step 1700 individual 0.41 median compute 2.950 ms over 100 samples
3000 steps in 6.02 s
CUDA path: OK
"""


def test_straggler_check_output_is_parsed_and_judged():
    parsed = decide.parse_straggler_check(STRAGGLER_OUTPUT)
    assert parsed["ok"] is True and parsed["steps"] == 3000 and len(parsed["reports"]) == 3
    assert parsed["reports"][2] == {"step": 1700, "individual": 0.41, "median_ms": 2.95, "samples": 100}
    result = decide.judge_straggler(parsed, 0, "not measured")
    assert result.result == "pass" and result.figures["step_ms"] == 2.007
    failed = decide.parse_straggler_check(STRAGGLER_OUTPUT.replace("CUDA path: OK", "CUDA path: FAILED (fast [1])"))
    assert decide.judge_straggler(failed, 1, "-").reason == "CUDA path: FAILED (fast [1])"
    assert decide.judge_straggler(decide.parse_straggler_check(""), 2, "-").result == "fail"


def test_example_and_jit_decisions():
    records = [{"event": "failure", "role": "root", "cause_kind": "hang"},
               {"event": "cycle_start", "cycle": 0}, {"event": "cycle_start", "cycle": 1, "since_failure_s": 4.0}]
    output = "GPU available: True (cuda), used: True\n... fit returned at step 60 of 60\n"
    assert decide.judge_example(records, rc=0, output=output, fault="rank_hung", max_steps=60) == (
        [], {"rank_hung_restart_s": 4.0})
    problems, _ = decide.judge_example(records, rc=0, output="GPU available: False", fault="rank_killed",
                                       max_steps=60)
    assert any("did not train on the GPU" in p for p in problems) and any("expected" in p for p in problems)
    saved = [{"event": "state_saved", "rank": 0, "source": "blocked", "step": 59, "bytes": 2**21, "seconds": 0.4}]
    assert decide.judge_jit(saved, rc=0, resumed_step=59).result == "pass"
    assert "resumed at step 40" in decide.judge_jit(saved, rc=0, resumed_step=40).reason
    declined = decide.judge_jit([{"event": "state_not_saved", "reason": "no rank answered within 12.0 s"}],
                                rc=0, resumed_step=None)
    assert declined.result == "fail" and declined.reason == "no state saved: no rank answered within 12.0 s"
