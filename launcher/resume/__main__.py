"""``python -m launcher.resume STEP ...``: the steps ``scripts/autoresume.sh`` runs.

Each step prints shell assignments (``NAME='value'``, ``NAME=('a' 'b')``), every value quoted
with :func:`shlex.quote`, for the script to ``eval``; log lines go to stderr in the script's
format. Steps:

- ``config ARGS...``: parse and check the script's options (and, in slurm mode, the job);
  prints the settings, among them ``POLICY_ARGS``, the arguments of every later step.
- ``resume POLICY_ARGS``: at the start, under the run directory's lock: record an attempt whose
  script was killed, and say whether to stop at once (``STOP=code``).
- ``start POLICY_ARGS``: before an attempt: count it and mark it running; prints ``ATTEMPT``.
- ``decide POLICY_ARGS --rc=N [--results=DIR] | --srun-rc=N --results=DIR [--warned=SIG]
  [--terminated=SIG]``: after it: the verdict, the history line's fields (and the file's
  header, which the script writes with the first line: a history file never holds a header
  alone) and, in slurm mode, the nodes to exclude. It appends the attempt's rows to
  ``node_history.tsv`` itself (:mod:`launcher.resume.repeats`).
- ``requeue-failed POLICY_ARGS --decision=TEXT``: ``scontrol requeue`` failed: stop.

Exit status: 0 when the step ran (its output says what to do), 2 for a usage error, 1 when
something the script needs is unavailable; the script then exits with that status.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from launcher.exit_codes import EXIT_FAILURE, EXIT_REPEATED_FAILURE, EXIT_SIGNAL_BASE, EXIT_USAGE
from launcher.resume import history, own_files, policy, repeats
from launcher.resume.history import State

logger = logging.getLogger("launcher.resume")
PROG = "autoresume.sh"


def emit(**values: object) -> None:
    """Print ``values`` as shell assignments (lists as bash arrays)."""
    lines = []
    for name, value in values.items():
        if isinstance(value, (list, tuple)):
            lines.append(f"{name}=({' '.join(shlex.quote(str(v)) for v in value)})")
        else:
            lines.append(f"{name}={shlex.quote(str(value))}")
    sys.stdout.write("\n".join(lines) + "\n")


@dataclass(frozen=True)
class Settings:
    """What every step after ``config`` is told: ``--name=value`` arguments (``POLICY_ARGS``)."""

    run_dir: str
    flag_file: str
    mode: str = "local"
    job_id: str = "local"
    job_ref: str = ""
    hosts: str = ""
    nnodes: int = 1
    min_nodes: int = 0
    max_failures: int = 3
    max_attempts: int = 0
    max_excluded: int = 4
    max_stalled: int = 2
    progress_path: str = ""
    max_repeats: int = 2
    node_failures_to_exclude: int = 2
    node_exclusion_expiry: int = 3

    @property
    def limits(self) -> policy.Limits:
        """The loop's bounds."""
        return policy.Limits(self.max_failures, self.max_attempts, self.max_stalled,
                             self.progress_path)

    @property
    def rules(self) -> repeats.Rules:
        """The rules on repeating failures and nodes."""
        return repeats.Rules(self.max_repeats, self.node_failures_to_exclude,
                             self.node_exclusion_expiry,
                             can_exclude=self.mode == "slurm" and self.max_excluded > 0)

    def to_args(self) -> list[str]:
        """The settings as ``--name=value`` arguments."""
        return [f"--{name.replace('_', '-')}={value}" for name, value in vars(self).items()]


def parse_step_args(args: Sequence[str]) -> dict[str, str]:
    """``--name=value`` arguments as a dict (``name`` with underscores).

    Raises:
        ValueError: An argument of another form.
    """
    values = {}
    for arg in args:
        name, eq, value = arg.partition("=")
        if not eq or not name.startswith("--"):
            raise ValueError(f"expected --name=value, got {arg!r}")
        values[name[2:].replace("-", "_")] = value
    return values


def settings_from(values: dict[str, str]) -> Settings:
    """The :class:`Settings` among ``values`` (which it removes from the dict)."""
    fields = Settings.__dataclass_fields__
    known = {name: values.pop(name) for name in list(values) if name in fields}
    ints = {name: int(known[name]) for name in known if fields[name].type == "int"}
    return Settings(**{**known, **ints})  # type: ignore[arg-type]


def load_state(run_dir: str) -> State:
    """The state file, its attempt count taken from the history when the state has none.

    The history outlives a deleted or unreadable state file; numbering attempts on from it
    keeps ``history.tsv`` unambiguous.
    """
    state = history.read_state(run_dir)
    if state.attempt == 0:
        rows = history.read_history(run_dir)
        if rows:
            state = replace(state, attempt=max(row.attempt for row in rows))
    return state


# ---------------------------------------------------------------------------- steps


def warn_if_not_exec(env: Mapping[str, str]) -> None:
    """Log one warning line when the script runs under SLURM's batch shell instead of as it."""
    from launcher.resume import batch_shell

    pid = batch_shell.script_pid(env)
    warning = batch_shell.not_exec_warning(env, pid) if pid else ""
    if warning:
        logger.warning("%s", warning)


def step_config(args: Sequence[str], env: Mapping[str, str]) -> int:
    """Parse and check the script's arguments; print the settings."""
    from launcher.resume import options

    try:
        opts = options.parse_args(args, options.from_environment(env))
        if opts.help:
            emit(HELP=1)
            return 0
        warn_if_not_exec(env)
        options.validate(opts, env)
        job = options.inspect_slurm_job(opts, env) if opts.mode == "slurm" else None
    except options.AutoresumeUsageError as err:
        sys.stderr.write(f"{PROG}: error: {err}\nTry '{PROG} --help'.\n")
        return EXIT_USAGE
    except options.Fatal as err:
        logger.error("error: %s", err)
        return EXIT_FAILURE
    settings = Settings(
        run_dir=opts.run_dir, flag_file=opts.flag_file, mode=opts.mode,
        job_id=job.job_id if job else "local", job_ref=job.job_ref if job else "",
        hosts=",".join(job.hosts) if job else "", nnodes=job.nnodes if job else 1,
        min_nodes=policy.elastic_min(policy.launcher_nnodes(opts.launcher_args)),
        max_failures=int(opts.max_failures), max_attempts=int(opts.max_attempts),
        max_excluded=int(opts.max_excluded), max_stalled=int(opts.max_stalled),
        progress_path=opts.progress_path, max_repeats=int(opts.max_repeats),
        node_failures_to_exclude=int(opts.node_failures_to_exclude),
        node_exclusion_expiry=int(opts.node_exclusion_expiry))
    emit(RUN_DIR=opts.run_dir, LOCK_FILE=os.path.join(opts.run_dir, own_files.LOCK_NAME),
         FLAG_FILE=opts.flag_file, MODE=opts.mode, LAUNCHER=opts.launcher,
         LAUNCHER_ARGS=opts.launcher_args, SRUN_ARGS=opts.srun_args, COMMAND=opts.command,
         JOB_REF=settings.job_ref, NNODES=settings.nnodes,
         # The user's --nnodes (MIN:MAX, for a job that rides out a lost node) replaces ours.
         NNODES_ARGS=[] if policy.launcher_nnodes(opts.launcher_args) else [f"--nnodes={settings.nnodes}"],
         FIRST_HOST=job.hosts[0] if job else "", RDZV_HOST=job.rdzv_host if job else "",
         RDZV_PORT=job.rdzv_port if job else "",
         EXIT_FAILURE=EXIT_FAILURE, EXIT_SIGNAL_BASE=EXIT_SIGNAL_BASE,
         POLICY_ARGS=settings.to_args())
    return 0


def step_resume(settings: Settings) -> int:
    """At the start: record a killed script's attempt; stop at once when there is nothing to do."""
    state = load_state(settings.run_dir)
    flag = own_files.own_file_exists(settings.flag_file)
    if state.running:
        verdict = policy.killed_attempt(state.failures, state.stalled, settings.limits)
        history.append_history(settings.run_dir, history.history_fields(
            state.attempt, state.job_id, state.start, "-", "-", flag, verdict.shown_failures),
            verdict.text)
        history.write_state(settings.run_dir,
                            state.ended(failures=verdict.failures, stalled=verdict.stalled))
        if verdict.verdict == policy.STOP:
            logger.error("error: attempt %s ended without a record and the maximum of %s "
                         "consecutive failures is reached", state.attempt, settings.max_failures)
            emit(STOP=EXIT_FAILURE)
            return 0
    if flag:
        logger.info("finished: %s exists; nothing to run", settings.flag_file)
        emit(STOP=0)
        return 0
    logger.info("mode %s, run dir %s, flag file %s, at most %s consecutive failures",
                settings.mode, settings.run_dir, settings.flag_file, settings.max_failures)
    emit(STOP="", ATTEMPT=state.attempt)
    return 0


def step_start(settings: Settings) -> int:
    """Before an attempt: count it, and mark it running (a killed script leaves the mark)."""
    state = load_state(settings.run_dir)
    attempt = state.attempt + 1
    history.write_state(settings.run_dir, replace(
        state, attempt=attempt, running=True, start=history.now(), job_id=settings.job_id,
        progress=history.newest_mtime(settings.progress_path)))
    logger.info("attempt %s starts", attempt)
    emit(ATTEMPT=attempt)
    return 0


def _read(path: str) -> str | None:
    """A node task's file (this user's, never through a link); None if it is missing or unfit."""
    try:
        return own_files.read_own(path)
    except OSError:
        return None


def read_node_reports(results: str, nnodes: int) -> list[policy.NodeReport | None]:
    """The node tasks' reports in ``results`` (then removed); None for a node without one."""
    import shutil

    reports: list[policy.NodeReport | None] = []
    for index in range(nnodes):
        line = _read(os.path.join(results, f"node.{index}"))
        result = _read(os.path.join(results, f"launcher.{index}")) or ""
        reports.append(None if line is None else policy.parse_node_report(line, result))
    shutil.rmtree(results, ignore_errors=True)
    return reports


@dataclass
class AttemptOutcome:
    """How an attempt ended, over all its nodes: what the decision and the node history need."""

    rc: int
    warned: str
    terminated: str
    nodes: policy.NodesOutcome


def attempt_outcome(settings: Settings, extra: dict[str, str], attempt: int) -> AttemptOutcome:
    """The attempt's exit code, signals, blamed nodes and fingerprint, from the step's arguments
    and the launchers' files in ``--results`` (local mode: one launcher, node 0)."""
    warned, terminated = extra.get("warned", ""), extra.get("terminated", "")
    if settings.mode == "slurm":
        hosts = settings.hosts.split(",") if settings.hosts else []
        srun_rc = int(extra["srun_rc"])
        nodes = policy.nodes_outcome(read_node_reports(extra["results"], settings.nnodes), hosts,
                                     srun_rc)
        for note in nodes.notes:
            logger.info("attempt %s: %s", attempt, note)
        logger.info("attempt %s: launchers exited %s (srun %s)", attempt,
                    " ".join(f"{node}:{code}" for node, code in nodes.codes), srun_rc)
        return AttemptOutcome(nodes.rc, warned or nodes.warned, terminated or nodes.terminated, nodes)
    rc = int(extra["rc"])
    nodes = policy.NodesOutcome(rc=rc)
    if extra.get("results"):
        import shutil

        result = repeats.parse_launcher_result(_read(os.path.join(extra["results"], "launcher.0")) or "")
        shutil.rmtree(extra["results"], ignore_errors=True)
        # Local mode never excludes a node: the roots are kept for the history alone.
        nodes.roots = list(result.roots)
        nodes.fingerprint, nodes.fingerprint_text = result.fingerprint, result.fingerprint_text
    return AttemptOutcome(rc, warned, terminated, nodes)


def attempt_events(attempt: int, failed: bool, progressed: bool,
                   nodes: policy.NodesOutcome) -> list[repeats.Event]:
    """The attempt's rows of ``node_history.tsv``: how it ended, then the nodes it blamed.

    An attempt that did not fail still names the nodes it lost (an elastic job that went on and
    finished without a crashed node): the node history must say which node that was.
    """
    fingerprint = nodes.fingerprint or "-"
    if not failed:
        return [repeats.Event(attempt, repeats.NO_NODE, repeats.CLEAN),
                *(repeats.Event(attempt, node, repeats.BAD, "-", nodes.why[node]) if node in nodes.why
                  else repeats.Event(attempt, node, repeats.ROOT, "-", policy.LOST_BY_THE_LAUNCHERS)
                  for node in nodes.lost)]
    events = [repeats.Event(attempt, repeats.NO_NODE, repeats.FAILED, fingerprint,
                            nodes.fingerprint_text or "-")]
    if progressed:
        events.append(repeats.Event(attempt, repeats.NO_NODE, repeats.PROGRESS))
    events += [repeats.Event(attempt, node, repeats.ROOT, fingerprint, nodes.fingerprint_text or "-")
               for node in nodes.roots]
    events += [repeats.Event(attempt, node, repeats.BAD, "-", nodes.why.get(node, "-"))
               for node in nodes.bad_nodes]
    return events


def step_decide(settings: Settings, extra: dict[str, str], env: Mapping[str, str]) -> int:
    """After an attempt: the verdict, written to the state; the history fields; the exclusion."""
    end = history.now()
    state = load_state(settings.run_dir)
    attempt = state.attempt
    out = attempt_outcome(settings, extra, attempt)
    rc, slurm = out.rc, settings.mode == "slurm"
    flag = own_files.own_file_exists(settings.flag_file)
    newest = history.newest_mtime(settings.progress_path)
    progressed = bool(newest) and newest != state.progress
    # Whether the attempt counts as a failure is the verdict's to say; a first decision without
    # the repeat tells it, and the node history with this attempt's rows then says whether the
    # failure repeats.
    probe = policy.Attempt(number=attempt, rc=rc, flag=flag, warned=out.warned,
                           terminated=out.terminated, local=not slurm, failures=state.failures,
                           stalled=state.stalled, progressed=progressed)
    failed = policy.decide(probe, settings.limits).failed
    past = history.read_node_history(settings.run_dir)
    # A launcher that stopped a crash loop (66) ended a failed attempt, though the verdict stops
    # the loop instead of counting it: its rows name the failure and its root nodes (a later
    # submission counts them against the node), not a clean attempt (which lets excluded nodes back).
    events = attempt_events(attempt, failed or rc == EXIT_REPEATED_FAILURE,
                            progressed and bool(settings.progress_path), out.nodes)
    repeat = repeats.repeat_of([*past, *events], out.nodes.fingerprint) if failed else None
    repeated = repeats.describe(repeat) if repeats.is_bug(repeat, settings.rules) else ""
    verdict = policy.decide(replace(probe, repeated=repeated), settings.limits)
    history.write_state(settings.run_dir,
                        state.ended(failures=verdict.failures, stalled=verdict.stalled))
    excl, shrink = policy.Exclusion(), 0
    if slurm and verdict.verdict == policy.CONTINUE and not out.terminated:
        from launcher.resume.options import job_node_count

        # The count the requeued job asks for: what it has left, when the launchers accept it.
        needed = policy.needed_nodes(settings.nnodes, job_node_count(settings.job_ref),
                                     settings.min_nodes)
        if needed < settings.nnodes:
            shrink = needed
            logger.info("attempt %s: SLURM removed %s lost node(s) from job %s; --nnodes MIN is %s, "
                        "so the requeued job asks for the %s node(s) it has left",
                        attempt, settings.nnodes - needed, settings.job_ref, settings.min_nodes, needed)
        excl, changes = exclude(settings, [*past, *events], out.nodes, env, needed)
        events += changes
    if verdict.verdict == policy.STOP:
        events.append(repeats.Event(attempt, repeats.NO_NODE, repeats.STOPPED))
    history.append_node_history(settings.run_dir, events)
    emit(VERDICT=verdict.verdict, SCRIPT_RC=verdict.exit_code,
         HISTORY_HEADER=history.HISTORY_HEADER,
         DECISION=history.one_field(verdict.text),
         HISTORY_FIELDS=history.history_fields(attempt, settings.job_id, state.start, end, rc,
                                               flag, verdict.shown_failures),
         DECISION_REQUEUED=history.one_field(
             policy.requeued_text(verdict.text, settings.job_ref, excl, shrink)),
         EXCLUDE_UPDATE="1" if excl.update else "", EXCLUDE_LIST=",".join(excl.nodes),
         NUM_NODES_UPDATE=shrink or "", NODE_COUNT_FIELDS=policy.node_count_fields(
             shrink, settings.nnodes, env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")))
    return 0


def exclude(settings: Settings, events: list[repeats.Event], nodes: policy.NodesOutcome,
            env: Mapping[str, str], needed: int) -> tuple[policy.Exclusion, list[repeats.Event]]:
    """The exclusion list for the requeued job (which needs ``needed`` nodes);
    ``RUN_DIR/excluded_nodes`` updated to match.

    Returns:
        The exclusion, and the ``excluded``/``expired`` rows for the node history.
    """
    if settings.max_excluded <= 0:
        return policy.Exclusion(), []
    attempt = max((e.attempt for e in events), default=0)
    previous = history.read_excluded(settings.run_dir)
    expired = repeats.expired_nodes(events, previous, settings.node_exclusion_expiry)
    kept = [node for node in previous if node not in expired]
    changes = [repeats.Event(attempt, node, repeats.EXPIRED, "-",
                             f"{settings.node_exclusion_expiry} clean attempts") for node in expired]
    why = dict(nodes.why)
    # With the expiries: a node that comes back is not excluded again for its old failures.
    for node, reason in repeats.bad_nodes([*events, *changes], nodes.fingerprint, settings.rules):
        why.setdefault(node, reason)
    new = [node for node in why if node not in kept]
    for node in new:
        logger.info("attempt %s: excluding node %s: %s", attempt, node, why[node])
    for node in expired:
        logger.info("attempt %s: node %s may come back: %s clean attempts since it was excluded",
                    attempt, node, settings.node_exclusion_expiry)
    partition = None
    if kept or new:
        from launcher.resume.options import partition_size

        partition = partition_size(env)
    excl = policy.exclusion(kept, new, settings.max_excluded, partition, needed)
    if expired and not excl.update:
        excl = policy.Exclusion((), True)
    if excl.note:
        logger.info("%s", excl.note)
    changes += [repeats.Event(attempt, node, repeats.EXCLUDED, "-", why[node])
                for node in excl.nodes if node in new]
    if excl.update:
        history.write_excluded(settings.run_dir, excl.nodes)
    return excl, changes


def step_requeue_failed(settings: Settings, extra: dict[str, str]) -> int:
    """``scontrol requeue`` failed: stop, and start the next submission's counts afresh."""
    state = load_state(settings.run_dir)
    history.write_state(settings.run_dir, state.ended(failures=0, stalled=0))
    history.append_node_history(settings.run_dir,
                                [repeats.Event(state.attempt, repeats.NO_NODE, repeats.STOPPED)])
    emit(VERDICT=policy.STOP, SCRIPT_RC=EXIT_FAILURE,
         DECISION=history.one_field(policy.requeue_failed_text(extra.get("decision", ""))))
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one step; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    # The script receives the stop signals itself and acts on them after this step; a step cut
    # short by one would leave the run directory's files behind its decision.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(format=f"%(asctime)s {PROG}: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S",
                        level=logging.INFO, stream=sys.stderr)
    if not args:
        sys.stderr.write(__doc__ or "")
        return EXIT_USAGE
    step, rest = args[0], args[1:]
    if step == "config":
        return step_config(rest, env)
    try:
        extra = parse_step_args(rest)
        settings = settings_from(extra)
        steps = {
            "resume": lambda: step_resume(settings),
            "start": lambda: step_start(settings),
            "decide": lambda: step_decide(settings, extra, env),
            "requeue-failed": lambda: step_requeue_failed(settings, extra),
        }
        if step not in steps:
            raise ValueError(f"unknown step {step!r}")
    except (ValueError, TypeError) as err:
        logger.error("error: python -m launcher.resume: %s", err)
        return EXIT_USAGE
    try:
        return steps[step]()
    except OSError as err:
        logger.error("error: %s: %s", step, err)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
