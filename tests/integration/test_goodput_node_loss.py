"""bench/goodput_node_loss.py end to end in its quick mode: three real ft_launchers on 127.0.0.1 (two
nodes of one rank and a spare), node b's launcher and worker SIGKILLed together at a planned step,
the spare healed from node a's just-in-time state through the rendezvous store.

The figures are not checked (a loaded 2-core machine); what is: the run finished, the loss was
recovered from the survivor's state with 0 steps lost, the spare received it (the heal part is
there), and nothing was left running.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "goodput_node_loss.py"


@pytest.mark.slow
@pytest.mark.timeout(300)  # three launchers, two cycles, one DDP each; 45 s measured at a load average of 8
def test_quick_mode_heals_the_spare_and_loses_no_step(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--tools", "ours_jit", "--json", "--run-timeout", "220"],
        capture_output=True, text=True, timeout=280, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    figures = result["figures"]["ours_jit"]
    (run,) = result["runs"]["ours_jit"]
    assert run["exit_codes"] == {"a": 0, "b": -9, "spare": 0}, run
    assert figures["finished"] == 1 and figures["losses_recovered"] == figures["losses_injected"] == 1, result
    (cost,) = run["fault_costs"]
    assert cost["source"] == "jit" and cost["steps_lost"] == 0, cost
    assert cost["heal_s"] is not None and cost["heal_bytes"] > 0 and cost["heal_failed"] is None, cost
    for part in ("detection", "save", "restart", "redone"):
        assert cost[f"{part}_s"] is not None, part
    assert run["processes_left_behind"] == 0, run["left_behind"]
    assert "| - heal (spare receives it from node a) |" in result["table"]
