"""Failures that repeat: a fingerprint of what failed, and the rule that stops a crash loop.

A restart helps with a failure that does not come back. A deterministic bug, a corrupt shard or a
bad node fails the job again after every restart, at the same place. :func:`fingerprint` names
what failed in a way that is the same for such a repeat and different for another failure: the
kind of failure, its cause with the numbers, addresses and pids that change from run to run
replaced, and the innermost frame of the user's code. :class:`CrashLoopGuard` watches the
fingerprint and the step of each failed cycle's root and says stop when the same fingerprint ends
``max_cycles`` consecutive cycles without the step moving on by ``min_progress_steps``, or before
the first step each time (:func:`failed_before_first_step`: a setup error no restart can fix).
A root killed from outside (:func:`killed_from_outside`: SIGKILL, SIGTERM ... and no exception of
its own) is never a repeat: who was killed is no fingerprint of a bug.

A bad node and a bug look the same to that rule; where they differ is where the root was. When
every failure of the run had its root on one node and the job can go on without that node (the
rendezvous allows one node fewer), the guard names that node to leave the job instead of a stop,
and remembers it for the fingerprint: the same failure again, now on another node, is a bug and
stops the restarts.

Every node computes the same fingerprint: it is made from the root's
:class:`~launcher.decision.culprit.RankState`, which every node chooses from the same exchanged views.
Pure (no clock, no I/O).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from ft_core.wire.stacks import innermost_user_frame
from launcher.decision import culprit
from launcher.decision.culprit import RankState

DEFAULT_MAX_NO_PROGRESS_CYCLES = 2
"""Consecutive failed cycles with one fingerprint and no progress that stop the restarts."""
DEFAULT_MIN_PROGRESS_STEPS = 1
"""Steps the root's step must pass the previous failure's step by to count as progress."""

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<![A-Za-z_#\d.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_EXIT_CODE = re.compile(r"exit code (\d+)")
_PID = re.compile(r"\bpid[ =:]*\d+", re.IGNORECASE)
_OWN_ERROR = re.compile(r"^exit code \d+: \S")  # failures.py's cause for an exit with the rank's exception
_SPACE = re.compile(r"\s+")
# A path: from a "/" that starts a word (or follows "~", "." or "..") up to white space, a quote or a bracket.
_PATH = re.compile(r"(?<![\w.~/-])(?:~|\.{1,2})?/[^\s'\"`()<>\[\]{},;|]+")
# Directory names that hold what lives for one run only: temp dirs (/tmp, /var/tmp, a job's
# $TMPDIR/tmp), shared memory, tempfile's random names (tmp + 8 characters) and pytest's tmp_path.
_TEMP_DIR = re.compile(r"(?i)^(?:tmp|temp|tmpdir|shm|tmp[a-z0-9_]{8}|pytest-of-.+|pytest-\d+)$")
_TEMP_NAME = re.compile(r"(?<![A-Za-z0-9])tmp[a-z0-9_]{8}(?![A-Za-z0-9_])")  # tempfile's, outside a path
_UUID = re.compile(r"(?i)(?<![0-9a-f])[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?![0-9a-f])")
# An ISO 8601 date with its time (the hour too: "T13" escapes the number rule), or a compact
# 20240501-130722 / 20240501T130722 / 20240501_130722 stamp.
_TIMESTAMP = re.compile(
    r"(?<!\d)\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?!\d)"
    r"|(?<!\d)(?:19|20)\d{6}[T_-]?\d{6}(?!\d)")
# A run of 8+ hex digits with a digit in it (ids, hashes, a uuid without dashes); a word of the
# letters a-f alone is a word.
_HEX_RUN = re.compile(r"(?i)(?<![0-9a-z])(?=[a-f]*\d)[0-9a-f]{8,}(?![0-9a-z])")
MAX_TEXT_CHARS = 300


def _temp_path(match: re.Match[str]) -> str:
    """``<tmp>/name`` for a path with a temp directory in it: the directories under it differ
    from run to run (tempfile's random names, pytest's counters), the file's name tells two
    failures apart. Any other path as it is."""
    path = match.group(0)
    parts = path.split("/")
    for at, part in enumerate(parts[:-1]):
        # /dev/shm and /var/tmp are caught by their second part
        if _TEMP_DIR.match(part):
            rest = parts[at + 1:]
            return "<tmp>/" + rest[-1] if rest and rest[-1] else "<tmp>"
    return path


def normalise(text: str) -> str:
    """``text`` with what changes between two runs of the same failure replaced.

    Replaced: a path through a temp directory by ``<tmp>/`` and its last part (a directory named
    ``tmp``, ``temp``, ``tmpdir`` or ``shm``, tempfile's ``tmpXXXXXXXX``, pytest's
    ``pytest-of-USER``/``pytest-N``: recognised by its shape, not by this node's ``$TMPDIR``, so
    that every node reads the same fingerprint from the root's text; a ``$TMPDIR`` of the job is
    the same for every cycle), tempfile's random names elsewhere by ``tmp?``, UUIDs by
    ``<uuid>``, ISO dates and times by ``<time>``, addresses by ``0x?``, runs of 8 or more hex
    digits by ``<hex>``, pids and other numbers (not an exit code) by ``N`` (ports too), runs of
    white space by one space; at most 300 characters.
    """
    text = _EXIT_CODE.sub(r"exit code #\1", text)  # an exit code tells failures apart: kept
    text = _PATH.sub(_temp_path, text)
    text = _TEMP_NAME.sub("tmp?", text)
    text = _UUID.sub("<uuid>", text)
    text = _TIMESTAMP.sub("<time>", text)
    text = _PID.sub("pid N", text)
    text = _ADDRESS.sub("#address", text)
    text = _HEX_RUN.sub("<hex>", text)
    text = _NUMBER.sub("N", text).replace("exit code #", "exit code ").replace("#address", "0x?")
    return _SPACE.sub(" ", text).strip()[:MAX_TEXT_CHARS]


def _frame_without_line(frame: str | None) -> str | None:
    """``file.py function`` of a ``path/file.py:line function`` frame: an edit elsewhere in the
    file moves the line of the same bug, and the path differs between a cold start (absolute), a
    warm one (as typed) and the nodes' checkouts."""
    if not frame:
        return None
    location, _, function = frame.rpartition(" ")
    path = location.rpartition(":")[0] or location
    return f"{os.path.basename(path)} {function}".strip()


@dataclass(frozen=True)
class Fingerprint:
    """What failed, in a form two failures of one cause share.

    Attributes:
        kind: ``crash``, ``hang``, ``stopped`` (found through another rank's timeout), ``lost``
            (a node that sent no report) or ``left`` (a node that left the job on request).
        what: The normalised cause (exception type and message, hang kind and section, signal).
        where: The innermost user frame (``file.py function``), or the node for a lost node.
    """

    kind: str
    what: str
    where: str | None = None

    @property
    def digest(self) -> str:
        """12 hex digits that name the fingerprint in records and reports."""
        text = "\x1f".join((self.kind, self.what, self.where or ""))
        return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]

    def describe(self) -> str:
        """One phrase for the log: ``crash: exit code N: ValueError: bad shard N at train.py step``."""
        return f"{self.kind}: {self.what}" + (f" at {self.where}" if self.where else "")


def fingerprint(root: RankState) -> Fingerprint:
    """The fingerprint of a failed cycle, from its root rank (as :func:`launcher.decision.culprit.choose_root`
    chose it)."""
    if root.outcome == culprit.LOST:
        # A lost node: which node, not what its ranks were doing (nothing was reported).
        return Fingerprint(culprit.LOST, "node sent no report", root.node or None)
    if root.outcome == culprit.LEFT:
        # A node that left on request: which node (its request's text holds ranks and pids).
        return Fingerprint(culprit.LEFT, "node left the job on request", root.node or None)
    frame = innermost_user_frame(list(root.stack_frames)) if root.stack_frames else None
    return Fingerprint(root.outcome, normalise(root.cause), _frame_without_line(frame))


def failed_before_first_step(root: RankState) -> bool:
    """Whether a cycle's root raised its own exception before it made its first step.

    True for a crash whose cause carries the rank's exception (``exit code 1: ValueError: ...``)
    by a rank whose monitor saw no work from it: it never connected, or it connected but announced
    no step, sent no heartbeat and used no section. Such a failure repeats after a restart as
    surely as one at step 30 000 (a setup error: Lightning's ``devices`` against the world size, a
    missing file). A hang, a signal (an OOM kill, a preemption) or a bare exit code before the
    first step may be transient (a slow file system, a busy node) and gives False: a restart may
    help. Made from the root's :class:`~launcher.decision.culprit.RankState`, so every node decides alike.
    """
    if root.outcome != culprit.CRASH or not _OWN_ERROR.match(root.cause):
        return False
    progress = root.progress
    if progress is None:  # never connected to its monitor
        return True
    return progress.step is None and not progress.heartbeats and progress.section_since is None


OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU"})
"""Signals another process sends (the OOM killer, an operator, the scheduler's preemption or time
limit); a fault of the rank's own code raises SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT instead."""
_SIGNAL_CAUSE = re.compile(r"^signal (\w+)$")
_BARE_EXIT = re.compile(r"^exit code (\d+)$")


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def killed_from_outside(root: RankState) -> bool:
    """Whether a cycle's root died by a signal from outside, with nothing of its own to tell why.

    True for a crash whose cause is ``signal SIGKILL`` (or SIGTERM, SIGINT, SIGHUP, SIGQUIT,
    SIGUSR1, SIGUSR2, SIGXCPU: :data:`OUTSIDE_SIGNALS`), or a bare exit code 128 + one of them (a
    rank under a shell that was killed), when the rank left no exception (the cause has no
    ``: Type: message``) and its stacks hold no frame of the user's code. Such a death says who
    was killed, not what failed: the OOM killer acting for another tenant, an operator or a
    preemption kill at steps 25 and 23 is not a bug that a restart cannot fix. The crash-loop
    guard never counts it as a repeat (``--max-restarts`` bounds it). A rank's own fault signal
    (SIGSEGV, SIGABRT, ...) at the same step is fingerprinted as before.
    """
    if root.outcome != culprit.CRASH:
        return False
    by_signal, bare_exit = _SIGNAL_CAUSE.match(root.cause), _BARE_EXIT.match(root.cause)
    if by_signal is not None:
        name: str | None = by_signal.group(1)
    elif bare_exit is not None and int(bare_exit.group(1)) > 128:
        name = _signal_name(int(bare_exit.group(1)) - 128)
    else:
        return False
    if name not in OUTSIDE_SIGNALS:
        return False
    return not (root.stack_frames and innermost_user_frame(list(root.stack_frames)))


@dataclass(frozen=True)
class CycleFailure:
    """One failed cycle as the guard sees it.

    Attributes:
        cycle: The cycle's index.
        fingerprint: Its root's fingerprint.
        step: The root rank's last step (``set_step`` or the callbacks' step), None if unknown.
        node: The root's node (a name every node gives it alike, e.g. ``node2 (group rank 1)``),
            None if unknown (such a run never makes a node leave).
        before_first_step: The root raised before its first step (:func:`failed_before_first_step`).
        from_outside: The root was killed from outside (:func:`killed_from_outside`): never a repeat.
    """

    cycle: int
    fingerprint: Fingerprint
    step: int | None
    node: str | None = None
    before_first_step: bool = False
    from_outside: bool = False


@dataclass(frozen=True)
class CrashLoopVerdict:
    """The guard's answer after a failed cycle.

    Attributes:
        stop: True when the restarts must stop: the failure repeats without progress.
        repeats: The consecutive failed cycles, oldest first, that share the fingerprint with no
            progress between them (just the last one when it does not repeat).
        text: The sentence the launcher logs and records when it stops or makes a node leave.
        exclude: Instead of a stop: the node (as in :attr:`CycleFailure.node`) that leaves the
            job, every failure of the run having had its root there; the others restart without it.
    """

    stop: bool
    repeats: tuple[CycleFailure, ...]
    text: str = ""
    exclude: str | None = None


class CrashLoopGuard:
    """Decides, after each failed cycle, whether the failure repeats without progress.

    Args:
        max_cycles: Consecutive failed cycles with one fingerprint and no progress that stop the
            restarts (0: never stop for this reason).
        min_progress_steps: How far the root's step must pass the previous failure's step to be
            progress.

    A cycle whose step is unknown (a script that never reports a step) neither counts as a repeat
    nor as progress: without a step a crash loop is bounded by ``--max-restarts`` alone, and a
    transient failure is never taken for a repeat. Nor does a cycle whose root was killed from
    outside (:attr:`CycleFailure.from_outside`: a SIGKILL or SIGTERM and no exception of its own)
    count: two kills of another process's making are not one bug, whatever their steps. The
    exception: cycles whose root raised its own exception before its first step
    (:attr:`CycleFailure.before_first_step`) made no step to compare, and with one fingerprint
    they repeat (a setup error fails every restart alike).
    """

    def __init__(self, max_cycles: int = DEFAULT_MAX_NO_PROGRESS_CYCLES,
                 min_progress_steps: int = DEFAULT_MIN_PROGRESS_STEPS) -> None:
        if max_cycles < 0:
            raise ValueError(f"max_no_progress_cycles must be >= 0, got {max_cycles}")
        if min_progress_steps < 1:
            raise ValueError(f"min_progress_iterations must be >= 1, got {min_progress_steps}")
        self.max_cycles = max_cycles
        self.min_progress_steps = min_progress_steps
        self._run: list[CycleFailure] = []
        self._left: dict[Fingerprint, CycleFailure] = {}  # fingerprint -> the failure that made its node leave

    @property
    def repeats(self) -> Sequence[CycleFailure]:
        """The current run of repeated failures, oldest first."""
        return tuple(self._run)

    def on_failure(self, failure: CycleFailure, can_lose_a_node: bool = False) -> CrashLoopVerdict:
        """Note a failed cycle and say whether to stop restarting, or which node must leave.

        Args:
            failure: The failed cycle.
            can_lose_a_node: The job can go on with one node fewer (the rendezvous allows it).

        Returns:
            A stop when the failure repeats without progress, unless every failure of the run had
            its root on one node, this fingerprint made no node leave before and
            ``can_lose_a_node``: then :attr:`CrashLoopVerdict.exclude` names that node (no stop). The run
            goes on after that: the next repeat without progress stops (another node, a bug).
        """
        last = self._run[-1] if self._run else None
        if last is not None and self._repeats(last, failure):
            self._run.append(failure)
        else:
            self._run = [failure]
        run = tuple(self._run)
        if self.max_cycles == 0 or len(run) < self.max_cycles:
            return CrashLoopVerdict(False, run)
        left = self._left.get(failure.fingerprint)
        if left is not None:
            return CrashLoopVerdict(True, run, self._text(run, left))
        nodes = {f.node for f in run}
        if can_lose_a_node and len(nodes) == 1 and failure.node is not None:
            self._left[failure.fingerprint] = failure
            return CrashLoopVerdict(False, run, self._exclusion_text(run), exclude=failure.node)
        return CrashLoopVerdict(True, run, self._text(run))

    def on_progress(self) -> None:
        """Forget the run: the workers got past where they failed (a cycle that succeeded)."""
        self._run = []

    def _repeats(self, last: CycleFailure, new: CycleFailure) -> bool:
        if new.fingerprint != last.fingerprint or new.from_outside or last.from_outside:
            return False
        if new.before_first_step and last.before_first_step:
            return True  # the same error before any step: nothing moved on
        if new.step is None or last.step is None:
            return False
        return new.step < last.step + self.min_progress_steps

    @staticmethod
    def _repeated(run: tuple[CycleFailure, ...]) -> str:
        cycles = ", ".join(str(f.cycle) for f in run)
        steps = sorted({f.step for f in run if f.step is not None})
        if not steps:  # every cycle of the run failed before its first step
            at = "before the first step of each"
        else:
            at = f"at step {steps[0]}" if len(steps) == 1 else f"at steps {steps[0]}-{steps[-1]}"
            at += " without progress"
        return (f"the same failure ({run[-1].fingerprint.describe()}) ended cycles {cycles} {at} "
                f"(fingerprint {run[-1].fingerprint.digest})")

    def _text(self, run: tuple[CycleFailure, ...], left: CycleFailure | None = None) -> str:
        why = ""
        if left is not None:
            where = f"node {run[-1].node}" if run[-1].node else "a node not known"
            why = (f"; node {left.node} left the job for it after cycle {left.cycle} and it failed again on "
                   f"{where}: a bug, not a node")
        return (f"{self._repeated(run)}{why}: a restart will not fix it; "
                f"not restarting (--ft-max-no-progress-cycles {self.max_cycles})")

    def _exclusion_text(self, run: tuple[CycleFailure, ...]) -> str:
        node = run[-1].node
        return (f"{self._repeated(run)}, each time with its root on node {node}: a fault of that node, not of "
                f"the code; node {node} leaves the job and the others restart without it "
                f"(--ft-max-no-progress-cycles {self.max_cycles})")
