"""bench/goodput_realistic.py end to end in its quick mode: a real ft_launcher under autoresume.sh, a
2-rank DDP loop that checkpoints, a planned hang and a planned crash, just-in-time state on.

The figures are not checked (a loaded 2-core machine); what is: the run finished, each fault was
recovered from the survivors' state (0 steps lost), and the cost parts are there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "goodput_realistic.py"


@pytest.mark.slow
@pytest.mark.timeout(360)  # two ranks started three times, one DDP each; 100 s measured on a loaded machine
def test_quick_mode_recovers_faults_from_the_survivors_state(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--tools", "ours_jit", "--faults", "2", "--seed", "3", "--json",
         "--run-timeout", "240"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    figures = result["figures"]["ours_jit"]
    assert figures["finished"] == 1 and figures["faults_recovered"] == figures["faults_injected"] == 2, result
    (run,) = result["runs"]["ours_jit"]
    assert [c["source"] for c in run["fault_costs"]] == ["jit", "jit"], run["fault_costs"]
    assert figures["steps_lost_max"] == 0 and figures["unplanned_restarts"] == 0
    assert figures["processes_left_behind"] == 0
    for part in ("detection", "save", "restart", "redone"):
        assert figures[f"{part}_median_s"] is not None, part
    assert [s["source"] for s in run["jit_saves"]] and "NVRx not measured" in result["nvrx"]
