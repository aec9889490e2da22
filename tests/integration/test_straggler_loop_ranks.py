"""The plain-loop straggler API (ft_core.integration.straggler_detection) with real processes: 2 DDP
ranks (gloo, CPU) under ft_launcher, tests/workers/straggler_loop_eval.py.

* Only rank 0 evaluates between its training steps (under ``torch.no_grad()`` and in eval mode):
  the evaluation forwards are no steps, so both ranks reach every report at the same training step
  and the job finishes (before: rank 0's report came early, its ``all_gather`` met rank 1's
  gradient all-reduce and the job hung after the first report).
* Rank 1's forward is 30 ms slower: rank 1 is flagged, never rank 0, which waits for rank 1 in
  every all-reduce (before: the launcher logged "straggler: rank 0 ... is slow (relative score
  50.47, individual score 0.66)").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.launcher_util import events_of, read_events, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "straggler_loop_eval.py")
NULL_HEARTBEATS = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null"]


def _run(tmp_path: Path, cfg: dict, timeout: float) -> tuple[str, list[dict], list[dict]]:
    """Run the worker on 2 ranks; returns (stderr, the report lines of every rank, the event log)."""
    events = tmp_path / "events.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--ft-event-log",
                           str(events), *NULL_HEARTBEATS, WORKER, json.dumps(cfg)], timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.stderr, reports, read_events(events) if events.exists() else []


def test_evaluation_forwards_on_rank_0_alone_neither_count_as_steps_nor_hang_the_job(tmp_path: Path) -> None:
    # 120 training steps take a few seconds; the launcher and 2 ranks start in 10-30 s on a loaded
    # machine. A hang is cut at 90 s (run_launcher kills the job and fails the test).
    cfg = {"steps": 120, "eval_rank": 0, "report_time_interval": 0.3, "individual_threshold": None}
    _, reports, _ = _run(tmp_path, cfg, timeout=90)
    by_rank = {rank: [(r["report"], r["steps"]) for r in reports if r["rank"] == rank] for rank in (0, 1)}
    # several reports, at the same training steps on both ranks (the first one after 10 steps)
    assert len(by_rank[0]) >= 2, reports
    assert by_rank[0] == by_rank[1], by_rank
    assert by_rank[0][0] == (1, 10), by_rank


def test_a_rank_with_a_slow_forward_is_flagged_and_the_fast_rank_that_waits_for_it_never(tmp_path: Path) -> None:
    # Rank 1's forward sleeps 30 ms; rank 0's takes well under 1 ms, and from step 45 on 3 ms more:
    # its individual score falls far below the threshold (its own speed changed, as when the load
    # on its CPUs changes), but it stays ~5x faster than the median rank, so the job never waits
    # for it. Reports at steps 10 (too few samples to score), 40, 70 and 100 (the interval's
    # floor: min_samples 8 of one step in 3, and a margin).
    cfg = {"steps": 100, "fwd_ms": {"1": 30}, "more_fwd_ms": {"0": [45, 3]}, "report_time_interval": 0.6}
    stderr, reports, events = _run(tmp_path, cfg, timeout=120)
    mine = [r for r in reports if r["rank"] == 0]
    scored = [r for r in mine if len(r["compute_ms"]) == 2 and all(v == v for v in r["compute_ms"].values())]
    assert len(scored) >= 2, reports
    for report in scored:
        # rank 0's measured compute leaves out its wait for rank 1 in the gradient all-reduce
        assert report["compute_ms"]["0"] < 15 and report["compute_ms"]["1"] >= 30, report
        assert report["relative"] == [1], report
        assert 0 not in report["individual"], report
    assert not re.search(r"straggler: rank 0 on node", stderr), stderr[-4000:]
    assert re.search(r"straggler: rank 1 on node \S+ is slow", stderr), stderr[-4000:]
    assert {e["rank"] for e in events_of(events, "straggler")} == {1}, events_of(events, "straggler")
