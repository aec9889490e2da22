"""The event log's records: one dataclass per kind, written and read by the same class.

Every record of ``ft_events.jsonl`` is one JSON object: ``event`` (its kind), the envelope every
record carries (``time``, ``ts``, ``node``, ``pid``, ``run_id``), the kind's fields and
``schema`` (:data:`SCHEMA_VERSION`; a record without it is version 1). The writers build one
of these classes for every record and pass it to :meth:`launcher.events.log.EventLog.record_event`,
so a field the kind does not have is an error where it is written; the readers (``ft_report``,
the summary, the benchmarks, the auto-resume loop) read them back with :func:`read_events`,
which yields typed records and skips, with one warning per reason, lines that are not JSON,
unknown kinds, records of a newer schema and malformed ones. A record of an older writer that lacks an optional field
reads as the field's default; fields a newer writer added are ignored.

The table of ``docs/launcher.md`` is :func:`schema_table` (a test compares them).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ft_core.wire import typed
from ft_core.wire.typed import DOC, MalformedError, meta

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Version of the records' fields; written as ``schema`` in every record."""
SCHEMA_KEY = "schema"
EVENT_KEY = "event"
ENVELOPE = ("time", "ts", "node", "pid", "run_id")
"""The fields every record carries besides ``event`` and ``schema``."""
STRICT_FIELDS = ENVELOPE + ("cycle",)
"""Fields the readers group records by: a record that holds one of the wrong type is malformed
(for any other field a value of the wrong type reads as the field's default)."""
EPOCH_FIELDS = ("ts", "detected_at", "last_progress_at")
"""Fields that hold epoch seconds: one outside ``[0,`` :data:`MAX_EPOCH` ``]`` makes the record malformed."""
MAX_EPOCH = 253402300799.0
"""9999-12-31 23:59:59 UTC, the last second a ``datetime`` can show."""

R = TypeVar("R", bound="EventRecord")


@dataclass(kw_only=True)
class EventRecord:
    """Base of every record: the envelope. ``EVENT`` is the kind (the ``event`` field).

    Attributes:
        time: ISO 8601 time of the record (UTC, milliseconds).
        ts: The same as epoch seconds.
        node: Host name of the launcher that wrote it.
        pid: That launcher's pid (a few kinds name another process here, see their fields).
        run_id: The launcher's run id (``--rdzv-id``, or the random one).
    """

    EVENT: ClassVar[str] = ""

    time: str | None = None
    ts: float | None = None
    node: str | None = None
    pid: int | None = None
    run_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object of the record as it is written: ``event``, the envelope, the fields,
        ``schema``."""
        return {EVENT_KEY: self.EVENT, **typed.to_fields(self), SCHEMA_KEY: SCHEMA_VERSION}

    @classmethod
    def from_wire(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record in ``data`` (missing optional fields take their defaults).

        Raises:
            MalformedError: A required field is missing or of the wrong type.
        """
        return typed.from_fields(cls, data)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The kind's own fields (not the envelope), in the order they are written."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ENVELOPE or _redeclared(cls, f.name))


def _redeclared(cls: type, name: str) -> bool:
    """Whether a kind declares an envelope field itself (its ``pid`` names another process)."""
    return any(name in vars(klass).get("__annotations__", {}) for klass in cls.__mro__
               if klass is not EventRecord and issubclass(klass, EventRecord))


def _f(default: Any = None, doc: str = "", *, omit_none: bool = False, factory: Any = None,
       written_with: str | None = None) -> Any:
    """A field with a default and a note for the schema table (see :func:`ft_core.wire.typed.meta`)."""
    metadata = meta(doc, omit_none=omit_none, written_with=written_with)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _req(doc: str = "") -> Any:
    """A field every record of the kind must have."""
    return field(metadata=meta(doc))


# ---------------------------------------------------------------------- the kinds


@dataclass(kw_only=True)
class LauncherStart(EventRecord):
    """``launcher_start``: a launcher started (one per node and auto-resume attempt)."""

    EVENT: ClassVar[str] = "launcher_start"

    nnodes: str | None = _f(doc="`MIN:MAX`")
    nproc_per_node: int | None = _f()
    max_restarts: int | None = _f()
    restart_policy: str | None = _f()
    rdzv_backend: str | None = _f()
    rdzv_conf: dict[str, Any] = _f(doc="the rendezvous settings in force, ft_launcher's defaults included",
                                   factory=dict)
    rdzv_poll_interval: float | None = _f(doc="seconds between waiting nodes' store reads; null: torch's")
    config: dict[str, Any] = _f(doc="the effective fault tolerance configuration", factory=dict)
    config_sources: dict[str, Any] = _f(
        doc="field → `default`, `file PATH` or `command line --ft-param-...`", factory=dict)
    entrypoint: str | None = _f()
    event_log_source: str | None = _f()
    attempt: str | int | None = _f(doc="`AUTORESUME_ATTEMPT`")
    sentinel_pid: int | None = _f()


@dataclass(kw_only=True)
class MonitorsStarted(EventRecord):
    """``monitors_started``: the node's rank monitors are up."""

    EVENT: ClassVar[str] = "monitors_started"

    monitor_pids: list[int] = _f(factory=list)


@dataclass(kw_only=True)
class WarmTemplateStarted(EventRecord):
    """``warm_template_started``: the warm-restart template process was started (once the cycle's
    workers are up, or 20 s after they started; or after 10 s of waiting in a rendezvous, as a
    spare does, with ``cycle`` the one it waits for)."""

    EVENT: ClassVar[str] = "warm_template_started"

    cycle: int | None = _f()
    pid: int | None = _f(doc="the template's")


@dataclass(kw_only=True)
class WarmTemplateReady(EventRecord):
    """``warm_template_ready``: the template imported its modules and can fork workers."""

    EVENT: ClassVar[str] = "warm_template_ready"

    cycle: int | None = _f()
    pid: int | None = _f(doc="the template's")
    ready: bool = _f(True)
    failed_preloads: list[Any] = _f(factory=list)
    cuda_initialized: bool | None = _f()


@dataclass(kw_only=True)
class WarmTemplateReplaced(EventRecord):
    """``warm_template_replaced``: the template had died; a new one is started."""

    EVENT: ClassVar[str] = "warm_template_replaced"

    cycle: int | None = _f()
    exit_code: int | None = _f()


@dataclass(kw_only=True)
class CycleStart(EventRecord):
    """``cycle_start``: the node's workers of one cycle were started."""

    EVENT: ClassVar[str] = "cycle_start"

    cycle: int = _req()
    restart_count: int | None = _f()
    group_rank: int | None = _f()
    group_world_size: int | None = _f()
    ranks: dict[str, int | None] = _f(doc="local rank → global rank", factory=dict)
    worker_pids: dict[str, int] = _f(doc="the workers' own pids", factory=dict)
    stand_in_pids: dict[str, int] | None = _f(
        doc="the trampolines torch started, under warm restarts; else null")
    rendezvous_s: float | None = _f()
    spawn_s: float | None = _f()
    since_failure_s: float | None = _f()
    warm_start: bool | None = _f()
    cold_reason: str | None = _f(doc="why the workers started cold (when they did)", omit_none=True)


@dataclass(kw_only=True)
class WorkersReady(EventRecord):
    """``workers_ready``: every rank of the cycle connected its client to its monitor."""

    EVENT: ClassVar[str] = "workers_ready"

    cycle: int | None = _f()
    ready_s: float | None = _f(doc="all ranks connected their clients, seconds after the cycle's start")


@dataclass(kw_only=True)
class WorkersSucceeded(EventRecord):
    """``workers_succeeded``: every worker of the cycle exited 0."""

    EVENT: ClassVar[str] = "workers_succeeded"

    cycle: int | None = _f()


@dataclass(kw_only=True)
class AbortedAtExit(EventRecord):
    """``aborted_at_exit``: a worker ended its training cleanly (its front end told its monitor),
    then aborted at exit (SIGABRT in its interpreter's teardown): finished, not a failure, not
    restarted."""

    EVENT: ClassVar[str] = "aborted_at_exit"

    cycle: int | None = _f()
    local_rank: int | None = _f()
    rank: int | None = _f()
    worker_pid: int | None = _f()
    signal: str | None = _f(doc="`SIGABRT`")


@dataclass(kw_only=True)
class GracefulStopped(EventRecord):
    """``graceful_stop``: a worker left its training in a graceful stop (every rank agreed to stop
    after the same step, on a stop signal) and told its monitor where: one record per rank, so the
    stop steps of every node can be compared (``ft_report`` does)."""

    EVENT: ClassVar[str] = "graceful_stop"

    cycle: int | None = _f()
    local_rank: int | None = _f()
    rank: int | None = _f()
    worker_pid: int | None = _f()
    step: int | None = _f(doc="the step it stopped after, as the user counts it (Lightning's global step, the "
                              "step a loop passed to `on_training_step_start`; else `run_steps`)")
    run_steps: int | None = _f(doc="training steps of the worker's run up to the stop")
    signal: str | None = _f(doc="the stop signal the ranks agreed on (`SIGUSR1`)")


ROLE_ROOT = "root"
ROLE_COLLATERAL = "collateral"
CAUSE_TERMINATED = "terminated"
"""``launcher.decision.failures.KIND_TERMINATED`` (this module imports no torch)."""

_HANG = "for hangs"
_KNOWN = "when known"
_STACKS = "when taken"
_COLLATERAL = "for collateral ranks"


@dataclass(kw_only=True)
class NodeCheck(EventRecord):
    """``node_check``: the node check before a rendezvous (``launcher/node/check.py``) failed, so this
    node did not join; or it passed after a restart."""

    EVENT: ClassVar[str] = "node_check"

    cycle: int | None = _f(doc="the cycle it was checked for")
    passed: bool | None = _f()
    checks: list[dict[str, Any]] = _f(
        doc="each check: `name`, `ok`, `detail`, `seconds`, `skipped`, the command's `output`", factory=list)


@dataclass(kw_only=True)
class Failure(EventRecord):
    """``failure``: a worker of the cycle failed (one record each, the root's first)."""

    EVENT: ClassVar[str] = "failure"

    cycle: int | None = _req()
    rank: int | None = _f()
    local_rank: int | None = _f()
    worker_pid: int | None = _f()
    cause: str = _req()
    cause_kind: str = _req("`hang`/`exit`/`signal`/`terminated`/`unhealthy`")
    role: str | None = _f(doc="`root`/`collateral`")
    explanation: str = _f("", "the sentence of the line")
    detected_at: float | None = _f(doc="epoch; for a crash, when its monitor saw it disconnect")
    decision: str | None = _f()
    exit_code: int | None = _f(omit_none=True)
    hang_kind: str | None = _f(doc=_HANG + ": a hang kind, or `found through another rank's timeout`",
                               omit_none=True)
    section: str | None = _f(doc=_HANG, written_with="hang_kind")
    elapsed: float | None = _f(doc=_HANG + ", seconds", written_with="hang_kind")
    timeout: float | None = _f(doc=_HANG + ", seconds", written_with="hang_kind")
    signal: str | None = _f(doc=_HANG + ": the termination signal", written_with="hang_kind")
    error: str | None = _f(doc="the worker's error message when torch's `@record` captured one", omit_none=True)
    step: int | None = _f(doc=_KNOWN, written_with="last_progress_at")
    open_section: str | None = _f(doc=_KNOWN, written_with="last_progress_at")
    last_progress_at: float | None = _f(doc=_KNOWN + ", epoch", omit_none=True)
    stack_file: str | None = _f(doc=_STACKS + ": all threads", written_with="stack_frames")
    stack_frames: list[str] | None = _f(
        doc=_STACKS + ": up to 10, `file:line function`, innermost first, main thread", omit_none=True)
    stack_error: str | None = _f(doc="why no stacks were taken", written_with="stack_frames")
    user_frame: str | None = _f(doc=_STACKS + ": the innermost frame of the user's code", written_with="stack_frames")
    root_rank: int | None = _f(doc=_COLLATERAL + "; null when the root is a lost node", written_with="root_outcome")
    root_node: str | None = _f(doc=_COLLATERAL, written_with="root_outcome")
    root_group_rank: int | None = _f(doc=_COLLATERAL, written_with="root_outcome")
    root_cause: str | None = _f(doc=_COLLATERAL, written_with="root_outcome")
    root_outcome: str | None = _f(
        doc=_COLLATERAL + ": `hang`/`crash`/`stopped`, `lost`: a node that sent no report, or `left`: a node that "
        "left the job on request (ExcludeThisNode)", omit_none=True)
    lost_nodes: list[dict[str, Any]] | None = _f(
        doc="root `lost`: every node that sent no report, as `{group_rank, node}`", omit_none=True)
    fingerprint: str | None = _f(
        doc="the cycle's root failure, 12 hex digits: the same for a failure that repeats "
            "(`launcher/decision/crash_loop.py`)",
        omit_none=True)
    fingerprint_text: str | None = _f(doc="what the fingerprint stands for", written_with="fingerprint")
    root_step: int | None = _f(doc="the root rank's last step, when known", omit_none=True)

    @property
    def effective_role(self) -> str:
        """``root`` or ``collateral``: the record's ``role``, else (a launcher that wrote none)
        from its cause: a worker the launcher stopped because another failed is collateral."""
        if self.role in (ROLE_ROOT, ROLE_COLLATERAL):
            return self.role
        return ROLE_COLLATERAL if self.cause_kind == CAUSE_TERMINATED else ROLE_ROOT


@dataclass(kw_only=True)
class ControlRequest(EventRecord):
    """``control_request``: a rank asked for ``ShutdownWorkload`` or ``ExcludeThisNode``."""

    EVENT: ClassVar[str] = "control_request"

    cycle: int | None = _f()
    action: str | None = _f()
    description: str | None = _f()
    sender_pid: int | None = _f(omit_none=True)
    rank: int | None = _f()
    from_node: str | None = _f(doc="when learnt from another node", omit_none=True)


@dataclass(kw_only=True)
class ReplaceRefused(EventRecord):
    """``replace_refused``: a rank asked to replace this node (the straggler detector's replace
    action) and the job cannot go on without it (no spare node waits, ``--nnodes`` MIN allows no
    fewer nodes): the node stays and training goes on."""

    EVENT: ClassVar[str] = "replace_refused"

    cycle: int | None = _f()
    reason: str | None = _f(doc="the line the launcher logged")
    nodes: int | None = _f(doc="the nodes of the round")
    min_nodes: int | None = _f(doc="`--nnodes` MIN")
    spares_waiting: int | None = _f(doc="spare nodes waiting in the rendezvous; null: not known")


@dataclass(kw_only=True)
class Straggler(EventRecord):
    """``straggler``: the straggler detector flagged a rank, or a whole node, of this node as slow
    in one report interval (the scores are the detector's: lower is slower)."""

    EVENT: ClassVar[str] = "straggler"

    cycle: int | None = _f()
    scope: str | None = _f(doc="rank or node")
    rank: int | None = _f(doc="the global rank; null for a node")
    relative: float | None = _f(doc="the score against the other ranks")
    individual: float | None = _f(doc="the score against the rank's own best")
    interval_s: float | None = _f(doc="the report interval the scores cover")
    consecutive: int | None = _f(doc="reports in a row that flagged it")
    action: str | None = _f(doc="report, stop or replace")
    reported_node: str | None = _f(doc="the node the detector named, when not this launcher's", omit_none=True)
    sender_pid: int | None = _f(omit_none=True)


@dataclass(kw_only=True)
class MonitorDied(EventRecord):
    """``monitor_died``: a rank monitor exited during a cycle (replaced at the next one)."""

    EVENT: ClassVar[str] = "monitor_died"

    cycle: int | None = _f()
    local_rank: int | None = _f()
    exit_code: int | None = _f()


@dataclass(kw_only=True)
class MonitorReplaced(EventRecord):
    """``monitor_replaced``: a dead or unresponsive monitor was replaced at a cycle start."""

    EVENT: ClassVar[str] = "monitor_replaced"

    cycle: int | None = _f()
    local_rank: int | None = _f()
    exit_code: int | None = _f()
    reason: str | None = _f(doc="`exited`/`unresponsive`")


@dataclass(kw_only=True)
class MonitorUnresponsive(EventRecord):
    """``monitor_unresponsive``: no ``pong`` at the cycle start: killed and replaced."""

    EVENT: ClassVar[str] = "monitor_unresponsive"

    cycle: int | None = _f()
    local_rank: int | None = _f()
    monitor_pid: int | None = _f()


@dataclass(kw_only=True)
class RankEscalated(EventRecord):
    """``rank_escalated``: a hung rank outlived its termination signal; its monitor SIGKILLed it."""

    EVENT: ClassVar[str] = "rank_escalated"

    cycle: int | None = _f()
    local_rank: int | None = _f()
    rank: int | None = _f()
    worker_pid: int | None = _f()
    signal: str | None = _f(doc="`SIGKILL`")
    after: float | None = _f(doc="the grace, s")


@dataclass(kw_only=True)
class SignalReceived(EventRecord):
    """``signal_received``: the launcher got a signal to relay (SLURM's warning, ...)."""

    EVENT: ClassVar[str] = "signal_received"

    cycle: int | None = _f()
    signal: str | None = _f()
    job_wide: bool | None = _f(doc="the workers got it themselves")
    queued_for_local_ranks: list[int] = _f(factory=list)


@dataclass(kw_only=True)
class SignalForwarded(EventRecord):
    """``signal_forwarded``: the launcher passed a signal on to workers."""

    EVENT: ClassVar[str] = "signal_forwarded"

    cycle: int | None = _f()
    signal: str | None = _f()
    worker_pids: list[int | None] = _f(factory=list)
    queued: bool | None = _f(doc="true: queued during a restart, delivered to the new worker")


@dataclass(kw_only=True)
class Restart(EventRecord):
    """``restart``: the workers restart although this node saw no failure."""

    EVENT: ClassVar[str] = "restart"

    cycle: int | None = _f()
    reason: str | None = _f(doc="another node restarted or joined")


@dataclass(kw_only=True)
class JoinDeclined(EventRecord):
    """``join_declined``: nodes wait in the rendezvous, but the training ended, so this node's
    workers are not restarted with them (they stay out of the job, which ends)."""

    EVENT: ClassVar[str] = "join_declined"

    cycle: int | None = _f()
    ended_on: str | None = _f(doc="where the training ended: this node, or the node whose workers all succeeded")


@dataclass(kw_only=True)
class RoundFailure(EventRecord):
    """``round_failed``: a rendezvous round closed counting a node that never took part in the rank
    assignment (it died as the round closed); a restart, and the next round forms without it."""

    EVENT: ClassVar[str] = "round_failed"

    cycle: int | None = _f(doc="the latest cycle before it (-1: none yet)")
    group_rank: int | None = _f()
    group_world_size: int | None = _f()
    missing_ranks: list[int] = _f(doc="group ranks that never took part", factory=list)
    waited_s: float | None = _f()
    what: str | None = _f(doc="what timed out")
    restarts_left: int | None = _f(doc="before this one was counted (0: the launcher ends)")


@dataclass(kw_only=True)
class MinHealthyRestart(EventRecord):
    """``min_healthy_restart``: under ``min-healthy``, too few healthy nodes were left: restart."""

    EVENT: ClassVar[str] = "min_healthy_restart"

    cycle: int | None = _f()
    healthy_nodes: int | None = _f()
    min_nodes: int | None = _f()


@dataclass(kw_only=True)
class LeftoversKilled(EventRecord):
    """``leftovers_killed``: processes a worker left behind were killed."""

    EVENT: ClassVar[str] = "leftovers_killed"

    cycle: int | None = _f()
    pids: list[int] = _f(factory=list)


@dataclass(kw_only=True)
class JitStateSaved(EventRecord):
    """``state_saved``: after a failure, a surviving rank of this node saved its just-in-time state
    before the survivors were stopped ([jit-state.md](jit-state.md))."""

    EVENT: ClassVar[str] = "state_saved"

    cycle: int | None = _f(doc="the cycle that failed")
    rank: int | None = _f()
    local_rank: int | None = _f()
    step: int | None = _f(doc="the completed step the state holds")
    bytes: int | None = _f()
    seconds: float | None = _f(doc="the rank's copy, write and checksum")
    source: str | None = _f(doc="`exception` (its collective failed) or `blocked` (copied while blocked)")
    path: str | None = _f(doc="the payload, node-local")


@dataclass(kw_only=True)
class JitStateNotSaved(EventRecord):
    """``state_not_saved``: after a failure, no rank of this node saved its just-in-time state; the
    restart uses the periodic checkpoint unless another node's state is readable here."""

    EVENT: ClassVar[str] = "state_not_saved"

    cycle: int | None = _f(doc="the cycle that failed")
    reason: str = _f("", "e.g. `no rank answered within 12.0 s`, a sharded strategy")


@dataclass(kw_only=True)
class Resumed(EventRecord):
    """``resumed``: a worker restored its training state and told its monitor from which step and
    source (`ft_core.client.RankMonitorClient.report_resumed`); ``ft_report`` sets it against the
    failure's step: the steps redone."""

    EVENT: ClassVar[str] = "resumed"

    cycle: int | None = _f(doc="the cycle the worker belongs to")
    rank: int | None = _f()
    local_rank: int | None = _f()
    worker_pid: int | None = _f()
    step: int | None = _f(doc="the completed step it restored (training continues with the next); 0 from scratch")
    source: str | None = _f(doc="`jit` (just-in-time state), `jit_shared` (a previous job's just-in-time state "
                            "from the checkpoint directory: a requeued job), `checkpoint` (a periodic one) or "
                            "`scratch`")


@dataclass(kw_only=True)
class JitStateHealed(EventRecord):
    """``state_healed``: after the rendezvous, this node received the newest just-in-time state from
    a peer that held it (it had none of that step), or sent it to the nodes that lacked it, through
    the rendezvous store ([jit-state.md](jit-state.md#healing-a-node-from-a-peer))."""

    EVENT: ClassVar[str] = "state_healed"

    cycle: int | None = _f(doc="the cycle about to start")
    role: str | None = _f(doc="`received` or `sent`")
    peer: str | None = _f(doc="the sender, or the receivers (`node <group rank> (<host>)`)")
    step: int | None = _f(doc="the completed step the state holds")
    bytes: int | None = _f()
    seconds: float | None = _f(doc="the transfer, checksum included")


@dataclass(kw_only=True)
class JitStateHealFailed(EventRecord):
    """``state_heal_failed``: a transfer of the newest just-in-time state from a peer failed (timeout,
    checksum, store); every node falls back to the newest state every node can read."""

    EVENT: ClassVar[str] = "state_heal_failed"

    cycle: int | None = _f(doc="the cycle about to start")
    role: str | None = _f(doc="`received` or `sent`")
    peer: str | None = _f()
    step: int | None = _f()
    bytes: int | None = _f(doc="bytes moved before it failed")
    seconds: float | None = _f()
    reason: str = _f("", "e.g. the payload's SHA-256 differs from its manifest's")


@dataclass(kw_only=True)
class StoreLost(EventRecord):
    """``store_lost``: the rendezvous store is gone; a ``result`` (``rendezvous store lost``,
    exit code 1) follows."""

    EVENT: ClassVar[str] = "store_lost"

    reason: str | None = _f(
        doc="the store has not been reachable for `store_lost_timeout`: the store watchdog, "
            "[multinode.md](multinode.md#the-store-watchdog)")


@dataclass(kw_only=True)
class Result(EventRecord):
    """``result``: how the launcher ended."""

    EVENT: ClassVar[str] = "result"

    outcome: str = _req("`succeeded`, `failed`, `stopped: graceful stop after step N on SIGUSR1, not finished`, "
                        "`signal SIGTERM`, `forced stop (SIGTERM)`, `rendezvous store lost`, ...")
    exit_code: int | None = _f()
    cycles: int | None = _f()
    finished_flag_file: str | None = _f(doc="`FAULT_TOL_FINISHED_FLAG_FILE`, when set", omit_none=True)
    finished: bool | None = _f(doc="whether that file existed when the launcher ended",
                               written_with="finished_flag_file")


@dataclass(kw_only=True)
class Summary(EventRecord):
    """``summary``: the figures of the launcher's last line."""

    EVENT: ClassVar[str] = "summary"

    cycles: int | None = _f()
    incidents: int | None = _f()
    incidents_by_kind: dict[str, int] = _f(factory=dict)
    collateral: int | None = _f()
    escalated: int | None = _f()
    failures: int | None = _f(doc="the same as incidents, older name")
    failures_by_kind: dict[str, int] = _f(doc="the same as incidents_by_kind, older name", factory=dict)
    restart_seconds: float | None = _f()


KINDS: dict[str, type[EventRecord]] = {
    cls.EVENT: cls for cls in (
        LauncherStart, MonitorsStarted, WarmTemplateStarted, WarmTemplateReady, WarmTemplateReplaced, CycleStart,
        WorkersReady, WorkersSucceeded, AbortedAtExit, GracefulStopped, NodeCheck, Failure, ControlRequest,
        ReplaceRefused, Straggler, MonitorDied, MonitorReplaced, MonitorUnresponsive, RankEscalated, SignalReceived,
        SignalForwarded, Restart, JoinDeclined, RoundFailure, MinHealthyRestart, LeftoversKilled, JitStateSaved,
        JitStateNotSaved, JitStateHealed, JitStateHealFailed, Resumed, StoreLost, Result, Summary,
    )
}
"""Every kind of record, by its ``event``."""


# ---------------------------------------------------------------------- reading

ROOT_CAUSE_KINDS = frozenset({"hang", "exit", "signal"})
"""Failure kinds whose root record blames its node (``launcher.decision.failures.KIND_HANG``, ...)."""


def last_cycle_root_nodes(history: Iterable[EventRecord]) -> list[str]:
    """The nodes one launcher's records name as the root of its last started cycle's failure.

    A root record names its own node; a collateral one names the root's (``root_node``). Only
    hangs, crashes and lost nodes count (not "worker group unhealthy", where torch named no
    worker), and only the last cycle: an earlier failure was recovered from in the job. Pass one
    launcher's records (in a shared log: those of one ``run_id`` and ``node``), in file order.

    Returns:
        Host names in the order first named; empty if the last cycle recorded no failure.
    """
    history = list(history)
    cycles = [r.cycle for r in history if isinstance(r, CycleStart)]
    if not cycles:
        return []
    nodes: list[str] = []
    for record in history:
        if not isinstance(record, Failure) or record.cycle != cycles[-1]:
            continue
        if record.effective_role == ROLE_ROOT:
            node = record.node if record.cause_kind in ROOT_CAUSE_KINDS else None
        else:
            node = record.root_node
        if node and node not in nodes:
            nodes.append(node)
    return nodes


def lost_root_nodes(history: Iterable[EventRecord]) -> list[str]:
    """The nodes one launcher's records name as a lost root (``root_outcome`` ``lost``: a node
    that sent no report of a failure) in any cycle of its run, recovered from or not: an elastic
    job that finishes without a node must still say which node it lost.

    Returns:
        Host names in the order first named.
    """
    nodes: list[str] = []
    for record in history:
        if isinstance(record, Failure) and record.root_outcome == "lost" and record.root_node \
                and record.root_node not in nodes:
            nodes.append(record.root_node)
    return nodes


def read_events(paths: str | os.PathLike | Iterable[str | os.PathLike],
                skipped: collections.Counter | None = None) -> Iterator[EventRecord]:
    """The records of one or more event logs, typed, in file order.

    Skipped (the first of each reason logged as one warning; all counted by reason in
    ``skipped`` when one is given):
    lines that are not JSON objects with an ``event`` and a numeric ``ts`` (or are nested too
    deeply to decode), unknown kinds, records of a newer :data:`SCHEMA_VERSION`, records a
    required field of which is missing or of the wrong type, records with a
    :data:`STRICT_FIELDS` field of the wrong type or an :data:`EPOCH_FIELDS` field that is not
    a time. A line left incomplete by a killed launcher is one such line.

    Raises:
        OSError: A file cannot be read.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    skipped = skipped if skipped is not None else collections.Counter()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if not line.strip():
                    continue
                record, reason = parse_line(line)
                if record is not None:
                    yield record
                    continue
                if reason not in skipped:
                    logger.warning("%s: skipped a record: %s (further such lines are skipped silently)",
                                   path, reason)
                skipped[reason] += 1


def parse_line(line: str) -> tuple[EventRecord | None, str]:
    """One line of an event log: (the record, "") or (None, why it cannot be read)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None, "not JSON (a line left incomplete?)"
    except RecursionError:  # json's decoder recurses once per level of nesting
        return None, "nested too deeply"
    return parse(data)


def parse(data: Any) -> tuple[EventRecord | None, str]:
    """One decoded record: (the record, "") or (None, why it cannot be read)."""
    if not isinstance(data, dict) or not isinstance(data.get(EVENT_KEY), str):
        return None, "not an event record"
    kind = data[EVENT_KEY]
    version = data.get(SCHEMA_KEY, 1)
    if not isinstance(version, int) or isinstance(version, bool):
        return None, f"schema version {version!r} is not a number"
    if version > SCHEMA_VERSION:
        return None, f"schema version {version} is newer than this reader's {SCHEMA_VERSION}"
    cls = KINDS.get(kind)
    if cls is None:
        return None, f"unknown record kind {kind!r}"
    try:
        record = cls.from_wire(data)
    except MalformedError as err:
        return None, f"malformed {kind!r} record ({err})"
    except RecursionError:
        return None, "nested too deeply"
    if record.ts is None and data.get("ts") is None:
        return None, f"malformed {kind!r} record (no time stamp)"
    problem = _strict_problem(record, data)
    if problem:
        return None, f"malformed {kind!r} record ({problem})"
    return record, ""


def _strict_problem(record: EventRecord, data: Mapping[str, Any]) -> str:
    """Why a decoded record cannot be used although its required fields are there, or "".

    The codec reads a value of the wrong type as the field's default; for the fields records
    are grouped by (:data:`STRICT_FIELDS`) that would file the record under the wrong launcher
    or cycle, and a time outside :data:`MAX_EPOCH` cannot be shown, so either rejects it.
    """
    for name in STRICT_FIELDS:
        if data.get(name) is not None and getattr(record, name, None) is None:
            return f"{name} {data[name]!r:.40} is not {'a time' if name in EPOCH_FIELDS else 'of its type'}"
    for name in EPOCH_FIELDS:
        value = getattr(record, name, None)
        if value is not None and not 0 <= value <= MAX_EPOCH:
            return f"{name} {value!r} is not a time"
    return ""


# ---------------------------------------------------------------------- documentation


def schema_table() -> str:
    """The Markdown table of every kind and its fields, as ``docs/launcher.md`` shows it."""
    lines = [f"| event | written when | fields (besides {', '.join(f'`{name}`' for name in ENVELOPE)} "
             f"and `{SCHEMA_KEY}`) |",
             "| --- | --- | --- |"]
    for kind, cls in KINDS.items():
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        cells = []
        for name in cls.field_names():
            note = by_name[name].metadata.get(DOC, "")
            cells.append(f"{name} ({note})" if note else name)
        lines.append(f"| `{kind}` | {_when(cls)} | {', '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _when(cls: type[EventRecord]) -> str:
    """The first paragraph of the kind's docstring, without its ``kind``: prefix."""
    first = (cls.__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in first.splitlines())
    text = text.split(": ", 1)[1] if text.startswith("``") and ": " in text else text
    return text.replace("``", "`").rstrip(".")
