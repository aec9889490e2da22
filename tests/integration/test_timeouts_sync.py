"""Calculated timeouts are synchronised across ranks through torch.distributed (gloo)."""

import json
from pathlib import Path

from tests.launcher_util import run_launcher

WORKER = str(Path(__file__).resolve().parent.parent / "workers" / "timeouts_sync.py")


def test_ranks_agree_on_timeouts_from_the_slowest_rank(tmp_path):
    # Minimums of 1 s (the defaults are 60-600 s) so that the calculated values show.
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--ft-param-safety_factor", "10",
                           "--ft-param-min_calculated_heartbeat_timeout", "1",
                           "--ft-param-min_calculated_section_timeout", "1",
                           "--ft-param-rank_section_timeouts", "step:60,only0:60,idle:60", WORKER, str(tmp_path)])
    assert result.returncode == 0, result.stderr
    states = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # "idle" was observed on no rank: not calculated anywhere (skipped, not an error)
    assert states[0]["ok"] == states[1]["ok"] == [True, True, False]
    assert states[0]["state"] == states[1]["state"]  # identical on all ranks
    hb = states[0]["state"]["hb_timeouts"]
    # rank 1 waited 0.3 s between heartbeats: >= 10 x 0.3 s, not rank 0's 10 x 0.05 s (the 1 s minimum)
    assert 3.0 <= hb["subsequent"] < 10.0 and hb["were_calculated"]
    sections = states[0]["state"]["section_timeouts"]
    assert 3.0 <= sections["section"]["step"] < 10.0
    # only rank 0 opened "only0" (0.2 s): rank 1 has rank 0's value
    assert 2.0 <= sections["section"]["only0"] < 10.0
    assert sections["section"]["idle"] == 60.0
    assert sections["calculated_sections"] == ["only0", "step"]
