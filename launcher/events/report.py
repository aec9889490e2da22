"""``ft_report``: what happened in a run, from its event log.

``ft_report RUN_DIR_OR_EVENTS... [--plot timeline.png] [--json]`` reads the event logs that
``ft_launcher`` appends to (``<--log-dir>/ft_events.jsonl``, or ``ft_events.jsonl`` in the run
directory of ``scripts/autoresume.sh``; every attempt, every node appends to it; or one log per
node, ``--ft-event-log DIR/{node}.jsonl``: a directory's ``*.jsonl`` event logs, or several files)
and autoresume's ``history.tsv`` (in the directory, or its parent), all as one run. It prints a
timeline, oldest first:

* each launcher run (an autoresume attempt on one node: run id, workers, restarts allowed),
* each cycle (workers started; for a restart, how long after the failure; workers ready),
* each failure, root cause first, then the workers stopped as a consequence (when the root was
  a node that sent no report, lost or cut off, the cause its survivors recorded stands as the
  root cause),
* restarts caused by other nodes, workload control requests, graceful stops (each node's ranks
  and the step they stopped after), each launcher's result, and autoresume's decision after each
  attempt (resume, finished, stop);

then the run's figures, computed by :mod:`launcher.events.goodput` as ``bench/goodput.py`` computes
ours: goodput and the mean time to recover. The event log does not know training steps, so here

* useful time = the time all workers of a cycle were up (from "workers ready": every rank
  connected to its monitor, until the cycle ended): an upper bound, since the work since the
  last checkpoint is redone after a failure;
* recovered = the next cycle's workers are ready again (in the same launcher, or in the next
  autoresume attempt); failed = the failure's detection.

and what each failure cost in steps (:mod:`launcher.events.failure_cost`): the step it failed in
against the step the restart resumed from (which the ranks report, with where that state came from:
just-in-time state, a periodic checkpoint, or from scratch), the steps and seconds redone, and the
run's total; the goodput less that redone work.

``--plot`` draws the same timeline with matplotlib (``pip install 'ptl-resiliency[plot]'``), reduced
to what the chart can show (:mod:`launcher.events.plot`).
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

from launcher.events import records as kinds
from launcher.events.failure_cost import cost_figures, cost_lines, cost_text, failure_costs
from launcher.events.goodput import Recovery, run_figures
from launcher.events.records import (
    ROLE_COLLATERAL,
    ROLE_ROOT,
    ControlRequest,
    CycleStart,
    EventRecord,
    Failure,
    LauncherStart,
    Result,
    WorkersReady,
)
from launcher.events.runs import (
    Cycle,
    HistoryAttempt,
    LauncherRecords,
    ReportError,
    RunReport,
    failed_at,
    failure_kind,
    record_time,
    role,
    seconds_text,
    timeline_origin,
)

HISTORY_FILE = "history.tsv"
_LOST = "lost"  # launcher.decision.culprit.LOST: the root was a node that sent no view of the failure
LOST_NODE_KIND = "lost node"
_SAME_LOSS_S = 30.0
"""Two nodes' records of one lost node within this many seconds of each other are one incident."""


# ---------------------------------------------------------------------- reading


def _event_files(path: Path) -> tuple[list[Path], Optional[Path]]:
    """One argument's event logs and the ``history.tsv`` that goes with them (None: none).

    A directory: its ``*.jsonl`` files that hold event records (``ft_events.jsonl``, the per-node
    ``{node}.jsonl`` of ``--ft-event-log``), else those of its subdirectories (an ``events/``
    directory in autoresume's run directory); ``history.tsv`` there or in its parent. A file:
    that log (or a ``history.tsv``), with the ``history.tsv`` of its directory or that one's parent.
    """
    if path.is_dir():
        files = [f for f in sorted(path.glob("*.jsonl")) if _holds_records(f)]
        if not files:
            files = [f for f in sorted(path.glob("*/*.jsonl")) if _holds_records(f)]
        if not files:
            raise ReportError(f"no event log (*.jsonl with event records) in {path} or its subdirectories: pass "
                              "the run directory of autoresume.sh, the --log-dir of ft_launcher, the directory or "
                              "files of --ft-event-log")
        return files, _history_near(path)
    if path.is_file():
        if path.name == HISTORY_FILE:
            return [], path
        return [path], _history_near(path.parent)
    raise ReportError(f"{path} does not exist")


def _history_near(directory: Path) -> Optional[Path]:
    """autoresume's ``history.tsv`` in ``directory`` or its parent (per-node event logs often
    live in a subdirectory of the run directory), or None."""
    for place in (directory, directory.parent):
        history = place / HISTORY_FILE
        if history.is_file():
            return history
    return None


def _holds_records(path: Path) -> bool:
    """Whether a ``.jsonl`` file found in a directory is an event log: its first line is a record
    (another program's JSON lines there are left out, not counted as unreadable)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if line.strip():
                    return kinds.parse_line(line)[0] is not None
    except OSError:
        return True  # read_events reports why it cannot be read
    return False


def _inputs(paths: Sequence[str | Path]) -> tuple[list[Path], Optional[Path]]:
    """Every argument's event logs (each file once) and the one ``history.tsv`` among them.

    Raises:
        ReportError: An argument holds nothing readable, or two different histories are found.
    """
    files: dict[Path, None] = {}
    histories: dict[Path, None] = {}
    for path in paths:
        found, history = _event_files(Path(path))
        files.update(dict.fromkeys(found))
        if history is not None:
            histories[history] = None
    unique = {h.resolve(): h for h in histories}
    if len(unique) > 1:
        raise ReportError("more than one autoresume history.tsv (" + ", ".join(map(str, unique.values()))
                          + "): pass the event logs of one run")
    if not files:
        raise ReportError("no event log among " + ", ".join(map(str, paths)) + ": pass the event logs too")
    seen: dict[Path, Path] = {}
    for file in files:
        seen.setdefault(file.resolve(), file)
    return list(seen.values()), next(iter(unique.values()), None)


def read_events(files: Iterable[Path]) -> tuple[list[EventRecord], int]:
    """Typed records of every file, by time (:func:`launcher.events.records.read_events`); lines that
    cannot be read (not JSON, unknown kinds, newer schema, malformed) are counted, not fatal."""
    found: list[EventRecord] = []
    skipped: collections.Counter = collections.Counter()
    for file in files:
        try:
            found.extend(kinds.read_events(file, skipped))
        except OSError as err:
            raise ReportError(f"cannot read {file}: {err.strerror}") from None
    found.sort(key=record_time)
    return found, sum(skipped.values())


def _parse_time(text: str) -> Optional[float]:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def attempt_number(value: Any) -> Optional[int]:
    """An attempt number written as a whole number (``3`` or ``"3"``), else None (an odd value).

    Only ASCII digits count: ``str.isdigit`` also accepts ``"²"`` or ``"٣"``, which ``int`` then
    refuses (or reads as another number), and one odd record must not stop the report.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def read_history(path: Optional[Path]) -> list[HistoryAttempt]:
    """autoresume.sh's attempts (``history.tsv``), or none."""
    if path is None:
        return []
    attempts = []
    with open(path, encoding="utf-8", errors="replace", newline="") as stream:
        for row in csv.DictReader(stream, delimiter="\t"):
            number = attempt_number(row.get("attempt"))
            if number is None:
                continue
            attempts.append(HistoryAttempt(number, _parse_time(row.get("start") or ""),
                                    _parse_time(row.get("end") or ""), row.get("exit_code") or "-",
                                    row.get("flag") or "-", row.get("decision") or ""))
    return attempts


def build_runs(records: Sequence[EventRecord]) -> list[LauncherRecords]:
    """Group records by launcher (node and run id; node and pid in logs without run ids) and cycle.

    A ``launcher_start`` record begins a new launcher run even when its key was seen before (a
    fixed ``--rdzv-id`` used again). The records' ``pid`` is not the key: a few records name
    another process in it (``warm_template_started``).
    """
    runs: dict[tuple[Any, Any], LauncherRecords] = {}
    order: list[LauncherRecords] = []
    for record in records:
        key = (record.node, record.run_id or f"pid {record.pid}")
        run = runs.get(key)
        if isinstance(record, LauncherStart) or run is None:
            attempt = record.attempt if isinstance(record, LauncherStart) else None
            run = LauncherRecords(str(record.node), record.pid or 0, record.run_id, record_time(record),
                              attempt_number(attempt),
                              record if isinstance(record, LauncherStart) else LauncherStart())
            runs[key] = run
            order.append(run)
            if isinstance(record, LauncherStart):
                continue
        _add(run, record)
    return order


def _add(run: LauncherRecords, record: EventRecord) -> None:
    run.events.append(record)
    cycle = run.cycles[-1] if run.cycles else None
    if isinstance(record, CycleStart):
        if cycle is not None and cycle.ended is None:
            cycle.ended = record_time(record)
        run.cycles.append(Cycle(record.cycle, record_time(record), since_failure_s=record.since_failure_s,
                                warm=record.warm_start))
    elif isinstance(record, WorkersReady) and cycle is not None and cycle.ready is None:
        cycle.ready = record_time(record)
    elif isinstance(record, Failure):
        target = next((c for c in reversed(run.cycles) if c.index == record.cycle), cycle)
        if target is not None:
            target.failures.append(record)
            # a cycle ends at its first failure, root or not (the root may be on another node)
            target.ended = min(failed_at(record), target.ended if target.ended is not None else float("inf"))
    elif isinstance(record, Result):
        run.result = record
        if cycle is not None and cycle.ended is None:
            cycle.ended = record_time(record)


def lost_node(cycle: Cycle) -> Optional[Failure]:
    """The first record of a cycle whose root was a node that sent no report (rule 4 of
    :mod:`launcher.decision.culprit`); None if its root was a rank."""
    found = [f for f in cycle.failures if f.root_outcome == _LOST]
    return min(found, key=failed_at) if found else None


def load(paths: str | Path | Sequence[str | Path]) -> RunReport:
    """Read run directories, directories of event logs and event log files (one or several) as one
    run: every node's log and autoresume's ``history.tsv`` in one timeline.

    Raises:
        ReportError: Nothing readable there.
    """
    files, history = _inputs([paths] if isinstance(paths, (str, Path)) else list(paths))
    found, skipped = read_events(files)
    if not found:
        raise ReportError(f"no event records in {', '.join(str(f) for f in files)}")
    runs, attempts = build_runs(found), read_history(history)
    for attempt in attempts:
        # history.tsv has whole seconds: an attempt ends no earlier than its launchers did
        ends = [run.ended for run in runs if run.attempt == attempt.number]
        if attempt.end is not None and ends:
            attempt.end = max(attempt.end, *ends)
    for before, after in zip(attempts, attempts[1:], strict=False):
        if before.end is not None and after.start is not None:
            after.start = max(after.start, before.end)
    return RunReport(runs, attempts, [str(f) for f in files], skipped)


# ---------------------------------------------------------------------- figures


def recoveries(report: RunReport) -> list[Recovery]:
    """One per cycle that ended with a root-cause failure and was followed by ready workers.

    The next cycle is the same node's next cycle, or its first cycle in the next launcher run
    (the next autoresume attempt).
    """
    found = []
    by_node: dict[str, list[Cycle]] = {}
    for run in report.runs:
        by_node.setdefault(run.node, []).extend(run.cycles)
    for cycles in by_node.values():
        for cycle, following in zip(cycles, cycles[1:], strict=False):
            roots = [f for f in cycle.failures if role(f) == ROLE_ROOT]
            lost = lost_node(cycle)
            if following.ready is None or not (roots or lost):
                continue
            first = min(roots, key=failed_at) if roots else lost
            kind = failure_kind(first) if roots else LOST_NODE_KIND
            found.append(Recovery(kind, failed_at(first), following.ready, following.started))
    return found


def useful_seconds(report: RunReport) -> float:
    """Seconds the workers were up: each cycle from ready to its end (one node's view: the first)."""
    node = report.runs[0].node
    return sum(max(0.0, c.ended - c.ready) for run in report.runs if run.node == node
               for c in run.cycles if c.ready is not None and c.ended is not None)


def figures(report: RunReport) -> dict[str, Any]:
    """Wall time, goodput (upper bound), failures, mean time to recover (see the module docstring)."""
    started = min(r.started for r in report.runs)
    ended = max(r.ended for r in report.runs)
    attempt_times = [t for a in report.attempts for t in (a.start, a.end) if t is not None]
    if attempt_times:  # autoresume's own times include starting and ending the launchers
        started, ended = min(started, *attempt_times), max(ended, *attempt_times)
    result = run_figures(started, ended, useful_seconds(report), recoveries(report))
    failures = [f for run in report.runs for c in run.cycles for f in c.failures]
    result["failures"] = sum(1 for f in failures if role(f) == ROLE_ROOT) + lost_node_incidents(report)
    result["collateral"] = sum(1 for f in failures if role(f) == ROLE_COLLATERAL)
    result["cycles"] = sum(len(run.cycles) for run in report.runs)
    result["launcher_runs"] = len(report.runs)
    result["attempts"] = len(report.attempts) or len({(r.attempt, r.run_id) for r in report.runs})
    result["finished"], result["finished_flag_file"] = finished(report)
    result["graceful_stops"] = graceful_stops(report)
    result.update(cost_figures(report, result["useful_s"], result["wall_s"]))
    return result


def finished(report: RunReport) -> tuple[Optional[bool], Optional[str]]:
    """Whether the run finished, and the flag file that says so when the launchers named it.

    autoresume's ``history.tsv`` answers for its run directory (its last attempt's flag column);
    without it, the launchers' ``result`` records (``finished``: they looked for
    ``FAULT_TOL_FINISHED_FLAG_FILE`` at their end): finished if the last launcher of any node
    found the file. None when neither knows (no flag file was named).
    """
    if report.attempts:
        return report.attempts[-1].flag == "yes", None
    last: dict[str, LauncherRecords] = {}
    for run in report.runs:  # in time order: the last of each node wins
        if run.result is not None and run.result.finished is not None:
            last[run.node] = run
    if not last:
        return None, None
    found = [run for run in last.values() if run.result.finished]
    return bool(found), (found or list(last.values()))[-1].result.finished_flag_file


def lost_node_incidents(report: RunReport) -> int:
    """Incidents whose root was a lost node: no node's log holds a root record for them, each
    survivor's log names the node; records of the same node within :data:`_SAME_LOSS_S` count once."""
    seen = sorted(((run.run_id, record.root_group_rank, record.root_node), failed_at(record))
                  for run in report.runs for cycle in run.cycles if (record := lost_node(cycle)) is not None)
    count, last = 0, None
    for key, at in seen:
        if last is None or key != last[0] or at - last[1] > _SAME_LOSS_S:
            count += 1
            last = (key, at)
    return count


# ---------------------------------------------------------------------- text


def _clock(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def _or_unknown(value: Any) -> str:
    """A field's value for the timeline; ``?`` when the record did not have it."""
    return "?" if value is None else str(value)


def timeline_lines(report: RunReport) -> list[str]:
    """The timeline as text lines, oldest first."""
    origin = timeline_origin(report)
    items: list[tuple[float, int, str]] = []

    def add(ts: float, text: str, order: int = 0) -> None:
        items.append((ts, order, f"{_clock(ts)} {ts - origin:+9.2f}s  {text}"))

    for attempt in report.attempts:
        if attempt.start is not None:
            add(attempt.start, f"== autoresume attempt {attempt.number} starts", 5)
        if attempt.end is not None:  # after its launcher's end, before the next attempt's start
            add(attempt.end, f"== autoresume attempt {attempt.number} ended (ft_launcher exit "
                             f"{attempt.exit_code}, flag {attempt.flag}): {attempt.decision}", 4)
    for run in report.runs:
        start = run.start_record
        where = f"[{run.node}]"
        attempt = f", autoresume attempt {run.attempt}" if run.attempt is not None else ""
        add(run.started, f"{where} ft_launcher started (run id {run.run_id}{attempt}; nnodes "
                         f"{_or_unknown(start.nnodes)}, {_or_unknown(start.nproc_per_node)} worker(s) per node, "
                         f"--max-restarts {_or_unknown(start.max_restarts)})", -1)
        for cycle in run.cycles:
            how = "warm" if cycle.warm else "cold" if cycle.warm is not None else ""
            after = f", {cycle.since_failure_s:.2f} s after the failure" if cycle.since_failure_s else ""
            add(cycle.started, f"{where} cycle {cycle.index}: workers started ({how}{after})".replace("()", ""))
            if cycle.ready is not None:
                add(cycle.ready, f"{where} cycle {cycle.index}: all workers ready "
                                 f"({cycle.ready - cycle.started:.2f} s after their start)")
            roots = sorted((f for f in cycle.failures if role(f) == ROLE_ROOT), key=failed_at)
            others = [f for f in cycle.failures if role(f) != ROLE_ROOT]
            lost = lost_node(cycle) if not roots else None
            if lost is not None:
                add(failed_at(lost), f"{where} cycle {cycle.index}: ROOT CAUSE: {_or_unknown(lost.root_cause)}", 1)
                add(failed_at(lost), f"{where} cycle {cycle.index}: decision: {_or_unknown(lost.decision)}", 2)
            # root causes, the decision taken on them, then the workers stopped as a consequence
            for number, failure in enumerate(roots + others):
                label = "ROOT CAUSE" if role(failure) == ROLE_ROOT else "collateral"
                # the fingerprint names a failure that repeats (launcher.decision.crash_loop)
                fingerprint = ""
                if failure.fingerprint and label != "collateral":
                    fingerprint = f" [fingerprint {failure.fingerprint}]"
                add(failed_at(failure), f"{where} cycle {cycle.index}: {label}: rank {_or_unknown(failure.rank)} "
                                         f"(local rank {_or_unknown(failure.local_rank)}, pid "
                                         f"{_or_unknown(failure.worker_pid)}): {failure.cause}{fingerprint}",
                    1 + number + (number >= len(roots)) + 2 * (lost is not None))
            if roots:
                add(failed_at(roots[0]), f"{where} cycle {cycle.index}: decision: {_or_unknown(roots[0].decision)}",
                    1 + len(roots))
        for record in run.events:
            if isinstance(record, kinds.Restart):
                add(record_time(record), f"{where} restart: {_or_unknown(record.reason)}")
            elif isinstance(record, ControlRequest):
                source = f" from node {record.from_node}" if record.from_node else ""
                add(record_time(record), f"{where} rank {_or_unknown(record.rank)}{source} requested "
                                 f"{_or_unknown(record.action)}: {record.description or '(no reason given)'}")
            elif isinstance(record, kinds.Straggler):
                add(record_time(record), f"{where} {straggler_text(record)}")
            elif isinstance(record, kinds.ReplaceRefused):
                add(record_time(record), f"{where} {_or_unknown(record.reason)}")
            elif isinstance(record, kinds.JitStateSaved):
                add(record_time(record), f"{where} cycle {_or_unknown(record.cycle)}: rank {_or_unknown(record.rank)} "
                                         f"saved its just-in-time state of step {_or_unknown(record.step)} "
                                         f"({(record.bytes or 0) / 1e6:.0f} MB in {record.seconds or 0.0:.2f} s)", 2)
            elif isinstance(record, kinds.JitStateNotSaved):
                add(record_time(record), f"{where} cycle {_or_unknown(record.cycle)}: no just-in-time state saved: "
                                         f"{record.reason or 'no reason given'}", 2)
            elif isinstance(record, (kinds.MonitorDied, kinds.MonitorReplaced, kinds.LeftoversKilled)):
                add(record_time(record), f"{where} {record.EVENT.replace('_', ' ')}")
        by_cycle: dict[Any, list[kinds.GracefulStopped]] = {}
        for record in run.events:
            if isinstance(record, kinds.GracefulStopped):
                by_cycle.setdefault(record.cycle, []).append(record)
        for cycle_index, stops in by_cycle.items():
            add(max(map(record_time, stops)),
                f"{where} cycle {_or_unknown(cycle_index)}: {graceful_stop_text(stops)}", 2)
        if run.result is not None:
            add(record_time(run.result), f"{where} ft_launcher ended: {run.result.outcome} "
                                 f"(exit code {run.result.exit_code})", 3)
    for cost in failure_costs(report):
        if cost.resumed_at is not None or cost.failed_step is not None:
            add(cost.resumed_at if cost.resumed_at is not None else cost.failed_at,
                f"[{', '.join(dict.fromkeys(cost.nodes))}] {cost_text(cost)}", 6)
    return [text for _, _, text in sorted(items, key=lambda item: (item[0], item[1]))]


def graceful_stop_text(stops: Sequence[kinds.GracefulStopped]) -> str:
    """One node's ``graceful_stop`` records of a cycle in words: the signal, the ranks, the step
    (each rank's, when they differ: they should not)."""
    signals = "/".join(sorted({s.signal for s in stops if s.signal})) or "a stop signal"
    ranks = sorted(stops, key=lambda s: (s.rank is None, s.rank or 0))
    steps = {s.step for s in ranks}
    if len(steps) == 1:
        who = ", ".join(_or_unknown(s.rank) for s in ranks)
        return f"graceful stop on {signals}: rank{'s' if len(ranks) > 1 else ''} {who} stopped after step " \
               f"{_or_unknown(ranks[0].step)}"
    each = ", ".join(f"rank {_or_unknown(s.rank)} after step {_or_unknown(s.step)}" for s in ranks)
    return f"graceful stop on {signals}: ranks stopped after DIFFERENT steps: {each}"


def graceful_stops(report: RunReport) -> list[dict[str, Any]]:
    """Every graceful stop of the run, one per run id (an autoresume attempt: all its nodes),
    oldest first: ``run_id``, ``attempt``, ``signal``, ``steps`` (node -> the sorted steps its
    ranks stopped after), ``ranks`` (how many reported) and ``same_step`` (every rank of every
    node stopped after the same step, as they must)."""
    found: dict[Any, dict[str, Any]] = {}
    for run in report.runs:
        for record in run.events:
            if not isinstance(record, kinds.GracefulStopped):
                continue
            entry = found.setdefault(run.run_id, {"run_id": run.run_id, "attempt": run.attempt, "signal": set(),
                                                  "steps": {}, "ranks": 0})
            if record.signal:
                entry["signal"].add(record.signal)
            entry["steps"].setdefault(run.node, set()).add(record.step)
            entry["ranks"] += 1
    result = []
    for entry in found.values():
        all_steps = {step for steps in entry["steps"].values() for step in steps}
        entry["same_step"] = len(all_steps) == 1 and None not in all_steps
        entry["signal"] = "/".join(sorted(entry["signal"])) or None
        entry["steps"] = {node: sorted(steps, key=lambda v: (v is None, v or 0)) for node, steps in
                          entry["steps"].items()}
        result.append(entry)
    return result


def straggler_text(record: kinds.Straggler) -> str:
    """One ``straggler`` record in words: who, the scores, for how long, and the action."""
    who = f"rank {_or_unknown(record.rank)}" if record.scope != "node" else "node"
    if record.reported_node:
        who += f" of node {record.reported_node}"
    scores = ", ".join(f"{name} score {value:.2f}" for name, value in
                       (("relative", record.relative), ("individual", record.individual)) if value is not None)
    interval = f" over {record.interval_s:.0f} s" if record.interval_s is not None else ""
    repeated = f", flagged {record.consecutive} report(s) in a row" if (record.consecutive or 1) > 1 else ""
    action = _or_unknown(record.action)
    return f"straggler: {who} is slow ({scores or 'no scores'}{interval}{repeated}; action: {action})"


def figure_lines(values: dict[str, Any]) -> list[str]:
    by_kind = ", ".join(f"{kind} {seconds_text(v)}" for kind, v in sorted(values["mttr_by_kind_s"].items()))
    goodput = "-" if values["goodput"] is None else f"{values['goodput']:.3f}"
    flag = values.get("finished_flag_file")
    finished = {True: f"yes (flag file present{': ' + flag if flag else ''})",
                False: f"no{' (no flag file at ' + flag + ')' if flag else ''}", None: "-"}[values["finished"]]
    stops = []
    for stop in values.get("graceful_stops", []):
        attempt = f"attempt {stop['attempt']}, " if stop["attempt"] is not None else ""
        nodes = len(stop["steps"])
        if stop["same_step"]:
            step = next(iter(stop["steps"].values()))[0]
            what = (f"every rank that reported ({stop['ranks']} on {nodes} node(s)) stopped after step {step} "
                    f"on {stop['signal'] or 'a stop signal'}")
        else:
            each = "; ".join(f"{node}: {', '.join(map(_or_unknown, steps))}" for node, steps in stop["steps"].items())
            what = f"the ranks stopped after DIFFERENT steps on {stop['signal'] or 'a stop signal'}: {each}"
        stops.append(f"graceful stop ({attempt}run id {stop['run_id']}): {what}")
    return [
        f"wall time {values['wall_s']:.1f} s; {values['attempts']} attempt(s), {values['launcher_runs']} launcher "
        f"run(s), {values['cycles']} cycle(s); finished: {finished}",
        f"failures: {values['failures']} root cause(s), {values['collateral']} worker(s) stopped as a consequence",
        f"goodput <= {goodput} (workers up {values['useful_s']:.1f} s of {values['wall_s']:.1f} s; "
        + ("less the work redone below)" if values.get("redone_known") else "work redone since the last checkpoint "
           "is not in the event log unless the ranks report where they resumed)"),
        *cost_lines(values),
        f"mean time to recover {seconds_text(values['mttr_s'])} over {values['recoveries']} recover(ies) (failure "
        f"detected -> workers ready again){'; by kind: ' + by_kind if by_kind else ''}",
        *stops,
    ]


# ---------------------------------------------------------------------- plot


def plot(report: RunReport, values: dict[str, Any], path: str | Path) -> None:
    """Draw the timeline to ``path`` (PNG, SVG or PDF by its suffix): :func:`launcher.events.plot.draw`.

    Raises:
        ReportError: matplotlib is not installed.
    """
    from launcher.events.plot import draw  # imports this module; and matplotlib only when asked to plot

    draw(report, values, path)


# ---------------------------------------------------------------------- entry point


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point of ``ft_report``: 0, or 2 when the input cannot be read."""
    parser = argparse.ArgumentParser(
        prog="ft_report", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="RUN_DIR_OR_EVENTS (one or more, read as one run): autoresume.sh's run directory (its "
               "ft_events.jsonl and history.tsv), ft_launcher's --log-dir, a directory of per-node event logs "
               "(--ft-event-log DIR/{node}.jsonl: every *.jsonl there), or event log files.")
    parser.add_argument("paths", metavar="RUN_DIR_OR_EVENTS", nargs="+")
    parser.add_argument("--plot", metavar="FILE", help="also draw the timeline to FILE (.png, .svg, .pdf)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of text")
    args = parser.parse_args(argv)
    try:
        report = load(args.paths)
        values = figures(report)
        if args.plot:
            plot(report, values, args.plot)
    except ReportError as err:
        print(f"ft_report: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(values, indent=1, sort_keys=True))
        return 0
    print(f"ft_report: {', '.join(report.sources)}"
          + (f" ({report.skipped_lines} unreadable line(s) skipped)" if report.skipped_lines else ""))
    print()
    print("\n".join(timeline_lines(report)))
    print()
    print("\n".join(figure_lines(values)))
    if args.plot:
        print(f"timeline drawn to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
