"""Calculated timeouts are synchronised across ranks through torch.distributed (gloo)."""

import json
from pathlib import Path

from tests.launcher_util import run_launcher

WORKER = str(Path(__file__).resolve().parent.parent / "workers" / "timeouts_sync.py")


def test_ranks_agree_on_timeouts_from_the_slowest_rank(tmp_path):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--ft-param-safety_factor", "2",
                           "--ft-param-rank_section_timeouts", "step:60", WORKER, str(tmp_path)])
    assert result.returncode == 0, result.stderr
    states = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert states[0]["ok"] == states[1]["ok"] == [True, True]
    assert states[0]["state"] == states[1]["state"]  # identical on all ranks
    hb = states[0]["state"]["hb_timeouts"]
    # rank 1 waited 0.3 s between heartbeats: 2 x 0.3 s, not rank 0's 2 x 0.05 s
    assert 0.6 <= hb["subsequent"] < 1.5 and hb["were_calculated"]
    step = states[0]["state"]["section_timeouts"]["section"]["step"]
    assert 0.6 <= step < 1.5
