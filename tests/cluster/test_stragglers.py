"""A fail-slow node on the real cluster (``make test-cluster``): flagged, taken out, replaced by a spare.

4 nodes for a 3-node job (``--nnodes 3``): node1-node3 train, node4's launcher starts once training
runs and waits as the spare. ``train.py`` gives each forward real CPU work and runs straggler
detection with ``action="replace"``. The test caps node3's CPU (``fault.sh cpuslow``), and checks
that node3 is flagged, leaves at the next checkpoint (exit 65, as for ExcludeThisNode), node4 takes
its place, and training resumes from that checkpoint and finishes. It prints the step rates before
the cap, while capped and after the replacement, and the times from the cap to the first flag, to
node3's exit and to training again (docs/stragglers.md has the figures).

All nodes share this machine's cores: the cap makes node3 slower than the others only while it
binds, i.e. while the machine's other work leaves each process more CPU than the cap.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import pytest

from launcher.exit_codes import EXIT_NODE_EXCLUDED
from tests.cluster.conftest import ClusterRun, cycle_starts, wait_for

COMPUTE_ITERS = 300  # matmuls per forward: ~30 ms of one core on an idle machine
STEP_SLEEP_S = 0.05  # the rest of a step: the 3 workers leave the 2 cores room for the launchers
# node3's cap, in % of one core (a 100 ms period): below the ~30 ms of CPU a forward needs, so
# every forward of node3 waits for its quota. It must bind when the machine is busy too: with the
# load at 5-7 every process gets ~30 % of a core anyway, and a 20 % cap made node3's forward only
# 1.05-1.25x slower there (flagged after 90 s in one run); 10 % made it 4-6x slower.
CPU_CAP_PCT = 15
REPORT_S = 6.0  # a report needs 5 measured steps (train.py's min_samples): room for slow steps
REPLACE_AFTER = 2
SAVE_EVERY = 20  # each checkpoint leaves the next step out of the scores
STEPS = 400
MIN_STRETCH_STEPS = 5  # the shortest stretch a rate is taken over
CAP_AT_STEP = 100  # after a few reports (the scores settle)
# From the cap to the spare's workers training (41-43 s measured, load 4-11): 2 flagged reports
# plus the one the cap fell in, the next checkpoint, the restart. A bound that catches a wait for
# a default (torch's 30 s last call or 60 s store timeouts), not small regressions.
REPLACE_BOUND_S = 90.0
# From node3's ExcludeThisNode to its launcher's exit (0.5-1.4 s measured): it kills its workers
# at once; a SIGTERM would wait for --term-timeout (30 s).
LEAVE_BOUND_S = 10.0


@dataclass
class Figures:
    """What the run measured, in seconds from the cap and steps per second."""

    before: float
    capped: float
    after: float
    flagged: float
    requested: float
    exited: float
    training: float

    def line(self) -> str:
        return (f"steps/s before the cap {self.before:.2f}, capped {self.capped:.2f}, after the replacement "
                f"{self.after:.2f} ({self.after / self.before:.0%} of before); from the cap: first flag "
                f"{self.flagged:.1f} s, ExcludeThisNode {self.requested:.1f} s, node3's launcher exited "
                f"{self.exited:.1f} s, training again on node1, node2, node4 {self.training:.1f} s "
                f"({self.training - self.requested:.1f} s after the request)")


def _rate(progress: list[dict[str, Any]], start: float, end: float) -> float:
    """Median steps per second between rank 0's checkpoints and reports from ``start`` to ``end``:
    a median, because the machine's other work makes single stretches slow."""
    window = [e for e in progress if start <= e["t"] <= end]
    rates, anchor = [], window[0] if window else None
    for point in window[1:]:
        if point["step"] - anchor["step"] >= MIN_STRETCH_STEPS:  # a report just after a checkpoint: too short
            rates.append((point["step"] - anchor["step"]) / (point["t"] - anchor["t"]))
            anchor = point
    # one stretch happens: a quick flag leaves only a report, a checkpoint and the next report capped
    assert rates, f"no stretch of {MIN_STRETCH_STEPS}+ steps between {start} and {end}: {window}"
    return statistics.median(rates)


def figures(timeline: list[dict[str, Any]], node3: list[dict[str, Any]], cap: float, back: float) -> Figures:
    """The rates and times of one run (``back``: the spare's first collective)."""
    progress = [e for e in timeline if e["event"] in ("saved", "straggler_report")]  # rank 0's: step, time
    first_ready = min(e["t"] for e in timeline if e["event"] == "pg_ready")
    flagged = min(e["ts"] for e in node3 if e["event"] == "straggler")
    requested = next(e["ts"] for e in node3 if e["event"] == "control_request")
    exited = next(e["ts"] for e in node3 if e["event"] == "result")
    done = max(e["t"] for e in timeline if e["event"] == "done")
    return Figures(before=_rate(progress, first_ready + 3.0, cap), capped=_rate(progress, cap + 1.0, requested),
                   after=_rate(progress, back + 1.0, done), flagged=flagged - cap, requested=requested - cap,
                   exited=exited - cap, training=back - cap)


@pytest.mark.timeout(420)
def test_cpu_capped_node3_is_flagged_and_replaced_by_the_spare(cluster: ClusterRun):
    cluster.env["FTJ_SPARE_NODE"] = "node4"  # node4's launcher joins once training runs: the spare
    # a 20 s heartbeat timeout: hangs are not this test's business, and with the machine's load at
    # 10+ (other work) a 3 s one fired on node3 before the cap (one run)
    job = cluster.submit(nodes=4, nnodes="3", launcher_args="--max-restarts 2 --ft-param-rank-heartbeat-timeout 20",
                         train_args=f"--steps {STEPS} --step-time {STEP_SLEEP_S} --save-every {SAVE_EVERY} "
                                    f"--compute-iters {COMPUTE_ITERS} --straggler-interval {REPORT_S} "
                                    f"--straggler-replace-after {REPLACE_AFTER}")
    wait_for(lambda: any(e["event"] == "saved" and e["step"] >= CAP_AT_STEP for e in cluster.timeline()),
             240, f"training to reach step {CAP_AT_STEP}")
    members = {e["node"] for e in cluster.timeline() if e["event"] == "pg_ready"}
    assert members == {"node1", "node2", "node3"}, members
    try:
        cap = cluster.fault("cpuslow", "node3", str(CPU_CAP_PCT))
        wait_for(lambda: any(e["event"] == "result" for e in cluster.events("node3")), REPLACE_BOUND_S,
                 "node3's launcher to leave")
    finally:
        cluster.fault("cpufast", "node3")
    state = cluster.wait_job(job, 240)
    assert state["JobState"] in ("COMPLETED", "FAILED"), state  # FAILED: srun reports node3's 65
    timeline = cluster.timeline()
    node3 = cluster.events("node3")
    assert [e["exit_code"] for e in node3 if e["event"] == "result"] == [EXIT_NODE_EXCLUDED], node3
    # flagged (the launcher's straggler events): node3, none before the cap, "replace" from the
    # REPLACE_AFTER-th report in a row on; no other node that often (a single flag of another node
    # happens when the machine's other work stalls a rank for most of a report)
    flags = [e for e in node3 if e["event"] == "straggler"]
    assert any(e["scope"] == "node" and e["action"] == "replace" and e["consecutive"] >= REPLACE_AFTER
               for e in flags), flags
    assert min(e["ts"] for e in flags) > cap, (cap, flags)
    for node in ("node1", "node2", "node4"):
        assert not [e for e in cluster.events(node) if e["event"] == "straggler" and e["action"] == "replace"], node
    assert [e["action"] for e in node3 if e["event"] == "control_request"] == ["ExcludeThisNode"], node3
    # node1 and node2 restarted once, with node4 in node3's place, from the checkpoint node3 left
    # at. What restarts them comes first: their collectives failing (node3's ranks were killed), or
    # node4 moving up from the spares once node3's keep-alive expired (a "restart" record).
    restarted = min(e["ts"] for n in ("node1", "node2") for e in cluster.events(n)
                    if e["event"] in ("failure", "restart") and e["cycle"] == 0)
    left_at = max(e["step"] for e in timeline if e["event"] == "saved" and e["t"] < restarted)
    resumed = [e for e in timeline if e["event"] == "pg_ready" and e["t"] > restarted]
    assert {(e["node"], e["step"], e["world_size"]) for e in resumed} == {
        ("node1", left_at, 3), ("node2", left_at, 3), ("node4", left_at, 3)}, resumed
    # node3 published its ranks as "left" before killing them: node1 and node2 name node3's rank,
    # not their own ranks whose collectives failed
    for node in ("node1", "node2"):
        failures = [e for e in cluster.events(node) if e["event"] == "failure" and e["cycle"] == 0]
        assert failures and {(e["role"], e.get("root_outcome"), e.get("root_node")) for e in failures} == {
            ("collateral", "left", "node3")}, (node, failures)
    assert {e["node"] for e in timeline if e["event"] == "done"} == {"node1", "node2", "node4"}, timeline
    for node in ("node1", "node2", "node4"):
        events = cluster.events(node)
        assert [e["exit_code"] for e in events if e["event"] == "result"] == [0], (node, events)
        assert len(cycle_starts(events)) == (1 if node == "node4" else 2), (node, events)

    measured = figures(timeline, node3, cap, max(e["t"] for e in resumed))
    # node4 waited as a spare far longer than 10 s: it started its warm template meanwhile, and its
    # workers were forked from it (cold, each imported torch: 5-13 s of the replacement)
    (spare_start,) = cycle_starts(cluster.events("node4"))
    spare_ready = next(e["t"] for e in resumed if e["node"] == "node4")
    print(f"\nnode3 capped at {CPU_CAP_PCT} % of a core (reports every {REPORT_S} s, replace after "
          f"{REPLACE_AFTER}): {measured.line()}; node4's workers started "
          f"{'warm' if spare_start['warm_start'] else 'cold'}, their process group ready "
          f"{spare_ready - spare_start['ts']:.1f} s after its cycle started")
    assert spare_start["warm_start"], spare_start
    assert measured.capped < 0.85 * measured.before, measured  # the cap slowed the job: a real straggler
    assert measured.exited - measured.requested < LEAVE_BOUND_S, measured
    assert measured.training < REPLACE_BOUND_S, measured
    # The goal is within 10 % of the rate before the cap (89 % with the machine's load at 4-5, 69 %
    # at 6-11: the other work on this machine's 2 cores moves the rate, the scores show no straggler
    # left); what the test holds: without node3 the job is clearly faster than with it capped.
    assert measured.after > 1.25 * measured.capped, measured
    cluster.assert_no_leftovers()
