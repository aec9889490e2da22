"""What ``scripts/autoresume.sh`` decides after an attempt: pure functions, no I/O.

The exit codes come from :mod:`launcher.exit_codes`, the one place that defines them; the
script holds no copy of them.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.exit_codes import (
    AUTORESUME_EXIT_NO_PROGRESS,
    EXIT_FAILURE,
    EXIT_NODE_EXCLUDED,
    EXIT_REPEATED_FAILURE,
    EXIT_SHUTDOWN_REQUESTED,
    EXIT_SIGNAL_BASE,
    EXIT_SUCCESS,
    EXIT_USAGE,
)
from launcher.resume.repeats import is_node_name, parse_launcher_result

FINISHED = "finished"
CONTINUE = "continue"
STOP = "stop"

WARNING_SIGNALS = ("USR1", "USR2")
STOP_SIGNALS = ("TERM", "INT", "HUP")

_COUNT = re.compile(r"[0-9]{1,9}")


def is_count(text: str) -> bool:
    """Whether ``text`` is a whole number of at most 9 digits (the script's counts and codes)."""
    return bool(_COUNT.fullmatch(text))


def signal_exit_code(name: str) -> int:
    """The script's exit code after the stop signal ``name`` (``SIGTERM`` or ``TERM``): 128+N.

    Raises:
        ValueError: ``name`` is no signal of this system.
    """
    bare = name.removeprefix("SIG")
    try:
        return EXIT_SIGNAL_BASE + int(signal.Signals["SIG" + bare])
    except KeyError:
        raise ValueError(f"not a signal: {name!r}") from None


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``SIG<number>`` for a number that names no signal here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def combine_codes(codes: Sequence[int]) -> int:
    """One exit code for an attempt from the codes of all its launchers (one per node).

    64 (ShutdownWorkload) if any node says so: one rank's request ends the run. Else 2 (usage
    error) if any says so: nothing will change on retry. Else 66 (a repeating failure) if any
    says so: a node killed while the others stopped the loop must not hide that. Else the
    highest, so that a failure or a signal on one node is not hidden by success elsewhere. No
    codes at all: 0.
    """
    for code in (EXIT_SHUTDOWN_REQUESTED, EXIT_USAGE, EXIT_REPEATED_FAILURE):
        if code in codes:
            return code
    return max([EXIT_SUCCESS, *codes])


@dataclass(frozen=True)
class Limits:
    """The loop's bounds, from the script's options.

    Attributes:
        max_failures: Stop after this many consecutive failed attempts (``--max-failures``).
        max_attempts: Stop after this many attempts of any kind; 0 = no limit.
        max_stalled: Stop after this many consecutive failed attempts without progress.
        progress_path: ``--progress-path``; empty: progress is not watched.
    """

    max_failures: int = 3
    max_attempts: int = 0
    max_stalled: int = 2
    progress_path: str = ""


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended, as the script saw it.

    Attributes:
        number: The attempt's number (1, 2, ...).
        rc: ``ft_launcher``'s exit code (all nodes combined, :func:`combine_codes`).
        flag: Whether the finished flag file exists.
        warned: ``SIGUSR1``/``SIGUSR2`` when a warning came during the attempt, else empty.
        terminated: ``SIGTERM``/``SIGINT``/``SIGHUP`` when the script was told to stop, else empty.
        local: Local mode (a stop signal there always stops, even after a warning).
        failures: Consecutive failed attempts before this one.
        stalled: Consecutive failed attempts without progress before this one.
        progressed: Whether a file under the progress path got newer during the attempt.
        repeated: When the attempt's failure repeats as a bug (:mod:`launcher.resume.repeats`),
            what repeated; else empty.
    """

    number: int
    rc: int
    flag: bool
    warned: str = ""
    terminated: str = ""
    local: bool = True
    failures: int = 0
    stalled: int = 0
    progressed: bool = False
    repeated: str = ""


@dataclass(frozen=True)
class AttemptVerdict:
    """The decision after an attempt.

    Attributes:
        verdict: :data:`FINISHED`, :data:`CONTINUE` or :data:`STOP`.
        exit_code: The script's exit code when it does not continue (0 when finished).
        text: The decision as ``history.tsv`` and the log show it.
        shown_failures: The consecutive failure count the attempt ended with (history).
        failures: The count to carry on with: 0 after a stop (a new submission starts afresh)
            or after an ending that was not a failure.
        stalled: The stalled-attempt count to carry on with, reset like ``failures``.
        failed: Whether the attempt counts as a failure.
    """

    verdict: str
    exit_code: int
    text: str
    shown_failures: int
    failures: int
    stalled: int
    failed: bool


def _failure_reason(rc: int) -> str:
    why = f"ft_launcher exit {rc}"
    if rc == EXIT_NODE_EXCLUDED:
        why += ", ExcludeThisNode"
    if rc > EXIT_SIGNAL_BASE:
        why += f", forced stop or killed by {signal_name(rc - EXIT_SIGNAL_BASE)}"
    return why


def decide(attempt: Attempt, limits: Limits) -> AttemptVerdict:
    """The verdict after ``attempt``: the first matching row of the table in docs/autoresume.md.

    Args:
        attempt: How the attempt ended.
        limits: The loop's bounds.

    Returns:
        The verdict, with the counts to carry on with.
    """
    rc = attempt.rc
    if attempt.flag:
        text = "finished: flag file present"
        if rc != EXIT_SUCCESS:
            text += f" (ft_launcher exited {rc})"
        return AttemptVerdict(FINISHED, EXIT_SUCCESS, text, 0, 0, 0, False)
    failed = False
    failures, stalled = attempt.failures, attempt.stalled
    if rc == EXIT_SHUTDOWN_REQUESTED:
        verdict, code = STOP, EXIT_SHUTDOWN_REQUESTED
        text = f"stop: a rank requested ShutdownWorkload (ft_launcher exit {rc})"
    elif rc == EXIT_USAGE:
        verdict, code = STOP, EXIT_USAGE
        text = f"stop: ft_launcher usage error (exit {rc}); fix the command line"
    elif rc == EXIT_REPEATED_FAILURE:
        verdict, code = STOP, EXIT_REPEATED_FAILURE
        text = (f"stop: ft_launcher stopped a repeating failure (exit {rc}): the same failure ended "
                "its restarts without progress, a requeue will not fix it; not requeued")
    elif attempt.terminated and (not attempt.warned or attempt.local):
        # A preemption or a cancel: ft_launcher exits 0 when its ranks stopped in time, else 1;
        # the signal seen here decides, not that code. In slurm mode a stop signal after a
        # warning is the time limit arriving before the ranks stopped: continue, as warned.
        verdict, code = STOP, signal_exit_code(attempt.terminated)
        how = "the ranks stopped in time" if rc == EXIT_SUCCESS else "not a clean stop"
        text = f"stop: terminated by {attempt.terminated} (ft_launcher exit {rc}: {how})"
    elif attempt.warned:
        verdict, code = CONTINUE, EXIT_SUCCESS
        text = f"continue: warning signal {attempt.warned}, not a failure (ft_launcher exit {rc})"
    elif rc == EXIT_SUCCESS:
        verdict, code = CONTINUE, EXIT_SUCCESS
        text = "continue: ft_launcher exited 0 without the flag, not a failure"
    else:
        failed = True
        failures += 1
        why = _failure_reason(rc)
        stalled_out = False
        if limits.progress_path:
            stalled = 0 if attempt.progressed else stalled + 1
            stalled_out = stalled >= limits.max_stalled
        if attempt.repeated:
            # Before the other limits: it names the cause, where they only count.
            verdict, code = STOP, EXIT_REPEATED_FAILURE
            text = (f"stop: a repeating failure, a bug and not a node: {attempt.repeated}; "
                    f"not requeued ({why})")
        elif stalled_out:
            verdict, code = STOP, AUTORESUME_EXIT_NO_PROGRESS
            text = (f"stop: no progress, {stalled} consecutive failed attempts without a newer "
                    f"file under {limits.progress_path} ({why})")
        elif failures >= limits.max_failures:
            verdict, code = STOP, EXIT_FAILURE
            text = f"stop: {failures} consecutive failures, the maximum ({why})"
        else:
            verdict, code = CONTINUE, EXIT_SUCCESS
            text = f"continue: failure {failures} of at most {limits.max_failures} ({why})"
    if verdict == CONTINUE and 0 < limits.max_attempts <= attempt.number:
        verdict, code = STOP, EXIT_FAILURE
        text = f"stop: --max-attempts {limits.max_attempts} reached ({text.removeprefix('continue: ')})"
    shown = failures
    if verdict == STOP or not failed:
        failures = stalled = 0
    return AttemptVerdict(verdict, code, text, shown, failures, stalled, failed)


def killed_attempt(failures: int, stalled: int, limits: Limits) -> AttemptVerdict:
    """The verdict on an attempt whose script was killed before it could record it.

    A SIGKILL or a lost node leaves ``running=1`` in the state file; the next run counts that
    attempt as a failure, so that a job that keeps dying cannot loop forever.

    Args:
        failures: Consecutive failed attempts before the killed one.
        stalled: Consecutive stalled attempts before it (kept: its progress is unknown).
        limits: The loop's bounds (only ``max_failures`` matters).
    """
    failures += 1
    what = "no record of how it ended (the script was killed)"
    if failures >= limits.max_failures:
        return AttemptVerdict(STOP, EXIT_FAILURE,
                       f"stop: {what}; {failures} consecutive failures, the maximum",
                       failures, 0, 0, True)
    return AttemptVerdict(CONTINUE, EXIT_SUCCESS,
                   f"continue: {what}; failure {failures} of at most {limits.max_failures}",
                   failures, failures, stalled, True)


def requeue_failed_text(text: str) -> str:
    """The decision when ``scontrol requeue`` refused the continuation ``text`` recorded."""
    return f"stop: scontrol requeue failed ({text.removeprefix('continue: ')})"


# ---------------------------------------------------------------------------- nodes (slurm)


@dataclass(frozen=True)
class NodeReport:
    """What a node task left in ``RUN_DIR/nodes/`` (see autoresume.sh).

    Attributes:
        node: The node's SLURM name.
        code: Its launcher's exit code.
        warned: The warning signal the task saw (``USR1``), or empty.
        stopped: The stop signal the task saw (``TERM``), or empty.
        roots: Host names the launcher named as the root of the failure that ended its run.
        host: The node's kernel host name, as the launchers' records name nodes.
        fingerprint: The fingerprint of the root failure of the launcher's last failed cycle
            (12 hex digits), or empty (none, or a launcher that does not write one).
        fingerprint_text: That fingerprint as one line of text, or empty.
        lost: Host names the launcher named as a lost root in any cycle (a node that sent no
            report of a failure; the run may have gone on without it).
    """

    node: str
    code: int
    warned: str = ""
    stopped: str = ""
    roots: tuple[str, ...] = ()
    host: str = ""
    fingerprint: str = ""
    fingerprint_text: str = ""
    lost: tuple[str, ...] = ()


def parse_node_report(text: str, launcher_result: str = "") -> NodeReport | None:
    """Parse a node task's ``"<node> <code> <warned|-> <stopped|-> <host>"``; None if malformed.

    Args:
        text: The node task's line.
        launcher_result: The launcher's result file on that node (``FT_LAUNCHER_RESULT_FILE``,
            ``key=value`` lines), for the root nodes it names; empty if it left none.

    Signals other than the warning and stop signals, and root names that are not plain host
    names, are dropped: nothing from these files reaches ``scontrol`` except a checked node name.
    """
    fields = text.split()
    if len(fields) != 5 or not is_node_name(fields[0]) or not is_count(fields[1]):
        return None
    node, code, warned, stopped, host = fields
    result = parse_launcher_result(launcher_result)
    return NodeReport(
        node=node, code=int(code),
        warned=warned if warned in WARNING_SIGNALS else "",
        stopped=stopped if stopped in STOP_SIGNALS else "",
        roots=result.roots, host=host if is_node_name(host) else node,
        fingerprint=result.fingerprint, fingerprint_text=result.fingerprint_text, lost=result.lost)


@dataclass
class NodesOutcome:
    """An attempt's outcome over all its nodes.

    Attributes:
        rc: The attempt's exit code (:func:`combine_codes`).
        codes: ``(node, code)`` per node, in SLURM_NODEID order.
        warned: The first warning signal a node task saw (``SIGUSR1``), or empty.
        terminated: The first stop signal a node task saw (``SIGTERM``), or empty.
        bad_nodes: Nodes that caused the failure in a way that excludes them at once (lost,
            ExcludeThisNode), in the order they were found, no repeats; ``why`` says why.
        roots: Nodes the launchers named as the root of the failure (SLURM names), no repeats:
            excluded only when it repeats (:mod:`launcher.resume.repeats`).
        fingerprint: The failure's fingerprint (the one most launchers report), or empty.
        fingerprint_text: Its text, or empty.
        notes: Log lines, in order (the attempt number is prefixed by the caller).
        lost: Nodes lost during the attempt (no report from their task, or named by the
            launchers as a node that sent no report of a failure), no repeats: named in the node
            history even when the attempt did not fail.
    """

    rc: int = 0
    codes: list[tuple[str, int]] = field(default_factory=list)
    warned: str = ""
    terminated: str = ""
    bad_nodes: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    roots: list[str] = field(default_factory=list)
    fingerprint: str = ""
    fingerprint_text: str = ""
    notes: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def blame(self, node: str, why: str, root: bool = False) -> None:
        """Record that ``node`` caused the failure, and why; ``root``: as its root."""
        self.notes.append(f"node {node} caused a failure: {why}")
        listed = self.roots if root else self.bad_nodes
        if node not in listed:
            listed.append(node)
            if not root:
                self.why[node] = why


def nodes_outcome(reports: Sequence[NodeReport | None], alloc_hosts: Sequence[str],
                  srun_rc: int) -> NodesOutcome:
    """Combine the node tasks' reports of one attempt.

    Args:
        reports: One per node task (SLURM_NODEID order); None where a task left no valid report
            (it never started, or its node was lost).
        alloc_hosts: The allocation's node names in SLURM_NODEID order.
        srun_rc: srun's exit code: all that is known of a node without a report.
    """
    out = NodesOutcome()
    lost: list[str] = []
    named: list[str] = []
    named_lost: list[str] = []
    host_nodes: dict[str, list[str]] = {}
    for index, report in enumerate(reports):
        if report is None:
            node = alloc_hosts[index] if index < len(alloc_hosts) else f"node{index}"
            code = srun_rc if srun_rc != EXIT_SUCCESS else EXIT_FAILURE
            out.blame(node, "lost (its launcher never reported)")
            lost.append(node)
            out.lost.append(node)
        else:
            node, code = report.node, report.code
            host_nodes.setdefault(report.host, []).append(node)
            named += report.roots
            named_lost += report.lost
            if report.warned and not out.warned:
                out.warned = "SIG" + report.warned
            # A stop signal sent to the job steps only (scancel -s TERM without --batch) counts
            # as if the script had got it.
            if report.stopped and not out.terminated:
                out.terminated = "SIG" + report.stopped
        if code == EXIT_NODE_EXCLUDED:
            out.blame(node, "ExcludeThisNode")
        out.codes.append((node, code))
    _blame_roots(out, named, host_nodes, alloc_hosts, lost)
    _blame_named_lost(out, named_lost, host_nodes, alloc_hosts)
    out.rc = combine_codes([code for _, code in out.codes])
    prints = [(r.fingerprint, r.fingerprint_text) for r in reports if r is not None and r.fingerprint]
    if prints:
        # Every node computes the same fingerprint from the same exchanged views; should they
        # differ, the one most nodes report stands.
        out.fingerprint, out.fingerprint_text = max(prints, key=prints.count)
    return out


def _blame_roots(out: NodesOutcome, named: list[str], host_nodes: dict[str, list[str]],
                 alloc_hosts: Sequence[str], lost: list[str]) -> None:
    """Blame the nodes the launchers named as the root of the failure, by their SLURM names.

    When a node was lost, the ranks the survivors blamed most likely failed because of it (a
    peer's connection reset, a collective that never completes), so only the lost node counts.
    """
    # A launcher that names a lost node as the root (rule 5 of launcher/decision/culprit.py) agrees.
    named = [host for host in named if host not in lost]
    if not named:
        return
    if lost:
        out.notes.append(f"not blaming {','.join(named)} (named as root by the launchers): "
                         f"node(s) {' '.join(lost)} lost, which explains the failure")
        return
    for host in dict.fromkeys(named):
        nodes = host_nodes.get(host, [])
        if len(nodes) > 1:
            # Virtual nodes on one machine share its host name: which one is meant is unknown.
            out.notes.append(f"the launchers named host {host} as the root, which is more than "
                             "one node of this allocation; not excluded")
            continue
        if not nodes:
            if host not in alloc_hosts:
                mapping = " ".join(f"{h}={n}" for h, ns in host_nodes.items() for n in ns)
                out.notes.append(f"the launchers named host {host} as the root, which is no node "
                                 f"of this allocation (host=node: {mapping}); not excluded")
                continue
            nodes = [host]   # SLURM's own name for the node
        out.blame(nodes[0], "root cause of the failure, as the launchers' records name it", root=True)


LOST_BY_THE_LAUNCHERS = "lost during the attempt (it sent no report of a failure, as the launchers' records name it)"


def _blame_named_lost(out: NodesOutcome, named_lost: list[str], host_nodes: dict[str, list[str]],
                      alloc_hosts: Sequence[str]) -> None:
    """Blame, as a root, each node the launchers named as lost (their records' root of a cycle
    in which the node sent no report), unless it is already blamed: an elastic job (``--nnodes
    MIN:MAX``) goes on and may finish without the node, and the node history must still say
    which node the job lost, not nothing (nor a survivor whose collective broke)."""
    for host in dict.fromkeys(named_lost):
        nodes = host_nodes.get(host) or ([host] if host in alloc_hosts else [])
        if len(nodes) != 1:
            continue  # no node of this allocation, or several virtual nodes on one host: unknown
        if nodes[0] not in out.lost:
            out.lost.append(nodes[0])
        if nodes[0] not in out.bad_nodes and nodes[0] not in out.roots:
            out.blame(nodes[0], LOST_BY_THE_LAUNCHERS, root=True)


@dataclass(frozen=True)
class Exclusion:
    """The nodes to keep out of the requeued job.

    Attributes:
        nodes: The new exclusion list, oldest first (empty: none, or dropped).
        update: Whether the job's exclusion list must be changed with ``scontrol update``.
        note: A log line, or empty.
    """

    nodes: tuple[str, ...] = ()
    update: bool = False
    note: str = ""


def exclusion(previous: Sequence[str], bad_nodes: Sequence[str], max_excluded: int,
              partition_nodes: int | None, needed_nodes: int) -> Exclusion:
    """The exclusion list after an attempt that the job continues from.

    Args:
        previous: The list so far (``RUN_DIR/excluded_nodes``), oldest first.
        bad_nodes: The nodes that caused this attempt's failure.
        max_excluded: ``--max-excluded``: keep at most this many, dropping the oldest; 0 = never
            exclude (and never touch the job's list).
        partition_nodes: Nodes in the job's partition (sinfo), None if unknown.
        needed_nodes: Nodes the requeued job needs (:func:`needed_nodes`).

    Returns:
        No update when nothing is to be excluded. The list is dropped (update to an empty list)
        when the job would no longer fit in its partition without those nodes: better the same
        bad node again than a job that never starts.
    """
    if max_excluded <= 0:
        return Exclusion()
    nodes = list(dict.fromkeys([*previous, *bad_nodes]))
    if not nodes:
        return Exclusion()
    nodes = nodes[-max_excluded:]
    if partition_nodes and partition_nodes - len(nodes) < needed_nodes:
        return Exclusion((), True, f"not excluding {' '.join(nodes)}: {needed_nodes} node(s) would "
                                   f"no longer fit in the {partition_nodes} of the partition; "
                                   "list dropped")
    return Exclusion(tuple(nodes), True)


def launcher_nnodes(args: Sequence[str]) -> str | None:
    """The value of the last ``--nnodes`` among ft_launcher's arguments (the one torch's parser
    keeps), None when there is none."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--nnodes" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--nnodes="):
            value = arg.partition("=")[2]
    return value


def elastic_min(nnodes: str | None) -> int:
    """``--nnodes MIN:MAX``'s MIN when MIN < MAX (the job may go on with fewer nodes), else 0."""
    low, colon, high = (nnodes or "").partition(":")
    if colon and low.isdigit() and high.isdigit() and 0 < int(low) < int(high):
        return int(low)
    return 0


def needed_nodes(requested: int, current: int | None, min_nodes: int) -> int:
    """The nodes the requeued job is to ask for.

    Args:
        requested: The job's node count when this attempt started (``SLURM_JOB_NUM_NODES``).
        current: ``NumNodes`` of the job now (``scontrol show job``), None if unknown. Under
            ``sbatch --no-kill`` SLURM removes a lost node from the job, but a requeued job
            asks for its original count again, and waits for the lost node to come back.
        min_nodes: ``--nnodes`` MIN of an elastic launcher (:func:`elastic_min`), 0 if none.

    Returns:
        ``current`` when the job shrank and the launchers accept that many nodes (elastic, at
        least MIN), else ``requested``: a job sized ``--nnodes N`` is never made smaller.
    """
    if current is not None and min_nodes and min_nodes <= current < requested:
        return current
    return requested


def node_count_fields(nodes: int, requested: int, ntasks: str | None) -> list[str]:
    """The ``scontrol update`` fields that shrink the requeued job to ``nodes`` (0: none).

    ``NumTasks`` goes down with ``NumNodes`` (as many tasks per node as before): a job submitted
    with ``--ntasks-per-node`` holds a task count for its first size, and with more tasks than
    its nodes can take SLURM keeps it pending for good (``BadConstraints``).
    """
    if not nodes:
        return []
    fields = [f"NumNodes={nodes}"]
    if ntasks and ntasks.isdigit() and requested > 0 and int(ntasks) % requested == 0:
        fields.append(f"NumTasks={nodes * int(ntasks) // requested}")
    return fields


def requeued_text(text: str, job_ref: str, excl: Exclusion, nodes: int = 0) -> str:
    """The decision as recorded once ``scontrol requeue`` accepted the continuation (``nodes``:
    the node count the requeued job was shrunk to, 0 when unchanged)."""
    text += f"; job {job_ref} requeued"
    if excl.update:
        text += f" excluding {','.join(excl.nodes)}" if excl.nodes else " excluding no node"
    if nodes:
        text += f" on {nodes} node(s)"
    return text
