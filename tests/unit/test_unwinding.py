"""launcher.decision.unwinding and the collateral line: a stack taken while a rank was already ending.

The frames are those of real runs (issue 29 item 7): a 2-rank Lightning DDP job with one worker
SIGKILLed; the surviving rank's stack was taken while it printed its traceback or exited.
"""

from __future__ import annotations

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ft_core.wire.messages import StacksCaptured, StackSummary
from launcher.decision.culprit import COLLATERAL, ROOT
from launcher.decision.failures import Evidence, failure_records
from launcher.decision.unwinding import caller_frame, ending_reason, is_own_frame

STDLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
SITE = "/work/main/.venv/lib/python3.11/site-packages"
OURS = "/work/main"

PRINTING_VIA_OUR_ON_EXCEPTION = (
    f"{STDLIB}/ast.py:50 parse",
    f"{STDLIB}/traceback.py:588 _extract_caret_anchors_from_line_segment",
    f"{STDLIB}/traceback.py:485 StackSummary.format_frame_summary",
    f"{STDLIB}/traceback.py:184 format_exc",
    f"{SITE}/torch/distributed/elastic/multiprocessing/errors/error_handler.py:82 ErrorHandler.record_exception",
    f"{OURS}/ft_core/client/run_errors.py:82 record_error_for_launcher",
    f"{OURS}/ptl_resiliency/_session.py:203 FitSession.failed",
)
PRINTING_AT_EXIT = (
    f"{STDLIB}/linecache.py:137 updatecache",
    f"{STDLIB}/linecache.py:46 getlines",
    f"{STDLIB}/traceback.py:318 FrameSummary.line",
    f"{STDLIB}/traceback.py:125 print_exception",
    f"{OURS}/launcher/warm/zygote.py:353 Zygote._become_worker",
)
FINALIZING_AFTER_THE_SCRIPT = (
    f"{SITE}/torch/library.py:665 _del_library",
    f"{OURS}/launcher/warm/zygote.py:357 Zygote._become_worker",
)
INTERPRETER_SHUTDOWN = (f"{STDLIB}/threading.py:1583 _shutdown",)
WAITING_IN_A_COLLECTIVE = (
    f"{SITE}/torch/distributed/distributed_c10d.py:2806 all_reduce",
    f"{SITE}/torch/distributed/c10d_logger.py:81 wrapper",
    "/job/train.py:42 train_step",
    f"{STDLIB}/runpy.py:88 _run_code",
    f"{STDLIB}/runpy.py:291 run_path",
    f"{OURS}/launcher/warm/zygote.py:349 Zygote._become_worker",
)
WAITING_IN_OUR_GRACEFUL_STOP = (
    f"{SITE}/torch/distributed/distributed_c10d.py:2806 all_reduce",
    f"{OURS}/ft_core/client/graceful_stop.py:210 GracefulStop.step_ended",
    f"{OURS}/ptl_resiliency/fault_tolerance_callback.py:118 FaultToleranceCallback.on_train_batch_end",
    f"{SITE}/lightning/pytorch/trainer/call.py:228 _call_callback_hooks",
    "/job/train.py:60 main",
)


@pytest.mark.parametrize("frames,expected", [
    (PRINTING_VIA_OUR_ON_EXCEPTION, "printing a traceback"),
    (PRINTING_AT_EXIT, "printing a traceback"),
    (FINALIZING_AFTER_THE_SCRIPT, "exiting"),
    (INTERPRETER_SHUTDOWN, "exiting"),
    ((f"{OURS}/ft_core/client/session.py:271 FrontEndSession.close",
      f"{OURS}/ptl_resiliency/_session.py:243 FitSession.finish"), "handling its error"),
    ((f"{SITE}/lightning/pytorch/trainer/call.py:70 _interrupt",), "handling its error"),
    # still at work: the innermost frame is where it waited
    (WAITING_IN_A_COLLECTIVE, None),
    (WAITING_IN_OUR_GRACEFUL_STOP, None),
    ((), None),
    # the user's own function of that name is not our error handling
    (("/job/train.py:10 on_exception",), None),
])
def test_ending_reason(frames: tuple[str, ...], expected: str | None) -> None:
    assert ending_reason(frames) == expected


def test_the_users_caller_is_never_a_frame_of_ours() -> None:
    assert caller_frame(WAITING_IN_A_COLLECTIVE) == "/job/train.py:42 train_step"
    assert caller_frame(WAITING_IN_OUR_GRACEFUL_STOP) == "/job/train.py:60 main"
    assert caller_frame(FINALIZING_AFTER_THE_SCRIPT) is None
    assert is_own_frame(f"{SITE}/ptl_resiliency/_base.py:230 on_exception")  # installed from the wheel
    assert not is_own_frame("/job/launcher/train.py:3 main")  # a user's directory named launcher


def collateral_line(frames: tuple[str, ...]) -> str:
    """The collateral rank 0's explanation when rank 1 was SIGKILLed and rank 0 stopped by us."""
    stacks = {0: StacksCaptured(pid=1000, stacks=StackSummary(stack_frames=frames, stack_file="/s/r0.txt"))}
    records = failure_records(
        {0: ProcessFailure(local_rank=0, pid=1000, exitcode=-15, error_file="<N/A>"),
         1: ProcessFailure(local_rank=1, pid=1001, exitcode=-9, error_file="<N/A>")},
        local_ranks={0: 0, 1: 1}, hangs={}, stopped_by_us={1000}, cycle=0, now=1e9,
        evidence=Evidence(node="n", group_rank=0, stacks=stacks))
    assert [(r.rank, r.role) for r in records] == [(1, ROOT), (0, COLLATERAL)]
    return records[1].explanation


@pytest.mark.parametrize("frames,reason", [
    (PRINTING_VIA_OUR_ON_EXCEPTION, "printing a traceback"),
    (PRINTING_AT_EXIT, "printing a traceback"),
    (FINALIZING_AFTER_THE_SCRIPT, "exiting"),
])
def test_a_collateral_rank_already_ending_is_not_said_to_be_blocked_there(frames: tuple[str, ...],
                                                                           reason: str) -> None:
    # Before: "stopped waiting for rank 1, blocked at .../linecache.py:137 updatecache (called from
    # .../launcher/warm/zygote.py:353 Zygote._become_worker)".
    line = collateral_line(frames)
    assert line == f"stopped waiting for rank 1 (already {reason} when its stack was taken)"
    assert "blocked at" not in line and "zygote" not in line and "ptl_resiliency" not in line


def test_a_collateral_rank_waiting_in_a_collective_is_named_with_the_users_caller() -> None:
    assert collateral_line(WAITING_IN_OUR_GRACEFUL_STOP) == (
        f"stopped waiting for rank 1, blocked at {WAITING_IN_OUR_GRACEFUL_STOP[0]} (called from /job/train.py:60 main)")
