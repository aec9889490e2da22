"""The messages between a rank monitor and its launcher, one dataclass each.

The monitor builds them (:mod:`ft_core.monitor.server`, :mod:`ft_core.monitor.session`) and sends
``to_wire()``; the launcher's link decodes what it receives with :func:`decode`
(:mod:`ft_core.monitor.link`), and from there on a hang report is a :class:`RankHang` through
:mod:`launcher.node.monitors`, :mod:`launcher.decision.incident`, :mod:`launcher.decision.failures` and
:mod:`launcher.decision.culprit` (the agent, :mod:`launcher.agent`, tells the kinds apart with
``isinstance``). The JSON keys are the ones the protocol always had (see
:mod:`ft_core.wire.protocol`), plus ``schema`` (:data:`SCHEMA_VERSION`); a reader of an older or
newer message takes defaults for what it lacks and ignores what it does not know
(:mod:`ft_core.wire.typed`).

Standard library only: the rank monitor imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ft_core.wire import protocol, typed
from ft_core.wire.typed import MalformedError, meta

SCHEMA_VERSION = 1
"""Version of the messages' fields; sent as ``schema`` in every message built here."""
SCHEMA_KEY = "schema"

M = TypeVar("M", bound="Message")


class UnknownMessageError(MalformedError):
    """A message whose ``type`` this side does not know (a newer peer, or garbage)."""


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of every message: ``TYPE`` is its ``"type"`` on the wire."""

    TYPE: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent on the socket: ``type``, the fields, ``schema``."""
        return {"type": self.TYPE, **typed.to_fields(self), SCHEMA_KEY: SCHEMA_VERSION}

    @classmethod
    def from_wire(cls: type[M], data: Mapping[str, Any]) -> M:
        """The message in ``data`` (missing optional fields take their defaults).

        Raises:
            MalformedError: A required field is missing or of the wrong type.
        """
        return typed.from_fields(cls, data)


# ---------------------------------------------------------------------- parts


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What a rank last did, as its monitor saw it (times are epoch seconds).

    Attributes:
        last_progress_at: The last heartbeat or section open/close (the connection if none).
        open_section: The most recently opened section still open.
        step: What the front end announced with ``set_step`` (None if it never did).
        heartbeats: Heartbeats so far.
        section_since: When the open section opened, or when the rank left the last section
            (None for a rank that never used sections).
        stopped: The process is stopped (e.g. by SIGSTOP).
    """

    last_progress_at: float | None = None
    open_section: str | None = None
    step: int | None = None
    heartbeats: int | None = None
    section_since: float | None = None
    stopped: bool = False

    def to_wire(self) -> dict[str, Any]:
        return typed.to_fields(self)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Progress:
        return typed.from_fields(cls, data)


@dataclass(frozen=True, kw_only=True)
class StackSummary:
    """A rank's stacks as its monitor took them (see :func:`ft_core.wire.stacks.capture`).

    Attributes:
        stack_file: Where all its threads' stacks were written, if they were.
        stack_frames: The main thread's innermost frames, ``file:line function``.
        stack_error: Why there are none.
        stack_method: How they were taken (py-spy, the rank's faulthandler...).
        stack_seconds: How long it took.
    """

    stack_file: str | None = None
    stack_frames: list[str] = field(default_factory=list)
    stack_error: str | None = None
    stack_method: str | None = field(default=None, metadata=meta(omit_none=True))
    stack_seconds: float | None = field(default=None, metadata=meta(omit_none=True))


# ---------------------------------------------------------------------- monitor -> launcher


@dataclass(frozen=True, kw_only=True)
class RankHang(Message):
    """``rank_hang``: a deadline of the rank passed; sent before the monitor signals it.

    Attributes:
        pid: The hung rank's pid.
        rank, local_rank, world_size, hostname: What the rank said at ``init`` (when plausible).
        node: The monitor's host name.
        kind: A :class:`~ft_core.monitor.deadlines.HangKind` value.
        section: The section whose timeout passed, if any.
        elapsed: Seconds since the deadline's start.
        timeout: The timeout that passed (seconds).
        cause: The sentence, e.g. ``hang: no heartbeat for 2.00 s > timeout 2.00 s``.
        signal: The termination signal about to be sent (its name).
        detected_at: Epoch seconds of the detection.
        heartbeats: Heartbeats so far.
        progress: The rank's last progress.
        stacks: Its stacks, taken before the signal (flattened into the message).
        save_timeout: The monitor asks the rank to save its just-in-time state before the signal,
            waiting this long at most (None: it does not).
    """

    TYPE: ClassVar[str] = protocol.MSG_RANK_HANG

    pid: int
    rank: int | None = field(default=None, metadata=meta(omit_none=True))
    local_rank: int | None = field(default=None, metadata=meta(omit_none=True))
    world_size: int | None = field(default=None, metadata=meta(omit_none=True))
    hostname: str | None = field(default=None, metadata=meta(omit_none=True))
    node: str = ""
    kind: str
    section: str | None = None
    elapsed: float
    timeout: float
    cause: str
    signal: str
    detected_at: float
    heartbeats: int | None = None
    progress: Progress | None = None
    stacks: StackSummary | None = field(default=None, metadata=meta(flatten=True))
    save_timeout: float | None = field(default=None, metadata=meta(omit_none=True))


@dataclass(frozen=True, kw_only=True)
class RankConnected(Message):
    """``rank_connected``: a rank attached to the monitor (what it said at ``init``)."""

    TYPE: ClassVar[str] = protocol.MSG_RANK_CONNECTED

    pid: int
    rank: int | None = field(default=None, metadata=meta(omit_none=True))
    local_rank: int | None = field(default=None, metadata=meta(omit_none=True))
    world_size: int | None = field(default=None, metadata=meta(omit_none=True))
    hostname: str | None = field(default=None, metadata=meta(omit_none=True))


@dataclass(frozen=True, kw_only=True)
class RankEscalatedMessage(Message):
    """``rank_escalated``: a hung rank outlived its termination signal by ``after`` seconds and
    its monitor sent ``signal`` (SIGKILL) to its process group."""

    TYPE: ClassVar[str] = protocol.MSG_RANK_ESCALATED

    pid: int
    rank: int | None = None
    local_rank: int | None = None
    signal: str = "SIGKILL"
    after: float | None = None


@dataclass(frozen=True, kw_only=True)
class RankFinished(Message):
    """``rank_finished``: the rank ended its training cleanly (its front end said so when it shut
    monitoring down); what the process does from now on is its interpreter's teardown. Sent
    before the monitor answers the rank, so it reaches the launcher before the rank can exit.

    After a graceful stop, ``stop_step`` (the step as the user counts it), ``stop_run_steps``
    (training steps of the rank's run) and ``stop_signal`` say where and why it stopped."""

    TYPE: ClassVar[str] = protocol.MSG_RANK_FINISHED

    pid: int
    rank: int | None = field(default=None, metadata=meta(omit_none=True))
    local_rank: int | None = field(default=None, metadata=meta(omit_none=True))
    stop_step: int | None = field(default=None, metadata=meta(omit_none=True))
    stop_run_steps: int | None = field(default=None, metadata=meta(omit_none=True))
    stop_signal: str | None = field(default=None, metadata=meta(omit_none=True))


RESUME_SOURCES = ("jit", "jit_shared", "checkpoint", "scratch")
"""Where a restarted rank's state came from: the survivors' just-in-time state, the copy of it a
previous job left in the checkpoint directory (a requeued job), a periodic checkpoint, or nothing
(training from its start)."""
_MAX_STEP = 2**63 - 1


@dataclass(frozen=True, kw_only=True)
class RankResumed(Message):
    """``rank_resumed``: the rank restored its training state and continues after ``step`` (the
    completed step it restored; 0 from scratch), from ``source`` (one of :data:`RESUME_SOURCES`).
    Relayed from the rank's ``resumed`` message; ``ft_report`` compares it with the failure's step."""

    TYPE: ClassVar[str] = protocol.MSG_RANK_RESUMED

    pid: int
    rank: int | None = field(default=None, metadata=meta(omit_none=True))
    local_rank: int | None = field(default=None, metadata=meta(omit_none=True))
    step: int
    source: str


def resumed_fields(message: Mapping[str, Any]) -> tuple[int, str]:
    """The ``step`` and ``source`` of a rank's ``resumed`` message.

    Raises:
        ValueError: ``step`` is not an int from 0 to 2**63-1 or ``source`` not one of
            :data:`RESUME_SOURCES` (the rank gets the error as its reply).
    """
    step, source = message.get("step"), message.get("source")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= _MAX_STEP:
        raise ValueError(f"'step' must be an int from 0 to 2**63-1, got {step!r:.40}")
    if source not in RESUME_SOURCES:
        raise ValueError(f"'source' must be one of {', '.join(RESUME_SOURCES)}, got {source!r:.40}")
    return step, source


@dataclass(frozen=True, kw_only=True)
class Pong(Message):
    """``pong``: the answer to ``ping``."""

    TYPE: ClassVar[str] = protocol.MSG_PONG


@dataclass(frozen=True, kw_only=True)
class ProgressReport(Message):
    """``progress_report``: the answer to ``progress_query``.

    Attributes:
        rank, local_rank, pid: The attached rank, else the last one that detached (all None if
            none ever attached).
        connected: Whether that rank is still attached.
        progress: Its last progress.
        disconnected_at: For a detached rank, when the monitor saw it go (epoch seconds).
        state_bytes: The size of its just-in-time state, when it opened a state channel.
    """

    TYPE: ClassVar[str] = protocol.MSG_PROGRESS_REPORT

    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    connected: bool = False
    progress: Progress | None = None
    disconnected_at: float | None = field(default=None, metadata=meta(omit_none=True))
    state_bytes: int | None = field(default=None, metadata=meta(omit_none=True))


@dataclass(frozen=True, kw_only=True)
class StacksCaptured(Message):
    """``stacks_captured``: the answer to ``capture_stacks`` (the stacks flattened in)."""

    TYPE: ClassVar[str] = protocol.MSG_STACKS_CAPTURED

    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    stacks: StackSummary = field(default_factory=StackSummary, metadata=meta(flatten=True))


@dataclass(frozen=True, kw_only=True)
class StateSaved(Message):
    """``state_saved``: the answer to ``save_state`` (the rank's, relayed by its monitor).

    Attributes:
        ok: A consistent state was saved.
        step: Its completed step (-1 if unknown).
        path: The payload (node-local state directory).
        bytes: The payload's size.
        seconds: How long the save took.
        reason: Why nothing was saved.
        source: ``exception`` or ``blocked``.
        rank, local_rank: The rank that answered (None if no rank could be asked).
        approx_bytes: The size the rank announced for its state (0 if unknown).
        cycle: The cycle of the request answered.
    """

    TYPE: ClassVar[str] = protocol.MSG_STATE_SAVED

    ok: bool = False
    step: int = -1
    path: str = ""
    bytes: int = 0
    seconds: float = 0.0
    reason: str = ""
    source: str = ""
    rank: int | None = None
    local_rank: int | None = None
    approx_bytes: int = 0
    cycle: int | None = None


@dataclass(frozen=True, kw_only=True)
class Ok(Message):
    """``ok``: a request was accepted."""

    TYPE: ClassVar[str] = protocol.MSG_OK


@dataclass(frozen=True, kw_only=True)
class Error(Message):
    """``error``: a request was refused, and why."""

    TYPE: ClassVar[str] = protocol.MSG_ERROR

    error: str = ""


@dataclass(frozen=True, kw_only=True)
class MonitorLost(Message):
    """``monitor_lost``: not sent by a monitor; the launcher's pool adds it when a link breaks."""

    TYPE: ClassVar[str] = protocol.MSG_MONITOR_LOST

    exit_code: int | None = None
    monitor_pid: int | None = None


# ---------------------------------------------------------------------- launcher -> monitor


@dataclass(frozen=True, kw_only=True)
class LauncherHello(Message):
    """``launcher_hello``: the first message of the launcher's link."""

    TYPE: ClassVar[str] = protocol.MSG_LAUNCHER_HELLO


@dataclass(frozen=True, kw_only=True)
class LauncherBye(Message):
    """``launcher_bye``: the launcher leaves; the monitor exits without touching workers."""

    TYPE: ClassVar[str] = protocol.MSG_LAUNCHER_BYE


@dataclass(frozen=True, kw_only=True)
class WorkerStarted(Message):
    """``worker_started``: this cycle's worker process (stopped by the monitor if the launcher dies)."""

    TYPE: ClassVar[str] = protocol.MSG_WORKER_STARTED

    pid: int
    cycle: int | None = None
    rank: int | None = None


@dataclass(frozen=True, kw_only=True)
class Ping(Message):
    """``ping``: the liveness probe (answer: :class:`Pong`)."""

    TYPE: ClassVar[str] = protocol.MSG_PING


@dataclass(frozen=True, kw_only=True)
class ProgressQuery(Message):
    """``progress_query``: what did the rank last do (answer: :class:`ProgressReport`)."""

    TYPE: ClassVar[str] = protocol.MSG_PROGRESS_QUERY


@dataclass(frozen=True, kw_only=True)
class CaptureStacks(Message):
    """``capture_stacks``: take the rank's stacks now (answer: :class:`StacksCaptured`)."""

    TYPE: ClassVar[str] = protocol.MSG_CAPTURE_STACKS

    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class SaveState(Message):
    """``save_state``: save the rank's just-in-time state now (answer: :class:`StateSaved`).

    Attributes:
        cycle: The launcher cycle that failed.
        reason: Why (for the rank's log).
        timeout: Seconds the asker waits for the answer.
    """

    TYPE: ClassVar[str] = protocol.MSG_SAVE_STATE

    cycle: int | None = None
    reason: str = ""
    timeout: float = 10.0


MESSAGES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (
        RankHang, RankConnected, RankEscalatedMessage, RankFinished, Pong, ProgressReport, StacksCaptured, Ok, Error,
        MonitorLost, StateSaved, RankResumed,
        LauncherHello, LauncherBye, WorkerStarted, Ping, ProgressQuery, CaptureStacks, SaveState,
    )
}
"""Every message between a monitor and its launcher, by ``type``."""

REPLIES: dict[type[Message], type[Message]] = {Ping: Pong, ProgressQuery: ProgressReport, CaptureStacks: StacksCaptured,
                                                    SaveState: StateSaved}
"""The answer a monitor gives to each question of the launcher."""


def decode(data: Mapping[str, Any]) -> Message:
    """The typed message in a decoded frame.

    Raises:
        UnknownMessageError: Its ``type`` is not one of :data:`MESSAGES`.
        MalformedError: A required field is missing or of the wrong type.
    """
    kind = data.get("type")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownMessageError(f"unknown message type {kind!r}")
    return cls.from_wire(data)


def with_stacks(hang: RankHang, stacks: StackSummary) -> RankHang:
    """``hang`` with its stacks added (the monitor takes them after building the report)."""
    return dataclasses.replace(hang, stacks=stacks)
