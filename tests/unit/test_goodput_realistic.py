"""bench/goodput_realistic.py's pure parts: the fault plan, each fault's cost, the table.

The whole bench (real launchers, both tools' restarts) runs in its quick mode in
tests/integration/test_goodput_realistic.py.
"""

from __future__ import annotations

import pytest

from bench import goodput_realistic as bench


def test_faults_are_seeded_spread_over_the_run_and_alternate_hangs_and_kills():
    plan = bench.plan_faults(seed=0, count=4, max_steps=1200, checkpoint_every=500)
    assert plan == bench.plan_faults(seed=0, count=4, max_steps=1200, checkpoint_every=500)
    assert plan != bench.plan_faults(seed=1, count=4, max_steps=1200, checkpoint_every=500)
    assert [f["kind"] for f in plan] == ["hang", "kill", "hang", "kill"]
    steps = [f["step"] for f in plan]
    assert steps == sorted(steps) and len(set(steps)) == 4
    assert 50 <= steps[0] and steps[-1] < 1180  # not in the restart's first steps, nor the last 20
    assert bench.plan_faults(seed=0, count=0, max_steps=1200, checkpoint_every=500) == []


def test_a_faults_cost_is_split_into_detection_save_restart_and_redone_work():
    progress = [line.split() for line in [
        "start 1 100.0", "resume 1 0 scratch 110.0", "step 1 500 160.0", "ckpt 1 500 0.8 161.0", "step 1 620 175.0",
        "start 2 181.0", "resume 2 500 checkpoint 190.0", "step 2 620 202.0",   # from the checkpoint: 120 steps
        "start 3 210.0", "resume 3 700 jit 215.0", "step 3 701 215.1",          # from the survivors' state
    ]]
    faults = [{"fault": 0, "kind": "hang", "step": 620, "time": 175.0},
              {"fault": 1, "kind": "kill", "step": 700, "time": 209.0}]
    events = [{"event": "failure", "role": "root", "detected_at": 180.0},
              {"event": "failure", "role": "collateral", "detected_at": 180.5},
              {"event": "failure", "role": "root", "detected_at": 209.1},
              {"event": "state_saved", "ts": 209.6}]
    hang, kill = bench.fault_costs(progress, faults, events)
    assert (hang["steps_lost"], hang["source"], hang["detection_s"], hang["save_s"]) == (120, "checkpoint", 5.0, 0.0)
    assert (hang["restart_s"], hang["redone_s"], hang["lost_s"]) == (10.0, 12.0, 27.0)
    assert (kill["steps_lost"], kill["source"], kill["detection_s"], kill["save_s"]) == (0, "jit", 0.1, 0.5)
    assert kill["restart_s"] == pytest.approx(5.4) and (kill["redone_s"], kill["lost_s"]) == (0.0, 6.0)
    # NVRx writes no event log: its detection and save are unknown, its restart includes the detection
    (nvrx, _) = bench.fault_costs(progress, faults, [])
    assert (nvrx["detection_s"], nvrx["save_s"], nvrx["restart_s"]) == (None, None, 15.0)


def test_the_table_puts_the_tools_side_by_side():
    run = {"finished_flag": True, "goodput": 0.8, "median_step_s": 0.03, "faults_injected": 1, "processes_rank0": 2,
           "processes_left_behind": 0, "checkpoint_s": {"median": 0.7},
           "fault_costs": [{"steps_lost": 3, "lost_s": 9.0, "detection_s": 1.0, "save_s": 0.0, "restart_s": 5.0,
                            "redone_s": 3.0}]}
    fault_free = dict(run, goodput=1.0, fault_costs=[], faults_injected=0, processes_rank0=1)
    figures = {"ours_nojit": bench.tool_figures([run], [fault_free]), "nvrx": bench.tool_figures([run], [])}
    assert figures["ours_nojit"]["goodput_ratio"] == 0.8 and figures["nvrx"]["goodput_ratio"] is None
    text = bench.table(figures)
    assert "| | ours, no JIT | NVRx 0.4.1 |" in text
    assert "| steps lost per fault (median / max) | 3 / 3 | 3 / 3 |" in text
    assert "| - redone work | 3.0 s | 3.0 s |" in text and "| goodput fault-free | 1.0 | - |" in text
