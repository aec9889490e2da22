"""launcher.decision.crash_loop: fingerprints and the no-progress rule, as tables."""

from __future__ import annotations

import threading

import pytest

from ft_core.wire.messages import Progress
from launcher.decision import culprit
from launcher.decision.crash_loop import (
    CrashLoopGuard,
    CycleFailure,
    Fingerprint,
    failed_before_first_step,
    fingerprint,
    killed_from_outside,
    normalise,
)
from launcher.decision.culprit import RankState

USER = "/home/me/train.py"


def state(cause: str = "exit code 1: ValueError: bad shard 17", outcome: str = culprit.CRASH,
          frames: tuple[str, ...] = (), node: str = "node1") -> RankState:
    return RankState(rank=1, local_rank=1, node=node, group_rank=0, pid=4242, outcome=outcome, cause=cause,
                     stack_frames=frames)


@pytest.mark.parametrize("text,expected", [
    ("exit code 1: ValueError: bad shard 17", "exit code 1: ValueError: bad shard N"),
    ("exit code 137", "exit code 137"),
    ("hang: section 'step' open 12.3 s > timeout 10.0 s", "hang: section 'step' open N s > timeout N s"),
    ("RuntimeError: tensor at 0x7f3a2b10 (pid 991)", "RuntimeError: tensor at 0x? (pid N)"),
    ("signal SIGSEGV", "signal SIGSEGV"),
    ("a   b\n c", "a b c"),
    ("x" * 400, "x" * 300),
])
def test_normalise_replaces_what_changes_between_runs(text: str, expected: str) -> None:
    assert normalise(text) == expected


# Issue 31 item 6: incidental text that differs every cycle of one bug (real messages).
@pytest.mark.parametrize("first,second", [
    # tempfile.mkdtemp() directories, /tmp and $TMPDIR-style temp dirs
    ("exit code 1: FileNotFoundError: [Errno 2] No such file or directory: '/tmp/tmpk3j2l1ab/shard_3.bin'",
     "exit code 1: FileNotFoundError: [Errno 2] No such file or directory: '/tmp/tmpq9x_0zcd/shard_3.bin'"),
    ("exit code 1: OSError: cannot open /var/tmp/job-1234/cache/tmp4f8a_bz1/index.json",
     "exit code 1: OSError: cannot open /var/tmp/job-1290/cache/tmpz00p1qxw/index.json"),
    ("exit code 1: RuntimeError: checkpoint /scratch/alice/tmp/run-7f3a/model.pt is truncated",
     "exit code 1: RuntimeError: checkpoint /scratch/alice/tmp/run-91bd/model.pt is truncated"),
    ("exit code 1: RuntimeError: shm /dev/shm/nccl-Ab12Cd/buffer gone",
     "exit code 1: RuntimeError: shm /dev/shm/nccl-x9QzT0/buffer gone"),
    # pytest's tmp_path
    ("exit code 1: AssertionError: /tmp/pytest-of-alice/pytest-12/test_resume0/ckpt/last.ckpt differs",
     "exit code 1: AssertionError: /tmp/pytest-of-alice/pytest-13/test_resume0/ckpt/last.ckpt differs"),
    # a temp file's name alone
    ("exit code 1: ValueError: bad header in tmpab12cd3e.json",
     "exit code 1: ValueError: bad header in tmp0_zz91ka.json"),
    # UUIDs
    ("exit code 1: RuntimeError: request 3f2a9c1e-8b4d-4e2f-9a1b-0c3d5e7f9a2b failed with 503",
     "exit code 1: RuntimeError: request 0d6e4b2a-11c3-4f0e-8e7a-6b5c4d3e2f1a failed with 503"),
    # hex ids: an address, a hash, a uuid without dashes
    ("exit code 1: RuntimeError: object at 0x7f3a2b10 in run 3f2a9c1e8b4d4e2f9a1b0c3d5e7f9a2b",
     "exit code 1: RuntimeError: object at 0x7f99aa00 in run 9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f"),
    ("exit code 1: KeyError: 'blob_5e884898da28'", "exit code 1: KeyError: 'blob_2c624232cdd2'"),
    # ISO timestamps, the hour too, and a compact stamp in a file name
    ("exit code 1: TimeoutError: lease expired at 2024-05-01T13:07:22.123Z",
     "exit code 1: TimeoutError: lease expired at 2024-05-01T14:11:05.980Z"),
    ("exit code 1: TimeoutError: lease expired at 2024-05-01 13:07:22+02:00",
     "exit code 1: TimeoutError: lease expired at 2024-05-02 09:00:01+02:00"),
    ("exit code 1: FileNotFoundError: ckpt_20240501_130722.pt",
     "exit code 1: FileNotFoundError: ckpt_20240501_141105.pt"),
    # pids and ports
    ("exit code 1: RuntimeError: [pid=4401] connect to 127.0.0.1:41234 refused",
     "exit code 1: RuntimeError: [pid=5120] connect to 127.0.0.1:38911 refused"),
])
def test_incidental_text_does_not_change_the_fingerprint(first: str, second: str) -> None:
    assert normalise(first) == normalise(second), (normalise(first), normalise(second))
    assert fingerprint(state(first)) == fingerprint(state(second))


@pytest.mark.parametrize("first,second", [
    # another file under the same temp dir, another exception, another exit code: another failure
    ("exit code 1: FileNotFoundError: '/tmp/tmpk3j2l1ab/shard_3.bin'",
     "exit code 1: FileNotFoundError: '/tmp/tmpk3j2l1ab/labels.bin'"),
    ("exit code 1: ValueError: request 3f2a9c1e-8b4d-4e2f-9a1b-0c3d5e7f9a2b failed",
     "exit code 1: KeyError: request 3f2a9c1e-8b4d-4e2f-9a1b-0c3d5e7f9a2b failed"),
    ("exit code 1: ValueError: bad shard at 2024-05-01T13:07:22",
     "exit code 2: ValueError: bad shard at 2024-05-01T13:07:22"),
    # a path outside any temp dir is the data's, kept
    ("exit code 1: FileNotFoundError: /data/imagenet/train/shard_3.bin",
     "exit code 1: FileNotFoundError: /data/imagenet/val/shard_3.bin"),
    # a word of the letters a-f is a word
    ("exit code 1: KeyError: 'deadbeefcafe'", "exit code 1: KeyError: 'facadebeaded'"),
])
def test_what_tells_failures_apart_is_kept(first: str, second: str) -> None:
    assert normalise(first) != normalise(second)


@pytest.mark.parametrize("text,expected", [
    ("exit code 1: OSError: /tmp/tmpk3j2l1ab/a/b/shard_3.bin: bad", "exit code 1: OSError: <tmp>/shard_3.bin: bad"),
    ("exit code 1: ValueError: id 3f2a9c1e-8b4d-4e2f-9a1b-0c3d5e7f9a2b", "exit code 1: ValueError: id <uuid>"),
    ("exit code 1: ValueError: at 2024-05-01T13:07:22Z", "exit code 1: ValueError: at <time>"),
    ("exit code 1: ValueError: sha 9fceb02d0ae598e95dc970b74767f19372d61af8", "exit code 1: ValueError: sha <hex>"),
    ("exit code 1: ValueError: layer_3 of conv2d", "exit code 1: ValueError: layer_3 of conv2d"),
])
def test_normalised_forms(text: str, expected: str) -> None:
    assert normalise(text) == expected


def test_same_bug_same_fingerprint_across_runs_and_lines() -> None:
    first = fingerprint(state("exit code 1: ValueError: bad shard 17", frames=(f"{USER}:30 step",)))
    second = fingerprint(state("exit code 1: ValueError: bad shard 23", frames=(f"{USER}:31 step",)))
    assert first == second and first.digest == second.digest
    assert first.where == "train.py step"
    # a cold start runs the script by its absolute path, a warm one as typed
    assert fingerprint(state(frames=("train.py:30 step",))) == first


@pytest.mark.parametrize("other", [
    state("exit code 1: KeyError: 'lr'"),
    state("exit code 2: ValueError: bad shard 17"),
    state("signal SIGSEGV", outcome=culprit.CRASH),
    state("hang: section 'step' open 12.3 s > timeout 10.0 s", outcome=culprit.HANG),
    state("exit code 1: ValueError: bad shard 17", frames=(f"{USER}:90 evaluate",)),
])
def test_other_failures_other_fingerprints(other: RankState) -> None:
    assert fingerprint(other) != fingerprint(state())


def test_a_lost_node_is_fingerprinted_by_its_node() -> None:
    lost = fingerprint(state("no report", outcome=culprit.LOST, node="node2"))
    assert lost.kind == culprit.LOST and lost.where == "node2"
    assert lost != fingerprint(state("no report", outcome=culprit.LOST, node="node3"))


F = Fingerprint("crash", "exit code 1: ValueError: bad shard N", "train.py step")
G = Fingerprint("crash", "exit code 1: KeyError: 'lr'", "train.py step")


@pytest.mark.parametrize("failures,max_cycles,min_steps,stops_at", [
    # The deterministic bug: the same failure at the same step stops at the second cycle.
    ([(F, 30), (F, 30)], 2, 1, 1),
    ([(F, 30), (F, 30), (F, 30)], 3, 1, 2),
    # Progress between failures: never stops.
    ([(F, 30), (F, 31), (F, 32), (F, 33)], 2, 1, None),
    # Less progress than asked for is no progress.
    ([(F, 30), (F, 35)], 2, 10, 1),
    # An earlier step (restarted from an older checkpoint) is no progress either.
    ([(F, 30), (F, 20)], 2, 1, 1),
    # Different failures: a transient one between two of the same resets the run.
    ([(F, 30), (G, 30), (F, 30)], 2, 1, None),
    # Unknown steps never count.
    ([(F, None), (F, None), (F, None)], 2, 1, None),
    ([(F, 30), (F, None), (F, 30)], 2, 1, None),
    # Off.
    ([(F, 30), (F, 30), (F, 30)], 0, 1, None),
])
def test_guard_table(failures: list[tuple[Fingerprint, int | None]], max_cycles: int, min_steps: int,
                     stops_at: int | None) -> None:
    guard = CrashLoopGuard(max_cycles, min_steps)
    verdicts = [guard.on_failure(CycleFailure(cycle, fp, step)) for cycle, (fp, step) in enumerate(failures)]
    stopped = [i for i, v in enumerate(verdicts) if v.stop]
    assert (stopped[0] if stopped else None) == stops_at


SETUP = Fingerprint("crash", "exit code 1: ValueError: You set `devices=N` ... world size (N).", None)


@pytest.mark.parametrize("failures,max_cycles,stops_at", [
    # A setup error: the same failure before the first step of every cycle stops like a bug at step 30.
    ([(SETUP, True), (SETUP, True)], 2, 1),
    ([(SETUP, True), (SETUP, True), (SETUP, True)], 3, 2),
    # One cycle got past its first step (its step unknown): not the same loop.
    ([(SETUP, True), (SETUP, False), (SETUP, True)], 2, None),
    # Another error in between starts the count again.
    ([(SETUP, True), (G, True), (SETUP, True)], 2, None),
    # Off.
    ([(SETUP, True), (SETUP, True), (SETUP, True)], 0, None),
])
def test_the_same_error_before_the_first_step_repeats(failures: list[tuple[Fingerprint, bool]], max_cycles: int,
                                                      stops_at: int | None) -> None:
    guard = CrashLoopGuard(max_cycles, 1)
    verdicts = [guard.on_failure(CycleFailure(cycle, fp, None, before_first_step=before))
                for cycle, (fp, before) in enumerate(failures)]
    stopped = [i for i, v in enumerate(verdicts) if v.stop]
    assert (stopped[0] if stopped else None) == stops_at


def test_the_stop_of_a_setup_error_names_it_and_says_before_the_first_step() -> None:
    guard = CrashLoopGuard(2, 1)
    guard.on_failure(CycleFailure(0, SETUP, None, before_first_step=True))
    verdict = guard.on_failure(CycleFailure(1, SETUP, None, before_first_step=True))
    assert verdict.stop
    assert "ValueError: You set `devices=N`" in verdict.text
    assert "ended cycles 0, 1 before the first step of each" in verdict.text and SETUP.digest in verdict.text
    assert "step None" not in verdict.text and "without progress" not in verdict.text


def progress(**fields: object) -> Progress:
    return Progress(last_progress_at=1.0, **fields)


@pytest.mark.parametrize("outcome,cause,prog,expected", [
    # Raised before it ever connected to its monitor (Lightning's devices check in Trainer.fit).
    (culprit.CRASH, "exit code 1: ValueError: You set `devices=2`", None, True),
    # Connected, then raised before any heartbeat or step (a callback's setup).
    (culprit.CRASH, "exit code 1: FileNotFoundError: data/", progress(heartbeats=0), True),
    # A step, a heartbeat or a section: it worked; with no step announced the step is unknown.
    (culprit.CRASH, "exit code 1: ValueError: x", progress(step=0), False),
    (culprit.CRASH, "exit code 1: ValueError: x", progress(heartbeats=3), False),
    (culprit.CRASH, "exit code 1: ValueError: x", progress(section_since=1.0, open_section="setup"), False),
    # Not the rank's own exception: a kill from outside or a bare exit code may be transient.
    (culprit.CRASH, "signal SIGKILL", None, False),
    (culprit.CRASH, "exit code 5", None, False),
    (culprit.HANG, "hang: no initial heartbeat within 60.0 s", progress(), False),
    (culprit.LOST, "node sent no report", None, False),
])
def test_failed_before_first_step(outcome: str, cause: str, prog: Progress | None, expected: bool) -> None:
    root = RankState(rank=0, local_rank=0, node="n1", group_rank=0, pid=7, outcome=outcome, cause=cause,
                     progress=prog)
    assert failed_before_first_step(root) is expected


# Issue 31 item 5: a death by a signal from outside, with nothing of the rank's own, is no bug's fingerprint.
@pytest.mark.parametrize("cause,frames,expected", [
    ("signal SIGKILL", (), True),  # the OOM killer (for another tenant), an operator's kill -9
    ("signal SIGTERM", (), True),
    ("signal SIGINT", (), True),
    ("signal SIGHUP", (), True),
    ("signal SIGUSR1", (), True),  # a scheduler's preemption notice the script does not handle
    ("signal SIGXCPU", (), True),
    ("exit code 137", (), True),  # a rank under a shell, killed by SIGKILL
    ("exit code 143", (), True),
    # the rank's own fault: a native bug at the same step is a repeat
    ("signal SIGSEGV", (), False),
    ("signal SIGABRT", (), False),
    ("signal SIGBUS", (), False),
    ("exit code 139", (), False),
    # its own exception, a plain exit code, or a frame of the user's code: the rank's own
    ("exit code 1: ValueError: bad shard 17", (), False),
    ("exit code 1", (), False),
    ("exit code 200", (), False),
    ("signal SIGKILL", (f"{USER}:30 step",), False),
    ("signal SIGKILL", (f"{threading.__file__}:320 wait",), True),  # no user frame
])
def test_killed_from_outside(cause: str, frames: tuple[str, ...], expected: bool) -> None:
    assert killed_from_outside(state(cause, frames=frames)) is expected


@pytest.mark.parametrize("outcome", [culprit.HANG, culprit.STOPPED, culprit.LOST, culprit.LEFT])
def test_only_a_crash_is_killed_from_outside(outcome: str) -> None:
    assert not killed_from_outside(state("signal SIGKILL", outcome=outcome))


K = Fingerprint("crash", "signal SIGKILL", None)
SEGV = Fingerprint("crash", "signal SIGSEGV", None)


@pytest.mark.parametrize("failures,stops_at", [
    # Two kills from outside at steps 25 and 23 (4 restarts left): not a repeat, whatever the steps.
    ([(K, 25, True), (K, 23, True)], None),
    ([(K, 25, True), (K, 25, True), (K, 25, True), (K, 25, True)], None),
    # A kill between two of the same bug breaks the run like another failure.
    ([(F, 30, False), (K, 30, True), (F, 30, False)], None),
    ([(F, 30, False), (K, 30, True), (F, 30, False), (F, 30, False)], 3),
    # The rank's own fault signal at the same step still repeats.
    ([(SEGV, 25, False), (SEGV, 23, False)], 1),
])
def test_kills_from_outside_never_repeat(failures: list[tuple[Fingerprint, int, bool]], stops_at: int | None) -> None:
    guard = CrashLoopGuard(2, 1)
    verdicts = [guard.on_failure(CycleFailure(cycle, fp, step, "n1", from_outside=outside), True)
                for cycle, (fp, step, outside) in enumerate(failures)]
    stopped = [i for i, v in enumerate(verdicts) if v.stop or v.exclude]
    assert (stopped[0] if stopped else None) == stops_at


def test_the_stop_says_which_failure_repeated_where_and_in_which_cycles() -> None:
    guard = CrashLoopGuard(2, 1)
    guard.on_failure(CycleFailure(0, F, 30))
    verdict = guard.on_failure(CycleFailure(1, F, 30))
    assert verdict.stop and [f.cycle for f in verdict.repeats] == [0, 1]
    assert "ValueError: bad shard N" in verdict.text and "cycles 0, 1" in verdict.text
    assert "step 30" in verdict.text and F.digest in verdict.text


def test_success_forgets_the_run() -> None:
    guard = CrashLoopGuard(2, 1)
    guard.on_failure(CycleFailure(0, F, 30))
    guard.on_progress()
    assert not guard.on_failure(CycleFailure(1, F, 30)).stop


@pytest.mark.parametrize("max_cycles,min_steps", [(-1, 1), (2, 0)])
def test_bad_settings_are_refused(max_cycles: int, min_steps: int) -> None:
    with pytest.raises(ValueError, match=">="):
        CrashLoopGuard(max_cycles, min_steps)


# ---------------------------------------------------------------- a node that fails every cycle


def failure(cycle: int, node: str | None, fp: Fingerprint = F, step: int | None = 30) -> CycleFailure:
    return CycleFailure(cycle, fp, step, node)


@pytest.mark.parametrize("nodes,can_lose,expected", [
    # Every failure of the run on one node, and the job can do without it: that node leaves.
    (["n2", "n2"], True, [None, "exclude n2"]),
    # The rendezvous needs every node (--nnodes MIN = the nodes): a stop, as without a node.
    (["n2", "n2"], False, [None, "stop"]),
    # Roots on different nodes: the code, not a node.
    (["n1", "n2"], True, [None, "stop"]),
    # The root's node not known: never a node to leave.
    ([None, None], True, [None, "stop"]),
    # After n2 left, the same failure without progress on another node: a bug.
    (["n2", "n2", "n3"], True, [None, "exclude n2", "stop"]),
    # ... and on one node again (a launcher that took n2's name): a stop too, one exclusion per fingerprint.
    (["n2", "n2", "n2"], True, [None, "exclude n2", "stop"]),
])
def test_a_node_that_is_the_root_every_time_leaves_instead_of_a_stop(nodes: list[str | None], can_lose: bool,
                                                                      expected: list[str | None]) -> None:
    guard = CrashLoopGuard(2, 1)
    got = []
    for cycle, node in enumerate(nodes):
        verdict = guard.on_failure(failure(cycle, node), can_lose)
        got.append("stop" if verdict.stop else f"exclude {verdict.exclude}" if verdict.exclude else None)
    assert got == expected


def test_after_a_node_left_the_same_failure_later_stops_even_after_progress() -> None:
    guard = CrashLoopGuard(2, 1)
    guard.on_failure(failure(0, "n2"), True)
    assert guard.on_failure(failure(1, "n2"), True).exclude == "n2"
    # the others moved on (step 40), then fail the same way twice on n3: not a second bad node
    assert not guard.on_failure(failure(2, "n3", step=40), True).stop
    verdict = guard.on_failure(failure(3, "n3", step=40), True)
    assert verdict.stop and verdict.exclude is None
    assert "node n2 left the job for it after cycle 1" in verdict.text and "failed again on node n3" in verdict.text
    assert "a bug, not a node" in verdict.text


def test_another_fingerprint_may_make_another_node_leave() -> None:
    guard = CrashLoopGuard(2, 1)
    guard.on_failure(failure(0, "n2"), True)
    assert guard.on_failure(failure(1, "n2"), True).exclude == "n2"
    guard.on_failure(failure(2, "n3", G), True)
    assert guard.on_failure(failure(3, "n3", G), True).exclude == "n3"


def test_the_exclusion_says_which_failure_repeated_where() -> None:
    guard = CrashLoopGuard(2, 1)
    guard.on_failure(failure(4, "node2 (group rank 1)"), True)
    verdict = guard.on_failure(failure(5, "node2 (group rank 1)"), True)
    assert not verdict.stop and verdict.exclude == "node2 (group rank 1)"
    assert "cycles 4, 5 at step 30" in verdict.text and F.digest in verdict.text
    assert "each time with its root on node node2 (group rank 1)" in verdict.text
    assert "the others restart without it" in verdict.text
