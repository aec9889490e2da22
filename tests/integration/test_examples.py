"""Every example runs exactly as its docstring says: the command is read from the docstring and
run with bash in a scratch directory (where ``examples`` links to the repository's), under the
real ft_launcher with 2 ranks. Their default sizes are small, so each run takes seconds."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.launcher_util import events_of, launcher_env, read_events

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
RUN_TIMEOUT_S = 110.0

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Expected:
    """What a run of the documented command leaves behind."""

    state_file: str
    simulated_hang: bool
    flag_file: Optional[str] = None
    state_key: str = "section_timeouts"


CASES = {
    "train_ddp_heartbeats.py": Expected("runs/ddp_heartbeats/ft_state.json", True, state_key="hb_timeouts"),
    "train_ddp_sections.py": Expected("runs/ddp_sections/ft_state.json", True),
    "train_loop_integration.py": Expected("runs/loop_integration/checkpoints/_ft_state.json", True),
    "lightning_heartbeats.py": Expected("runs/lightning_heartbeats/ft_state/_ft_state.json", True,
                                        "runs/lightning_heartbeats/finished.flag", state_key="hb_timeouts"),
    "lightning_sections.py": Expected("runs/lightning_sections/ft_state/_ft_state.json", False,
                                      "runs/lightning_sections/finished.flag"),
}


def documented_command(script: Path) -> str:
    """The indented block after the first line ending in ``::`` of the module docstring."""
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8")))
    assert doc, f"{script.name} has no docstring"
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip().endswith("::")), None)
    assert start is not None, f"{script.name}: no 'Run ...::' block in the docstring"
    block: list[str] = []
    for line in lines[start + 1:]:
        if not line.strip():
            if block:
                break
            continue
        if not line.startswith("    "):
            break
        block.append(line.strip())
    assert block, f"{script.name}: the '::' block is empty"
    return "\n".join(block)


def run_documented(script: Path, workdir: Path) -> subprocess.CompletedProcess:
    (workdir / "examples").symlink_to(EXAMPLES)
    env = launcher_env({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FT_LAUNCHER_EVENT_LOG": str(workdir / "events.jsonl"),  # read by ft_launcher; not in the command
    })
    env.pop("FAULT_TOL_FINISHED_FLAG_FILE", None)
    proc = subprocess.Popen(["bash", "-c", documented_command(script)], cwd=workdir, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{script.name} did not finish in {RUN_TIMEOUT_S} s:\n{out[-5000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_every_example_is_covered():
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == set(CASES)
    for name in CASES:
        command = documented_command(EXAMPLES / name)
        assert f"examples/{name}" in command and "ft_launcher" in command and "--nproc-per-node 2" in command


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs_as_documented(tmp_path, name):
    expected = CASES[name]
    result = run_documented(EXAMPLES / name, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:]
    events = read_events(tmp_path / "events.jsonl")
    assert events_of(events, "result")[-1]["outcome"] == "succeeded"
    hangs = [f for f in events_of(events, "failure") if f["cause_kind"] == "hang"]
    if expected.simulated_hang:
        assert "simulated fault rank_hung: sending SIGSTOP" in result.stdout
        assert hangs and {f["cycle"] for f in hangs} == {0}, result.stdout[-6000:]
        assert [c["cycle"] for c in events_of(events, "cycle_start")] == [0, 1]
        assert "resum" in result.stdout  # the restarted ranks continued from the checkpoint
    state = json.loads((tmp_path / expected.state_file).read_text())
    if expected.state_key == "hb_timeouts":
        assert state["hb_timeouts"]["were_calculated"] is True
    else:
        assert {"checkpointing", "step"} <= set(state["section_timeouts"]["calculated_sections"])
    if expected.flag_file is not None:
        assert json.loads((tmp_path / expected.flag_file).read_text())["completed"] is True
