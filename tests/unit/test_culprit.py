"""Root or collateral: the pure rule (launcher.decision.culprit), the records and lines built from it, the
summary that counts incidents."""

from __future__ import annotations

import dataclasses
import io

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ft_core.wire.messages import Progress, ProgressReport, RankHang, StacksCaptured
from launcher.decision.culprit import (
    COLLATERAL,
    CRASH,
    HANG,
    LEFT,
    LOST,
    ROOT,
    STOPPED,
    LostNode,
    RankState,
    choose_root,
    collateral_text,
    describe_root,
    peer_wait_level,
    waiting_for,
    waiting_in_collective,
)
from launcher.decision.failures import Evidence, Exchanged, failure_records
from launcher.events.log import EventLog
from launcher.events.records import CycleStart, Result

T = 1_700_000_000.0
ALL_REDUCE = ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252 all_reduce",
              "/job/train.py:69 main")
FROZEN = ("/job/train.py:31 freeze_here", "/job/train.py:72 main")


def state(rank: int, outcome: str, *, at: float | None = None, last: float | None = None, step: int | None = None,
          stopped: bool = False, frames: tuple[str, ...] = (), node: str = "n", group: int = 0) -> RankState:
    progress = {"last_progress_at": last, "step": step, "stopped": stopped, "open_section": None,
                "section_since": None, "heartbeats": 3}
    return RankState(rank=rank, local_rank=rank, node=node, group_rank=group, pid=100 + rank, outcome=outcome,
                     cause="hang: x" if outcome == HANG else "exit code 1", event_at=at, progress=progress,
                     stack_frames=frames)


@pytest.mark.parametrize(("states", "root"), [
    # lockstep: the collateral's last heartbeat may be *earlier*; the stopped process is the root
    pytest.param([state(0, HANG, at=T + 2, last=T - 0.001), state(1, HANG, at=T + 2.01, last=T, stopped=True)],
                 1, id="stopped-process-first"),
    # the rank that is a step behind froze; the other is waiting in the next step
    pytest.param([state(0, HANG, at=T + 2, last=T - 0.001, step=11), state(1, HANG, at=T + 2.01, last=T, step=10)],
                 1, id="lowest-step"),
    # no steps: the one not waiting in a collective
    pytest.param([state(0, HANG, at=T + 2, last=T - 0.001, frames=ALL_REDUCE),
                  state(1, HANG, at=T + 2.01, last=T, frames=FROZEN)], 1, id="not-in-a-collective"),
    # nothing else: the earliest last progress
    pytest.param([state(0, HANG, at=T + 3, last=T + 1), state(1, HANG, at=T + 2.5, last=T)], 1, id="earliest-progress"),
    # a crash before any hang detection is the root, a timeout during the grace is collateral
    pytest.param([state(0, HANG, at=T + 1.2, last=T - 5), state(1, CRASH, at=T)], 1, id="crash-before-hang"),
    # a peer's crash after a hang was detected (the collective failed) is collateral
    pytest.param([state(0, CRASH, at=T + 2.5), state(1, HANG, at=T + 2, last=T)], 1, id="crash-after-hang"),
    # two crashes: the earlier one (the monitor saw its socket close first)
    pytest.param([state(0, CRASH, at=T + 0.004), state(1, CRASH, at=T)], 1, id="earliest-crash"),
    # the hung rank waits in a collective for a rank whose own (longer) timeout had not passed:
    # that rank, outside any collective and idle since before, is the root
    pytest.param([state(0, HANG, at=T + 60, last=T + 0.01, frames=ALL_REDUCE),
                  state(1, STOPPED, last=T, frames=FROZEN)],
                 1, id="still-running-rank-holding-up-the-collective"),
    # ... but not when it made progress after the hung rank (it is merely busy), nor without its
    # stack, nor when it waits in a collective too, nor when the hung rank is not in one
    # lockstep: the running rank left the last collective a few ms after the hung rank's next step began
    pytest.param([state(0, HANG, at=T + 60, last=T, frames=ALL_REDUCE),
                  state(1, STOPPED, last=T + 0.004, frames=FROZEN)],
                 1, id="running-rank-idle-since-the-same-moment"),
    pytest.param([state(0, HANG, at=T + 60, last=T, frames=ALL_REDUCE), state(1, STOPPED, last=T + 4.5, frames=FROZEN)],
                 0, id="running-rank-progressed-later"),
    pytest.param([state(0, HANG, at=T + 60, last=T + 0.01, frames=ALL_REDUCE), state(1, STOPPED, last=T)],
                 0, id="running-rank-without-a-stack"),
    pytest.param([state(0, HANG, at=T + 60, last=T + 0.01, frames=ALL_REDUCE),
                  state(1, STOPPED, last=T, frames=ALL_REDUCE)], 0, id="running-rank-in-a-collective-too"),
    pytest.param([state(0, HANG, at=T + 60, last=T + 0.01, frames=FROZEN), state(1, STOPPED, last=T, frames=FROZEN)],
                 0, id="hung-rank-not-in-a-collective"),
    # ranks stopped by the launcher are never the root
    pytest.param([state(0, STOPPED), state(1, CRASH, at=T)], 1, id="stopped-by-us"),
    pytest.param([state(0, STOPPED), state(1, STOPPED)], None, id="no-root"),
    # rule 0: a rank whose node left on request, before the crashes its leaving caused (the nodes'
    # clocks may disagree by up to a second), and not when a crash came clearly first
    pytest.param([state(0, CRASH, at=T + 0.05), state(1, LEFT, at=T, node="b", group=1)], 1, id="left-then-crash"),
    pytest.param([state(0, CRASH, at=T - 0.5), state(1, LEFT, at=T, node="b", group=1)], 1, id="left-clock-skew"),
    pytest.param([state(0, HANG, at=T + 3, last=T - 1), state(1, LEFT, at=T, node="b", group=1)], 1,
                 id="left-then-hang"),
    pytest.param([state(0, CRASH, at=T - 5), state(1, LEFT, at=T, node="b", group=1)], 0, id="crash-long-before-left"),
    # a rank that progressed after the node left was not blocked by it: a later failure of its own
    pytest.param([state(0, CRASH, at=T + 60, last=T + 50), state(1, LEFT, at=T, node="b", group=1)], 0,
                 id="crash-after-progress-since-left"),
    pytest.param([state(0, CRASH, at=T + 0.05, last=T - 0.2), state(1, LEFT, at=T, node="b", group=1)], 1,
                 id="left-while-the-crashed-rank-waited"),
    # min-healthy: b left, rank 0 trained on; c's later leaving is what stopped it
    pytest.param([state(0, STOPPED, last=T + 50), state(1, LEFT, at=T, node="b", group=1),
                  state(2, LEFT, at=T + 60, node="c", group=2)], 2, id="the-later-leaving-that-held-it-up"),
])
def test_the_root_is_the_rank_that_stopped_first(states, root):
    found = choose_root(states)
    assert (found.rank if found else None) == root


def test_steps_count_only_when_every_hung_rank_has_one():
    # rank 0 has no step: steps are not compared, the stack decides
    states = [state(0, HANG, at=T + 2, last=T, frames=FROZEN), state(1, HANG, at=T + 2, last=T, step=1,
                                                                    frames=ALL_REDUCE)]
    assert choose_root(states).rank == 0


def test_waiting_in_collective_needs_a_torch_distributed_frame():
    assert waiting_in_collective(ALL_REDUCE)
    assert not waiting_in_collective(("/job/train.py:10 all_reduce",))  # the user's own function
    assert not waiting_in_collective(FROZEN)


def test_texts():
    root = RankState(rank=1, local_rank=1, node="n", group_rank=0, pid=5, outcome=HANG, cause="hang: x",
                     event_at=T + 3, progress={"step": 61, "last_progress_at": T, "section_since": T,
                                               "open_section": None, "stopped": False})
    assert describe_root(root, "/job/train.py:31 f") == (
        "rank 1 froze in step 61 (outside any section for 3.0 s) at /job/train.py:31 f")
    assert isinstance(root.progress, Progress)  # a mapping given is read as the typed progress
    in_section = dataclasses.replace(root, progress=dataclasses.replace(root.progress, open_section="step"))
    assert describe_root(in_section) == "rank 1 froze in step 61 (in section 'step' for 3.0 s)"
    crash = RankState(rank=2, local_rank=0, node="n", group_rank=0, pid=5, outcome=CRASH, cause="signal SIGSEGV",
                      event_at=T)
    assert describe_root(crash) == "rank 2 was killed by SIGSEGV"
    assert collateral_text([state(0, STOPPED), state(10, HANG), state(2, HANG)]) == (
        "ranks 0, 2, 10 stopped waiting for it")
    assert collateral_text([state(0, STOPPED)]) == "rank 0 stopped waiting for it"
    assert collateral_text([]) == ""


def test_a_published_state_round_trips_and_garbage_is_ignored():
    original = state(3, HANG, at=T, last=T - 1, step=7, frames=FROZEN, node="b", group=1)
    assert RankState.from_json(original.to_json()) == original
    for bad in ({}, {"local_rank": "x", "node": "b", "outcome": "hang"}, {"local_rank": 1}, None, []):
        assert RankState.from_json(bad) is None


def failure(local_rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode, error_file="<N/A>")


def hang_report(at: float, step: int, stopped: bool, frames: tuple[str, ...], last: float | None = None) -> RankHang:
    # as the launcher's link decodes it from the monitor's message
    return RankHang.from_wire({
        "type": "rank_hang", "pid": 1000, "cause": "hang: no heartbeat for 2.00 s > timeout 2.00 s",
        "kind": "heartbeat", "section": None, "elapsed": 2.0, "timeout": 2.0, "signal": "SIGKILL", "detected_at": at,
        "progress": {"last_progress_at": at - 2 if last is None else last, "step": step, "stopped": stopped,
                     "open_section": None, "section_since": None, "heartbeats": 9},
        "stack_file": f"/logs/ft_stacks/r{step}.txt", "stack_frames": list(frames), "stack_error": None})


def test_records_name_the_root_first_and_the_remote_root_on_collateral():
    # rank 0 (here) and rank 1 both hung; rank 1 was stopped: root; rank 0 collateral
    records = failure_records(
        {0: failure(0, -9), 1: failure(1, -9)}, local_ranks={0: 0, 1: 1},
        hangs={0: hang_report(T + 2, 11, False, ALL_REDUCE), 1: hang_report(T + 2.01, 10, True, FROZEN)},
        stopped_by_us=set(), cycle=0, now=T + 3, evidence=Evidence(node="n", group_rank=0))
    assert [(r.rank, r.role) for r in records] == [(1, ROOT), (0, COLLATERAL)]
    assert records[0].explanation.startswith("rank 1 froze (its process was stopped) in step 10")
    assert records[0].explanation.endswith("at /job/train.py:31 freeze_here; rank 0 stopped waiting for it")
    assert records[1].explanation == (f"stopped waiting for rank 1, blocked at {ALL_REDUCE[0]} (called from "
                                      f"{ALL_REDUCE[1]})")
    assert records[1].root.rank == 1 and records[0].stacks.stack_file == "/logs/ft_stacks/r10.txt"


def test_a_rank_still_running_outside_any_collective_is_the_root_its_hung_peer_waited_for():
    # rank 0's step timeout fired while it waited in the all-reduce; rank 1 sat between steps (its
    # out-of-section timeout is longer) and was stopped by the launcher
    evidence = Evidence(node="n", group_rank=0,
                        reports={1: ProgressReport.from_wire({
                            "type": "progress_report", "progress": {
                                "last_progress_at": T - 60, "step": 1810, "stopped": False, "open_section": None,
                                "section_since": T - 60, "heartbeats": 0}})},
                        stacks={1: StacksCaptured.from_wire({"stack_frames": list(FROZEN), "stack_file": None,
                                                             "stack_error": None})})
    hang = hang_report(T, 1810, False, ALL_REDUCE, last=T - 59.99)
    records = failure_records({0: failure(0, -9), 1: failure(1, -9)}, local_ranks={0: 0, 1: 1}, hangs={0: hang},
                              stopped_by_us={1001}, cycle=1, now=T + 1, evidence=evidence)
    assert [(r.rank, r.role, r.kind) for r in records] == [(1, ROOT, "hang"), (0, COLLATERAL, "hang")]
    assert records[0].explanation == ("rank 1 froze in step 1810 (no progress for 60.0 s, outside any section; its own "
                                      "timeout had not passed yet) at /job/train.py:31 freeze_here; rank 0 stopped "
                                      "waiting for it")
    assert records[0].cause.startswith("hang: ") and records[0].detected_at == T
    assert records[1].explanation.startswith("stopped waiting for rank 1, blocked at ")
    text = summary_of([(1, records)])
    assert "1 incident: 1 × hang (found through another rank's timeout); 1 rank stopped as collateral" in text


def test_a_root_on_another_node_makes_every_local_rank_collateral():
    remote = state(5, HANG, at=T + 1, last=T - 1, stopped=True, node="b", group=1)
    exchanged = []

    def exchange(states):
        exchanged.extend(states)
        return Exchanged([remote])

    records = failure_records({0: failure(0, 1)}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=2,
                              now=T + 2, evidence=Evidence(node="a", group_rank=0, exits_seen_at={0: T + 1.5}),
                              exchange=exchange)
    assert [s.rank for s in exchanged] == [0] and exchanged[0].event_at == T + 1.5
    record, = records
    assert record.role == COLLATERAL and record.root.node == "b"
    assert record.explanation == "stopped waiting for rank 5 on node b (node rank 1)"


def test_the_monitors_disconnect_time_dates_a_crash():
    evidence = Evidence(node="n", group_rank=0, exits_seen_at={0: T + 1, 1: T + 1},
                        reports={0: ProgressReport(disconnected_at=T + 0.9),
                                 1: ProgressReport(disconnected_at=T + 0.5)})
    records = failure_records({0: failure(0, 1), 1: failure(1, 1)}, local_ranks={0: 0, 1: 1}, hangs={},
                              stopped_by_us=set(), cycle=0, now=T + 2, evidence=evidence)
    assert [(r.rank, r.role, r.detected_at) for r in records] == [(1, ROOT, T + 0.5), (0, COLLATERAL, T + 0.9)]


def summary_of(records_by_cycle) -> str:
    log = EventLog(None, node="n", stream=io.StringIO())
    for cycle, records in records_by_cycle:
        log.record_event(CycleStart(cycle=cycle, since_failure_s=0.5 if cycle else None))
        for record in records:
            log.failure(record, "restarting")
    log.record_event(Result(outcome="succeeded", exit_code=0))
    return log.summary()


def test_a_clean_run_prints_no_failure_statistics():
    text = summary_of([(0, [])])
    assert text == "[ft_launcher] summary: 1 cycle; result: succeeded (exit code 0)"


def test_the_summary_counts_incidents_not_lines():
    freeze = failure_records(
        {0: failure(0, -9), 1: failure(1, -9)}, local_ranks={0: 0, 1: 1},
        hangs={0: hang_report(T + 2, 11, False, ALL_REDUCE), 1: hang_report(T + 2.01, 10, True, FROZEN)},
        stopped_by_us=set(), cycle=0, now=T + 3, evidence=Evidence(node="n", group_rank=0))
    crash = failure_records({0: failure(0, -15), 1: failure(1, 1)}, local_ranks={0: 0, 1: 1}, hangs={},
                            stopped_by_us={1000}, cycle=1, now=T + 9, evidence=Evidence(node="n", group_rank=0))
    crash2 = failure_records({0: failure(0, 1)}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=2,
                             now=T + 19, evidence=Evidence(node="n", group_rank=0))
    text = summary_of([(0, freeze), (1, crash), (2, crash2), (3, [])])
    assert text == ("[ft_launcher] summary: 4 cycles; 3 incidents: 2 × crash (exit code 1), 1 × hang (heartbeat); "
                    "2 ranks stopped as collateral; 1.5 s from failure detection to restarted workers; "
                    "result: succeeded (exit code 0)")


def test_a_failure_that_was_not_restarted_claims_no_restart_time():
    # --max-restarts 0: one cycle, one crash, no restart; the summary used to say
    # "0.0 s from failure detection to restarted workers" (issue 29 item 7).
    crash = failure_records({0: failure(0, -15), 1: failure(1, -9)}, local_ranks={0: 0, 1: 1}, hangs={},
                            stopped_by_us={1000}, cycle=0, now=T + 9, evidence=Evidence(node="n", group_rank=0))
    log = EventLog(None, node="n", stream=io.StringIO())
    log.record_event(CycleStart(cycle=0, since_failure_s=None))
    for record in crash:
        log.failure(record, "no restarts left (--max-restarts=0); stopping")
    log.record_event(Result(outcome="failed", exit_code=1))
    text = log.summary()
    assert text == ("[ft_launcher] summary: 1 cycle; 1 incident: 1 × crash (signal SIGKILL); "
                    "1 rank stopped as collateral; result: failed (exit code 1)")


def test_nodes_on_one_host_are_told_apart_by_their_node_rank():
    root = RankState(rank=1, local_rank=0, node="vm", group_rank=1, pid=1, outcome=HANG, cause="hang")
    assert waiting_for(root, "vm", 0) == "rank 1 on node vm (node rank 1)"
    assert waiting_for(root, "vm", 1) == "rank 1"
    assert waiting_for(None, "vm", 0) == "a failure whose root is unknown"


# ---------------------------------------------------------------------------- rule 4: a node sent no view

NODE2 = LostNode(1, "node2")


def test_a_node_that_sent_no_view_is_the_root_when_every_reported_rank_waits_in_a_collective():
    states = [state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE, node="node1", group=0),
              state(1, STOPPED, last=T + 0.002, frames=ALL_REDUCE, node="node1", group=0),
              state(4, HANG, at=T + 3.1, last=T + 0.001, frames=ALL_REDUCE, node="node3", group=2),
              state(5, STOPPED, last=T + 0.01, node="node3", group=2)]  # no stack: does not count
    root = choose_root(states, [NODE2], waited=2.0)
    assert (root.rank, root.node, root.group_rank, root.outcome) == (None, "node2", 1, LOST)
    assert root.cause == ("node node2 (group rank 1) sent no report within 2.0 s: lost or cut off from the "
                          "rendezvous store; every rank that reported was waiting in a collective")
    assert describe_root(root) == root.cause
    assert waiting_for(root, "node1", 0) == "node node2 (group rank 1), which sent no report (lost or cut off)"
    assert not any(root.same_rank(s) for s in states)


def test_several_missing_nodes_are_all_named_the_first_by_group_rank_is_the_root():
    states = [state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE)]
    root = choose_root(states, [LostNode(3, None), NODE2], waited=2.0)
    assert (root.node, root.group_rank, [n.group_rank for n in root.lost_nodes]) == ("node2", 1, [1, 3])
    assert root.cause.startswith("nodes node2 (group rank 1), group rank 3 (host unknown) each sent no report "
                                 "within 2.0 s: lost or cut off")
    assert waiting_for(root, "n", 0) == ("nodes node2 (group rank 1), group rank 3 (host unknown), which each sent "
                                         "no report (lost or cut off)")
    unnamed = choose_root(states, [LostNode(2)], waited=2.0)
    assert (unnamed.node, unnamed.group_rank) == ("", 2)
    assert unnamed.cause.startswith("group rank 2 (host unknown) sent no report within 2.0 s")


@pytest.mark.parametrize(("states", "root"), [
    # a rank that is not in a collective is what the others wait for (rule 2), lost view or not
    pytest.param([state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE), state(1, HANG, at=T + 3, last=T, frames=FROZEN)],
                 1, id="a-rank-not-in-a-collective"),
    # a still-running rank outside any collective holding the hung one up (rule 3)
    pytest.param([state(0, HANG, at=T + 60, last=T + 0.01, frames=ALL_REDUCE),
                  state(1, STOPPED, last=T, frames=FROZEN)],
                 1, id="a-rank-holding-up-the-collective"),
    # without the candidate's stack nothing says it was waiting: rule 2 stands
    pytest.param([state(0, HANG, at=T + 3, last=T), state(1, HANG, at=T + 3, last=T + 0.5)], 0, id="unknown-stacks"),
    # a crash is the root (rule 1), and so is a crash after the hang
    pytest.param([state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE), state(1, CRASH, at=T + 1)], 1, id="crash"),
    pytest.param([state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE), state(1, CRASH, at=T + 4)], 0,
                 id="crash-after-the-hang"),
    # a stopped process (SIGSTOP) froze itself, wherever it is
    pytest.param([state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE),
                  state(1, HANG, at=T + 3, last=T + 0.1, stopped=True, frames=ALL_REDUCE)], 1, id="a-stopped-process"),
])
def test_a_missing_view_does_not_override_a_rank_that_explains_the_failure(states, root):
    assert choose_root(states, [NODE2], waited=2.0).rank == root


DDP_BACKWARD = ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py:979 _engine_run_backward",
                "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:395 backward",
                "/venv/lib/python3.11/site-packages/torch/_tensor.py:623 Tensor.backward", "/job/train.py:122 main")
USER_CODE_IN_DDP_FORWARD = ("/job/model.py:12 forward",
                            "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py:1637 _run_ddp_forward",
                            "/job/train.py:118 main")


def test_under_ddp_a_rank_in_backward_waits_for_the_gradient_all_reduce():
    # DDP all-reduces gradients in C++ hooks inside backward: no torch.distributed frame in Python
    states = [state(0, HANG, at=T + 3, last=T, frames=DDP_BACKWARD, node="node1"),
              state(2, HANG, at=T + 3.2, last=T + 0.01, frames=DDP_BACKWARD, node="node3", group=2)]
    assert choose_root(states, [NODE2], waited=2.0).outcome == LOST
    # ... but a rank whose innermost frame is the user's own code (a model's forward) is not waiting
    states[1] = state(2, HANG, at=T + 3.2, last=T + 0.01, frames=USER_CODE_IN_DDP_FORWARD, node="node3", group=2)
    # (and being the one not waiting, it is the root: rank 0 waits for it in backward)
    assert choose_root(states, [NODE2], waited=2.0).rank == 2


SITE = "/venv/lib/python3.11/site-packages/"
SLEEPING_IN_STEP = ("/job/train.py:26 sleep_inside_step", "/job/train.py:56 main", "/job/train.py:70 <module>")
LIGHTNING_BACKWARD = (
    SITE + "torch/autograd/graph.py:979 _engine_run_backward", SITE + "torch/autograd/__init__.py:395 backward",
    SITE + "torch/_tensor.py:623 Tensor.backward",
    SITE + "lightning/pytorch/core/module.py:1101 LightningModule.backward",
    SITE + "lightning/pytorch/plugins/precision/precision.py:73 Precision.backward",
    SITE + "lightning/pytorch/strategies/strategy.py:213 Strategy.backward",
    SITE + "lightning/pytorch/loops/optimization/automatic.py:152 Closure.closure")
LIGHTNING_SLEEPING = ("/job/model.py:40 Model.training_step",
                      SITE + "lightning/pytorch/trainer/call.py:329 _call_strategy_hook",
                      SITE + "lightning/pytorch/strategies/ddp.py:357 DDPStrategy.training_step",
                      SITE + "lightning/pytorch/loops/optimization/automatic.py:334 "
                      "_AutomaticOptimization._training_step")
DDP_BUFFER_SYNC = (SITE + "torch/nn/parallel/distributed.py:2140 DistributedDataParallel._sync_buffers",
                   SITE + "torch/nn/parallel/distributed.py:1630 DistributedDataParallel._pre_forward",
                   "/job/train.py:118 main")


def test_peer_wait_level_orders_a_collective_over_backward_over_the_users_own_code():
    assert peer_wait_level(ALL_REDUCE) == 2
    assert peer_wait_level(DDP_BACKWARD) == peer_wait_level(LIGHTNING_BACKWARD) == peer_wait_level(DDP_BUFFER_SYNC) == 1
    for own in (SLEEPING_IN_STEP, LIGHTNING_SLEEPING, USER_CODE_IN_DDP_FORWARD, FROZEN, ()):
        assert peer_wait_level(own) == 0, own
    # backward below the user's own frame (a custom autograd Function's code) is the user's code
    assert peer_wait_level(("/job/fn.py:9 MyFunction.backward",) + DDP_BACKWARD) == 0


@pytest.mark.parametrize(("states", "root"), [
    # issue 31 item 7: both sections time out together in step 120; rank 0 entered the section a
    # few ms first (lockstep), but it waits in DDP's backward for rank 1, which sleeps in its step
    pytest.param([state(0, HANG, at=T + 60, last=T, step=120, frames=DDP_BACKWARD),
                  state(1, HANG, at=T + 60.003, last=T + 0.003, step=120, frames=SLEEPING_IN_STEP)],
                 1, id="both-hung-waiting-in-backward-vs-sleeping"),
    # the sleeping rank's last progress even came clearly later (a slower data loader)
    pytest.param([state(0, HANG, at=T + 4, last=T, step=12, frames=DDP_BACKWARD),
                  state(1, HANG, at=T + 4.4, last=T + 0.4, step=12, frames=SLEEPING_IN_STEP)],
                 1, id="sleeping-rank-progressed-later"),
    # rule 3: rank 0 timed out first; rank 1, still running, sleeps with no progress since then
    pytest.param([state(0, HANG, at=T + 4, last=T, step=12, frames=DDP_BACKWARD),
                  state(1, STOPPED, last=T + 0.4, step=12, frames=SLEEPING_IN_STEP)],
                 1, id="running-rank-holding-up-backward"),
    pytest.param([state(0, HANG, at=T + 4, last=T, step=6, frames=LIGHTNING_BACKWARD),
                  state(1, HANG, at=T + 4.01, last=T + 0.01, step=6, frames=LIGHTNING_SLEEPING)],
                 1, id="lightning"),
    pytest.param([state(0, HANG, at=T + 4, last=T, step=6, frames=DDP_BUFFER_SYNC),
                  state(1, HANG, at=T + 4.01, last=T + 0.01, step=6, frames=SLEEPING_IN_STEP)],
                 1, id="waiting-in-ddp-forward-buffer-sync"),
    # kept: a rank in backward is less surely waiting than one in a collective (without DDP it
    # computes), so a rank stuck in backward is still the root when its peer waits in all_reduce
    pytest.param([state(0, HANG, at=T + 4, last=T + 0.1, step=6, frames=DDP_BACKWARD),
                  state(1, HANG, at=T + 4, last=T, step=6, frames=ALL_REDUCE)], 0, id="backward-vs-collective"),
    pytest.param([state(0, HANG, at=T + 4, last=T + 0.1, step=6, frames=DDP_BACKWARD),
                  state(1, STOPPED, last=T, step=6, frames=ALL_REDUCE)], 0, id="running-rank-in-a-collective"),
    # kept: a lower step decides before the stacks do
    pytest.param([state(0, HANG, at=T + 4, last=T, step=11, frames=DDP_BACKWARD),
                  state(1, HANG, at=T + 4, last=T + 0.01, step=12, frames=SLEEPING_IN_STEP)], 0, id="lower-step-first"),
    # ties: both in their own code, or both in backward: the earliest last progress
    pytest.param([state(0, HANG, at=T + 4, last=T + 0.2, step=6, frames=SLEEPING_IN_STEP),
                  state(1, HANG, at=T + 4, last=T, step=6, frames=LIGHTNING_SLEEPING)], 1, id="both-in-own-code"),
    pytest.param([state(0, HANG, at=T + 4, last=T, step=6, frames=DDP_BACKWARD),
                  state(1, HANG, at=T + 4, last=T + 0.2, step=6, frames=LIGHTNING_BACKWARD)], 0, id="both-in-backward"),
    # rule 3 needs the running rank to wait less visibly than the hung one
    pytest.param([state(0, HANG, at=T + 4, last=T + 0.1, step=6, frames=DDP_BACKWARD),
                  state(1, STOPPED, last=T, step=6, frames=DDP_BACKWARD)], 0, id="running-rank-in-backward-too"),
    # a rank whose stack could not be read is not known to wait: it goes before one in backward
    pytest.param([state(0, HANG, at=T + 4, last=T, step=6, frames=DDP_BACKWARD),
                  state(1, HANG, at=T + 4, last=T + 0.2, step=6)], 1, id="unknown-stack-vs-backward"),
])
def test_a_rank_waiting_in_ddp_backward_is_not_the_root_of_its_peers_hang(states, root):
    assert choose_root(states).rank == root
    assert choose_root(list(reversed(states))).rank == root  # the order the views arrive in does not matter


def test_without_a_missing_view_the_rule_is_unchanged():
    states = [state(0, HANG, at=T + 3, last=T, frames=ALL_REDUCE), state(1, HANG, at=T + 3, last=T + 0.5,
                                                                        frames=ALL_REDUCE)]
    assert choose_root(states).rank == 0
    assert choose_root(states, [], waited=2.0).rank == 0


def test_records_and_lines_of_a_lost_node():
    # both local ranks hung in the all-reduce; the other node (group rank 1) sent nothing
    seen = []

    def exchange(states):
        seen.extend(states)
        return Exchanged([], [NODE2], 2.0)

    records = failure_records(
        {0: failure(0, -9), 1: failure(1, -9)}, local_ranks={0: 0, 1: 1},
        hangs={0: hang_report(T + 2, 11, False, ALL_REDUCE), 1: hang_report(T + 2.01, 11, False, ALL_REDUCE)},
        stopped_by_us=set(), cycle=3, now=T + 3, evidence=Evidence(node="node1", group_rank=0), exchange=exchange)
    assert len(seen) == 2
    assert [(r.rank, r.role, r.kind) for r in records] == [(0, COLLATERAL, "hang"), (1, COLLATERAL, "hang")]
    for record in records:
        assert record.explanation.startswith("stopped waiting for node node2 (group rank 1), which sent no report "
                                             "(lost or cut off), blocked at ")
        assert (record.root.rank, record.root.node, record.root.group_rank,
                record.root.outcome) == (None, "node2", 1, LOST)
        assert record.root.lost_nodes == (LostNode(1, "node2"),)
        assert record.root.cause.startswith("node node2 (group rank 1) sent no report within 2.0 s")
    stream = io.StringIO()
    log = EventLog(None, node="node1", stream=stream)
    log.record_event(CycleStart(cycle=3))
    for record in records:
        log.failure(record, "restarting")
    line = stream.getvalue().splitlines()[0]
    assert line.startswith("[ft_launcher] cycle 3: rank 0 (local rank 0, pid 1000) on node node1 stopped waiting "
                           "for node node2 (group rank 1), which sent no report (lost or cut off), blocked at ")
    assert line.endswith("(collateral: hang: no heartbeat for 2.00 s > timeout 2.00 s); restarting")
    assert log.records[-1]["root_outcome"] == LOST and log.records[-1]["root_node"] == "node2"
    assert "1 incident: 1 × lost node; 2 ranks stopped as collateral" in log.summary()
    # the same failure with the other node's view in hand names no lost node
    records = failure_records(
        {0: failure(0, -9)}, local_ranks={0: 0}, hangs={0: hang_report(T + 2, 11, False, ALL_REDUCE)},
        stopped_by_us=set(), cycle=3, now=T + 3, evidence=Evidence(node="node1", group_rank=0),
        exchange=lambda states: Exchanged([state(7, HANG, at=T + 2, last=T - 1, frames=FROZEN, node="node2",
                                                 group=1)], [], 2.0))
    assert records[0].root.rank == 7 and records[0].root.outcome == HANG


def test_a_node_that_left_on_request_is_named_with_its_request_and_its_own_fingerprint():
    from launcher.decision.crash_loop import fingerprint

    left = RankState(rank=3, local_rank=0, node="b", group_rank=1, pid=7, outcome=LEFT, event_at=T,
                     cause="its node left the job (rank 3 (pid 7) requested ExcludeThisNode: slow)")

    def exchange(states):
        return Exchanged([left])

    records = failure_records({0: failure(0, 1)}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=0,
                              now=T + 1, evidence=Evidence(node="a", group_rank=0, exits_seen_at={0: T + 0.2}),
                              exchange=exchange)
    (record,) = records
    assert record.role == COLLATERAL and record.root.outcome == LEFT
    assert record.explanation == ("stopped waiting for rank 3 on node b (node rank 1), which was stopped: its node "
                                  "left the job (rank 3 (pid 7) requested ExcludeThisNode: slow)")
    assert describe_root(left) == "rank 3 was stopped: " + left.cause
    assert RankState.from_json(left.to_json()) == left  # published as it is read back
    found = fingerprint(left)
    assert (found.kind, found.what, found.where) == (LEFT, "node left the job on request", "b")
