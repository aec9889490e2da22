"""The culprit, not the victims: which rank of a failed cycle is the root, which are collateral.

When one rank freezes or dies, the others block in a collective and miss their own deadlines,
or fail with the collective's error. Every rank involved in a failed cycle is described by a
:class:`RankState` (what happened to it, when, and its last progress as its monitor saw it); the
states of all nodes are compared (each node publishes its own through the rendezvous store) and
:func:`choose_root` names one root:

0. A rank whose node left the job on request (``ExcludeThisNode``: a rank's request, or the
   straggler detector's replace action) is the root when no crash or hang came before that node's
   leaving and no rank made progress after it (each allowing :data:`HOLDING_UP_SKEW` for the
   nodes' clocks): the leaving node publishes its ranks as :data:`LEFT` before it kills them, and
   its peers' collectives fail because of that. A rank that progressed after the leaving was not
   blocked by it: a workload without collectives can run on in the same round and fail later.
   Of several leavings, the earliest that qualifies (under ``min-healthy`` a node may leave, the
   others train on, and a later leaving takes the round below the minimum).
1. A crash (a non-zero exit or a signal the launcher did not send) observed before any hang was
   detected is the root, with its own time: the earliest crash. A survivor whose timeout fires
   during the grace after a crash is collateral.
2. Otherwise, among the hung ranks, the one that stopped progressing first: a stopped process
   (SIGSTOP) first, then the lowest step (when every hung rank announced its step with
   ``set_step``), then the rank least visibly waiting for its peers (:func:`peer_wait_level`:
   in its own code before a rank innermost in autograd's backward or DDP's code, where
   ``DistributedDataParallel`` all-reduces gradients out of Python's sight, before a rank in a
   ``torch.distributed`` collective), then the earliest last progress (heartbeat or section
   change), then the earliest detection. Ranks in lockstep time out together (a DDP rank that
   sleeps inside a step and its peer waiting in ``loss.backward()`` share the step and their
   last progress within milliseconds), so the stacks must decide before the clocks do.
3. But when that hung rank waits for its peers (a collective, or backward / DDP code) and a rank
   that was still running when the failure began (its own timeout not yet passed, e.g. a longer
   out-of-section timeout) waits less visibly (lower :func:`peer_wait_level`) and made no
   progress since before the hung rank's last progress, that rank is the root: the hung one was
   waiting for it ("since before" allows a skew of 1 s plus 5 % of the hung rank's idle time:
   ranks in lockstep leave a collective a few milliseconds apart). This needs both ranks'
   stacks; without them rule 2 stands.
4. But when no rank crashed, no rank's process was stopped, rule 2's rank and every other rank
   whose stack is known wait for their peers (in a collective, or innermost in autograd's
   backward or DDP's code, where ``DistributedDataParallel`` all-reduces gradients and
   synchronises buffers out of Python's sight; rule 3 found no rank holding them up), and one
   or more nodes of the rendezvous group sent no view within the wait (their launchers could
   not reach the store, or the nodes are gone: powered off, crashed, cut off by the network),
   the root is the missing node, not a rank that reported: everyone who reported was waiting
   for someone, and the only ranks not accounted for are the missing node's. The root is then a
   synthetic :class:`RankState` (:func:`lost_root`: rank None, outcome :data:`LOST`, the node's
   host name and group rank; several missing nodes: the first by group rank, the others named
   in its cause). Without the candidate's stack rule 2 stands: nothing says it was waiting.
5. Before rule 1: when one or more nodes of the rendezvous group sent no view within the wait
   and every rank that crashed failed in its communication with a peer (its error says a peer's
   connection was closed, reset or refused, a collective timed out or was aborted:
   :func:`failed_with_a_peer`; or its traceback is inside a ``torch.distributed`` collective),
   no process was stopped and no hung rank is in its own code, the root is the missing node
   (:func:`lost_root`), not the first survivor whose collective broke: a node that crashed
   closes its sockets, so its peers' collectives fail at once with its address in the error
   (gloo: ``Read error [198.51.100.13]:38592: Connection reset by peer``), while its launcher,
   gone with it, publishes nothing. A crash of the user's own code (any other error, a signal)
   is still the root by rule 1.
6. Last: when no rank crashed or hung (every reported rank was still running) and one or more
   nodes that sent no view were dropped from the rendezvous round by torch (``dropped``: their
   launchers' keep-alive lapsed), the root is the dropped node (:func:`lost_root`). This is how a
   node that froze, lost power or was cut off shows when a spare waits: its peers' ranks block in
   a collective without an error, and torch restarts them for the waiting spare before any of
   their timeouts passes. Only the rendezvous's own verdict counts here: a node that is merely
   slow to publish its view is not dropped.

Every other rank is collateral. Pure functions, no I/O; the texts of the launcher's failure
line come from here too (:func:`describe_root`, :func:`waiting_for`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ft_core.wire.messages import Progress
from ft_core.wire.typed import MalformedError

HANG = "hang"
CRASH = "crash"
STOPPED = "stopped"
"""Stopped by the launcher (or torch) because of the failure, or still running when it began."""
LOST = "lost"
"""A node of the rendezvous group that sent no view of the failure (rules 4 and 5): not a rank."""
LEFT = "left"
"""A rank whose node left the job on request and killed it (rule 0)."""
ROOT = "root"
COLLATERAL = "collateral"

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv", "wait",
})
"""Function names of ``torch.distributed`` whose presence in a rank's stack means it waits for
its peers."""


HOLDING_UP_SKEW = 1.0
HOLDING_UP_SKEW_FRACTION = 0.05
"""Rule 3's allowance (seconds, and a fraction of the hung rank's idle time) for a running rank's
last progress to come after the hung rank's and still count as "since before"."""


@dataclass(frozen=True)
class LostNode:
    """A node of the rendezvous group that published no view of a failed cycle within the wait.

    Attributes:
        group_rank: Its rank in the rendezvous round.
        host: Its host name as it published it after the rendezvous; None if it cannot be read.
    """

    group_rank: int
    host: str | None = None
    addresses: tuple[str, ...] = field(default=(), compare=False)
    """Its host's network addresses as this node resolved them (rule 5 matches them against the
    peer addresses the failed collectives' errors name); empty when unknown."""

    @property
    def label(self) -> str:
        """``node2 (group rank 1)``, or ``group rank 1 (host unknown)``."""
        if self.host:
            return f"{self.host} (group rank {self.group_rank})"
        return f"group rank {self.group_rank} (host unknown)"


@dataclass(frozen=True)
class RankState:
    """One rank of a failed cycle, as its node saw it (JSON-safe: nodes exchange them).

    Attributes:
        rank: Global rank (None if unknown).
        local_rank: Local rank on its node.
        node: Host name of its node.
        group_rank: Its node's rank in the rendezvous (tells nodes apart on one host).
        pid: The worker's pid.
        outcome: :data:`HANG`, :data:`CRASH`, :data:`STOPPED` or :data:`LEFT`.
        cause: ``hang: ...``, ``exit code 1``, ``signal SIGKILL`` ...
        event_at: Epoch seconds of the hang detection or the crash (None for :data:`STOPPED`).
        progress: Its monitor's progress (as in ``rank_hang``), or None; a mapping given here (a
            progress in wire form) is read as a :class:`~ft_core.wire.messages.Progress`.
        stack_frames: Its main thread's innermost frames (``"file:line function"``), if taken.
        stack_file: Where all its threads' stacks were written, if they were.
        lost_nodes: For a :data:`LOST` root (rules 4 and 5): every node that sent no view, the root's
            own first.
    """

    rank: int | None
    local_rank: int
    node: str
    group_rank: int | None
    pid: int | None
    outcome: str
    cause: str
    event_at: float | None = None
    progress: Progress | None = None
    stack_frames: Sequence[str] = field(default_factory=tuple)
    stack_file: str | None = None
    lost_nodes: tuple[LostNode, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.progress, Mapping):
            object.__setattr__(self, "progress", _progress(self.progress))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["stack_frames"] = list(self.stack_frames)
        data["progress"] = self.progress.to_wire() if self.progress is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankState | None:
        """A state published by another node; None if it is not one."""
        try:
            frames = data.get("stack_frames") or ()
            progress = data.get("progress")
            return cls(
                rank=_int_or_none(data.get("rank")), local_rank=int(data["local_rank"]), node=str(data["node"]),
                group_rank=_int_or_none(data.get("group_rank")), pid=_int_or_none(data.get("pid")),
                outcome=str(data["outcome"]), cause=str(data.get("cause") or ""),
                event_at=_float_or_none(data.get("event_at")),
                progress=_progress(progress) if isinstance(progress, Mapping) else None,
                stack_frames=tuple(str(f) for f in frames if isinstance(f, str))[:20],
                stack_file=data.get("stack_file") if isinstance(data.get("stack_file"), str) else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def same_rank(self, other: RankState) -> bool:
        return (self.group_rank, self.local_rank, self.node) == (other.group_rank, other.local_rank, other.node)

    @property
    def step(self) -> int | None:
        return self.progress.step if self.progress is not None else None

    @property
    def stopped(self) -> bool:
        return self.progress is not None and self.progress.stopped

    @property
    def last_progress_at(self) -> float:
        value = self.progress.last_progress_at if self.progress is not None else None
        return value if value is not None else math.inf


def waiting_in_collective(frames: Iterable[str]) -> bool:
    """True if a ``torch.distributed`` collective (or a wait on one) is in the frames."""
    for frame in frames:
        location, _, function = frame.rpartition(" ")
        if "torch/distributed/" in location and function.rpartition(".")[2] in COLLECTIVES:
            return True
    return False


PEER_WAIT_LOCATIONS = ("torch/autograd/", "torch/nn/parallel/distributed.py")
"""Where a rank's innermost frame shows it waiting for its peers without a ``torch.distributed``
frame: under ``DistributedDataParallel`` the gradient all-reduce runs inside autograd's backward
(C++ hooks, invisible to Python) and buffers are synchronised inside DDP's forward."""


def waiting_for_peers(frames: Sequence[str]) -> bool:
    """Rule 4's test: in a collective, or innermost in autograd's backward or DDP's own code."""
    return peer_wait_level(frames) > 0


IN_OWN_CODE = 0
IN_BACKWARD = 1
IN_COLLECTIVE = 2


def peer_wait_level(frames: Sequence[str]) -> int:
    """How surely a rank's stack (innermost frame first) shows it waiting for its peers.

    Returns:
        :data:`IN_COLLECTIVE` (2) with a ``torch.distributed`` collective in the frames (surely
        waiting); :data:`IN_BACKWARD` (1) with autograd's backward or DDP's own code innermost
        (waiting under ``DistributedDataParallel``, whose gradient all-reduce and buffer
        broadcast run in C++ below these frames; without DDP it may be computing);
        :data:`IN_OWN_CODE` (0) otherwise, also for an unknown stack (nothing says it waits).
    """
    if waiting_in_collective(frames):
        return IN_COLLECTIVE
    location = frames[0].rpartition(" ")[0] if frames else ""
    return IN_BACKWARD if any(part in location for part in PEER_WAIT_LOCATIONS) else IN_OWN_CODE


PEER_FAILURE_TEXTS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
    "no route to host", "remote process exited", "network error", "socket closed", "connection timed out",
    "timed out waiting", "communicator was aborted", "distnetworkerror", "distbackenderror",
)
"""Lower-case fragments of the errors a collective raises when a peer is gone (gloo's
``Connection closed by peer [addr]:port``, ``Read error [addr]:port: Connection reset by peer``,
NCCL's ``remote process exited or there was a network error``, c10d's ``DistNetworkError``)."""


def failed_with_a_peer(state: RankState) -> bool:
    """Rule 5's test: a crash whose error says its communication with a peer broke, or whose
    traceback is inside a ``torch.distributed`` collective (the error came from the collective)."""
    if state.outcome != CRASH:
        return False
    text = state.cause.lower()
    return any(part in text for part in PEER_FAILURE_TEXTS) or waiting_in_collective(state.stack_frames)


LOST_WHILE_WAITING = "every rank that reported was waiting in a collective"
LOST_BROKE_COLLECTIVES = "the collectives of every rank that failed broke with it (a peer's connection lost)"
LOST_DROPPED = ("the rendezvous dropped it from the round (its launcher's keep-alive lapsed) while every rank "
                "that reported was still running")
"""The end of a :data:`LOST` root's cause under rules 4, 5 and 6."""


def choose_root(states: Iterable[RankState], lost: Sequence[LostNode] = (),
                waited: float = 0.0, dropped: Collection[int] = ()) -> RankState | None:
    """The rank that caused the failure (see the module docstring); None if none failed itself.

    Args:
        states: Every rank of the failed cycle that any node reported (this node's and the views
            the other nodes published).
        lost: The nodes of the rendezvous group that published no view within the wait (empty
            when the store could not be read: then nothing is known about them).
        waited: How long this node waited for the views (for the text of rule 4).
        dropped: The group ranks of the nodes torch dropped from the round (rule 6).

    Returns:
        A reported rank; for rules 4 to 6 the :func:`lost_root` of ``lost``; None if nobody failed.
    """
    states = list(states)
    lefts = sorted((s for s in states if s.outcome == LEFT), key=lambda s: (
        s.event_at if s.event_at is not None else math.inf, _rank_key(s)))
    first_failure_at = min((s.event_at for s in states if s.outcome in (CRASH, HANG) and s.event_at is not None),
                           default=math.inf)
    for left in lefts:  # the first leaving that held the others up (an earlier one they outlived is not)
        if (left.event_at is None or left.event_at - HOLDING_UP_SKEW <= first_failure_at) \
                and not _progressed_after(states, left):
            return left
    crashes = sorted((s for s in states if s.outcome == CRASH and s.event_at is not None),
                     key=lambda s: (s.event_at, _rank_key(s)))
    hangs = [s for s in states if s.outcome == HANG]
    if lost and _only_broken_collectives(states):
        named = named_addresses(s.cause for s in crashes)
        return lost_root(lost, waited, LOST_BROKE_COLLECTIVES,
                         first=[n for n in lost if named.intersection(n.addresses)])
    first_hang_at = min((s.event_at for s in hangs if s.event_at is not None), default=math.inf)
    if crashes and crashes[0].event_at <= first_hang_at:
        return crashes[0]
    if hangs:
        use_steps = all(s.step is not None for s in hangs)
        hung = min(hangs, key=lambda s: (
            not s.stopped,
            s.step if use_steps else 0,
            peer_wait_level(s.stack_frames),
            s.last_progress_at,
            s.event_at if s.event_at is not None else math.inf,
            _rank_key(s),
        ))
        holder = _holding_up(states, hung)
        if holder is not None:
            return holder
        if lost and _everyone_waits(states, hung):
            return lost_root(lost, waited)
        return hung
    if crashes:
        return crashes[0]
    gone = [n for n in lost if n.group_rank in dropped]
    if gone and all(s.outcome == STOPPED for s in states):
        return lost_root(lost, waited, LOST_DROPPED, first=gone)
    return None


def _progressed_after(states: Sequence[RankState], left: RankState) -> bool:
    """Rule 0's exception: a rank made progress clearly after the node left (so it was not blocked
    by the leaving: the failure came later, in the same round, for another reason). A rank whose
    progress is unknown says nothing either way."""
    if left.event_at is None:
        return False
    latest = left.event_at + HOLDING_UP_SKEW
    return any(s.outcome != LEFT and math.isfinite(s.last_progress_at) and s.last_progress_at > latest
               for s in states)


def _holding_up(states: Sequence[RankState], hung: RankState) -> RankState | None:
    """Rule 3: a still-running rank, waiting less visibly than the hung rank, that it waits for."""
    hung_level = peer_wait_level(hung.stack_frames)
    if hung.stopped or hung_level == IN_OWN_CODE:
        return None
    # Ranks in lockstep report their last progress within milliseconds of each other (the rank
    # that left the previous collective last may even report a later one), so "since before"
    # allows a skew: 1 s plus 5 % of how long the hung rank had been idle.
    idle = (hung.event_at - hung.last_progress_at) if hung.event_at is not None else 0.0
    latest = hung.last_progress_at + HOLDING_UP_SKEW + HOLDING_UP_SKEW_FRACTION * max(0.0, idle)
    candidates = [
        s for s in states
        if s.outcome == STOPPED and s.stack_frames and peer_wait_level(s.stack_frames) < hung_level
        and math.isfinite(s.last_progress_at) and s.last_progress_at <= latest
    ]
    return min(candidates, key=lambda s: (not s.stopped, s.last_progress_at, _rank_key(s)), default=None)


def _everyone_waits(states: Sequence[RankState], hung: RankState) -> bool:
    """Rule 4's condition: no crash, no stopped process, and every rank whose stack is known
    (rule 2's rank included, which must have one) waits for its peers (:func:`waiting_for_peers`)."""
    if not hung.stack_frames or not waiting_for_peers(hung.stack_frames):
        return False
    return all(
        s.outcome in (HANG, STOPPED) and not s.stopped
        and (not s.stack_frames or waiting_for_peers(s.stack_frames))
        for s in states
    )


def _only_broken_collectives(states: Sequence[RankState]) -> bool:
    """Rule 5's condition: a crash, every crash a failed communication with a peer
    (:func:`failed_with_a_peer`), no stopped process, no hung rank in its own code."""
    crashed = [s for s in states if s.outcome == CRASH]
    if not crashed or not all(failed_with_a_peer(s) for s in crashed):
        return False
    return not any(s.stopped for s in states) and all(
        not s.stack_frames or waiting_for_peers(s.stack_frames) for s in states if s.outcome == HANG)


_PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]{2,45})\]")
"""A peer address as gloo's errors write it: ``[198.51.100.13]:38592``."""


def named_addresses(texts: Iterable[str]) -> set[str]:
    """The peer addresses (``[addr]``) named in errors."""
    return {m.group(1) for text in texts for m in _PEER_ADDRESS.finditer(text)}


def lost_root(lost: Sequence[LostNode], waited: float, why: str = LOST_WHILE_WAITING,
              first: Collection[LostNode] = ()) -> RankState:
    """Rules 4 and 5's root: the first missing node by group rank (of ``first`` if any: those whose
    address the failed collectives named), the others named in its cause (``why``: what the
    reported ranks show, :data:`LOST_WHILE_WAITING` or :data:`LOST_BROKE_COLLECTIVES`)."""
    nodes = tuple(sorted(lost, key=lambda n: (n not in first, n.group_rank)))
    first = nodes[0]
    verb = "sent" if len(nodes) == 1 else "each sent"
    cause = (f"{nodes_text(nodes)} {verb} no report within {waited:.1f} s: lost or cut off from the rendezvous "
             f"store; {why}")
    return RankState(rank=None, local_rank=-1, node=first.host or "", group_rank=first.group_rank, pid=None,
                     outcome=LOST, cause=cause, lost_nodes=nodes)


def nodes_text(nodes: Sequence[LostNode]) -> str:
    """``node node2 (group rank 1)``, ``nodes node2 (group rank 1), node4 (group rank 3)``,
    ``group rank 1 (host unknown)``."""
    labels = [n.label for n in nodes]
    if len(nodes) == 1:
        return f"node {labels[0]}" if nodes[0].host else labels[0]
    return "nodes " + ", ".join(labels)


def _rank_key(state: RankState) -> tuple[int, int]:
    return (state.rank if state.rank is not None else 1 << 30, state.local_rank)


# ---------------------------------------------------------------------- texts


def describe_root(root: RankState, user_frame: str | None = None, seen_at: float | None = None) -> str:
    """What the root rank did, e.g. ``rank 1 froze in step 61 (outside any section for 3.0 s)``.

    ``seen_at``: for a root that was still running (rule 3), when the hang it caused was detected.
    A :data:`LOST` node (rule 4) is described by its cause.
    """
    if root.outcome == LOST:
        return root.cause
    who = f"rank {_rank_text(root)}"
    if root.outcome == LEFT:
        return f"{who} was stopped: {root.cause}"
    step = f" in step {root.step}" if root.step is not None else ""
    where = f" at {user_frame}" if user_frame else ""
    if root.outcome == STOPPED:
        what = "froze (its process was stopped)" if root.stopped else "froze"
        idle = ""
        if seen_at is not None and math.isfinite(root.last_progress_at):
            idle = f" (no progress for {max(0.0, seen_at - root.last_progress_at):.1f} s"
            idle += f", {_open_text(root)}; its own timeout had not passed yet)"
        return f"{who} {what}{step}{idle}{where}"
    if root.outcome == HANG:
        what = "froze (its process was stopped)" if root.stopped else "froze"
        return f"{who} {what}{step}{_how_long(root)}{where}"
    if root.cause.startswith("signal "):
        return f"{who} was killed by {root.cause[len('signal '):]}{step}{where}"
    return f"{who} crashed ({root.cause}){step}{where}"


def _how_long(state: RankState) -> str:
    progress = state.progress or Progress()
    if state.event_at is None:
        return ""
    open_section = progress.open_section
    since = progress.section_since
    if since is not None:
        elapsed = max(0.0, state.event_at - since)
        if open_section:
            return f" (in section {open_section!r} for {elapsed:.1f} s)"
        return f" (outside any section for {elapsed:.1f} s)"
    if math.isfinite(state.last_progress_at):
        return f" (no progress for {max(0.0, state.event_at - state.last_progress_at):.1f} s)"
    return ""


def _open_text(state: RankState) -> str:
    section = state.progress.open_section if state.progress is not None else None
    return f"in section {section!r}" if section else "outside any section"


def collateral_text(collateral: Sequence[RankState]) -> str:
    """``ranks 0, 2 stopped waiting for it`` (empty when there are none)."""
    if not collateral:
        return ""
    ranks = sorted({_rank_text(s) for s in collateral}, key=lambda t: (len(t), t))
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(ranks)} stopped waiting for it"


def waiting_for(root: RankState | None, here: str, here_group: int | None) -> str:
    """How a collateral rank's line names the root: ``rank 1``, ``rank 1 on node b`` or, for a
    lost node (rule 4), ``node b (group rank 1), which sent no report (lost or cut off)``."""
    if root is None:
        return "a failure whose root is unknown"
    if root.outcome == LOST:
        which = "which" if len(root.lost_nodes) == 1 else "which each"
        return f"{nodes_text(root.lost_nodes)}, {which} sent no report (lost or cut off)"
    elsewhere = root.node != here or (root.group_rank is not None and here_group is not None
                                      and root.group_rank != here_group)
    if not elsewhere:
        return f"rank {_rank_text(root)}"
    group = f" (node rank {root.group_rank})" if root.group_rank is not None else ""
    why = f", which was stopped: {root.cause}" if root.outcome == LEFT else ""
    return f"rank {_rank_text(root)} on node {root.node}{group}{why}"


def _rank_text(state: RankState) -> str:
    return "?" if state.rank is None else str(state.rank)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _progress(data: Mapping[str, Any]) -> Progress | None:
    """A progress in wire form (another node's view), or None if it is not one."""
    try:
        return Progress.from_wire(data)
    except MalformedError:
        return None
