"""bench/nvrx_local_checkpoint_cpu.py: without NVRx it says where to run it (exit 2, no traceback);
with the reference's venv (``.venv-peer``, ``make bench-peer``) its four attempts each report ok or
the exact error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "nvrx_local_checkpoint_cpu.py"
PEER = REPO / ".venv-peer" / "bin" / "python"


def test_without_nvrx_it_says_which_interpreter_to_use():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "NVRx is not installed" in out.stderr and "Traceback" not in out.stderr
    assert ".venv-peer/bin/python" in out.stderr


@pytest.mark.skipif(not PEER.exists(), reason="the reference's venv is not built (make bench-peer)")
@pytest.mark.timeout(150)
def test_with_nvrx_each_attempt_reports_ok_or_its_error():
    out = subprocess.run([str(PEER), str(SCRIPT), "--json"], capture_output=True, text=True, timeout=140)
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["attempt"]: r for r in json.loads(out.stdout)["results"]}
    assert set(results) == {"basic_state_dict", "save_sync", "save_async", "save_replicated"}
    for result in results.values():
        assert result["ok"] or (result["error"] and result["where"]), result
