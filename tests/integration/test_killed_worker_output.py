"""One killed worker, a real 2-rank Lightning DDP job under ft_launcher: what our code prints (issue 29 item 7).

Rank 1 SIGKILLs itself in step 10 with ``--max-restarts 0``. The survivor fails its next gloo
collective and is SIGTERMed by the launcher while it ends: our front end's tear-down stays quiet
(no WARNING/ERROR line of ours, no traceback through ft_core), the collateral line never names
traceback machinery or our own frames as where it waited, and the summary claims no restart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.launcher_util import events_of, read_events, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LIGHTNING_WORKER = Path(__file__).resolve().parents[1] / "workers" / "lightning_train.py"
OUR_NOISE = re.compile(r"(ft_core|ptl_resiliency)\S* (WARNING|ERROR): .*fault tolerance")


def test_one_killed_worker_gets_a_quiet_tear_down_and_an_honest_summary(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    cfg = {"callback": "heartbeats", "ddp": True, "root": str(tmp_path / "train"), "max_steps": 40, "ckpt_every": 0,
           "step_sleep": 0.05, "signal_self": {"rank": 1, "step": 10, "signal": "SIGKILL"}}
    out = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.1",
                        "--ft-event-log", str(events), str(LIGHTNING_WORKER), json.dumps(cfg)], timeout=240)
    assert out.returncode == 1, out.stderr[-4000:]
    lines = out.stderr.splitlines()
    # (b) nothing restarted: no time to restarted workers
    [summary] = [line for line in lines if line.startswith("[ft_launcher] summary:")]
    assert "restarted workers" not in summary, summary
    assert summary.endswith("result: failed (exit code 1)"), summary
    # (a) the survivor's tear-down: no warning or error of ours, no traceback through our session
    assert not [line for line in lines if OUR_NOISE.search(line)], "\n".join(lines)
    assert "releasing the" not in out.stderr and "ft_core/client/session.py" not in out.stderr
    # (c) the collateral rank: never blocked in traceback machinery or in a frame of ours
    records = read_events(events)
    [collateral] = [e for e in events_of(records, "failure") if e["role"] == "collateral"]
    explanation = collateral["explanation"]
    assert explanation.startswith("stopped waiting for rank 1"), explanation
    for wrong in ("traceback.py", "linecache.py", "ast.py", "ptl_resiliency/", "ft_core/", "zygote.py"):
        assert wrong not in explanation, explanation
