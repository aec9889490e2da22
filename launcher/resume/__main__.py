"""``python -m launcher.resume STEP ...``: the steps ``scripts/autoresume.sh`` runs.

Each step prints shell assignments (``NAME='value'``, ``NAME=('a' 'b')``), every value quoted
with :func:`shlex.quote`, for the script to ``eval``; log lines go to stderr in the script's
format. Steps:

- ``config ARGS...``: parse and check the script's options (and, in slurm mode, the job);
  prints the settings, among them ``POLICY_ARGS``, the arguments of every later step.
- ``resume POLICY_ARGS``: at the start, under the run directory's lock: record an attempt whose
  script was killed, and say whether to stop at once (``STOP=code``).
- ``start POLICY_ARGS``: before an attempt: count it and mark it running; prints ``ATTEMPT``.
- ``decide POLICY_ARGS --rc=N | --srun-rc=N --results=DIR [--warned=SIG] [--terminated=SIG]``:
  after it: the verdict, the history line's fields (and the file's header, which the script
  writes with the first line: a history file never holds a header alone) and, in slurm mode,
  the nodes to exclude.
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

from launcher.exit_codes import EXIT_FAILURE, EXIT_SIGNAL_BASE, EXIT_USAGE
from launcher.resume import history, own_files, policy
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
    max_failures: int = 3
    max_attempts: int = 0
    max_excluded: int = 4
    max_stalled: int = 2
    progress_path: str = ""

    @property
    def limits(self) -> policy.Limits:
        """The loop's bounds."""
        return policy.Limits(self.max_failures, self.max_attempts, self.max_stalled,
                             self.progress_path)

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


def step_config(args: Sequence[str], env: Mapping[str, str]) -> int:
    """Parse and check the script's arguments; print the settings."""
    from launcher.resume import options

    try:
        opts = options.parse_args(args, options.from_environment(env))
        if opts.help:
            emit(HELP=1)
            return 0
        options.validate(opts, env)
        job = options.inspect_slurm_job(opts, env) if opts.mode == "slurm" else None
    except options.UsageError as err:
        sys.stderr.write(f"{PROG}: error: {err}\nTry '{PROG} --help'.\n")
        return EXIT_USAGE
    except options.Fatal as err:
        logger.error("error: %s", err)
        return EXIT_FAILURE
    settings = Settings(
        run_dir=opts.run_dir, flag_file=opts.flag_file, mode=opts.mode,
        job_id=job.job_id if job else "local", job_ref=job.job_ref if job else "",
        hosts=",".join(job.hosts) if job else "", nnodes=job.nnodes if job else 1,
        max_failures=int(opts.max_failures), max_attempts=int(opts.max_attempts),
        max_excluded=int(opts.max_excluded), max_stalled=int(opts.max_stalled),
        progress_path=opts.progress_path)
    emit(RUN_DIR=opts.run_dir, LOCK_FILE=os.path.join(opts.run_dir, own_files.LOCK_NAME),
         FLAG_FILE=opts.flag_file, MODE=opts.mode, LAUNCHER=opts.launcher,
         LAUNCHER_ARGS=opts.launcher_args, SRUN_ARGS=opts.srun_args, COMMAND=opts.command,
         JOB_REF=settings.job_ref, NNODES=settings.nnodes,
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


def step_decide(settings: Settings, extra: dict[str, str], env: Mapping[str, str]) -> int:
    """After an attempt: the verdict, written to the state; the history fields; the exclusion."""
    end = history.now()
    state = load_state(settings.run_dir)
    attempt = state.attempt
    warned, terminated = extra.get("warned", ""), extra.get("terminated", "")
    slurm = settings.mode == "slurm"
    bad_nodes: list[str] = []
    if slurm:
        hosts = settings.hosts.split(",") if settings.hosts else []
        srun_rc = int(extra["srun_rc"])
        nodes = policy.nodes_outcome(read_node_reports(extra["results"], settings.nnodes), hosts,
                                     srun_rc)
        for note in nodes.notes:
            logger.info("attempt %s: %s", attempt, note)
        logger.info("attempt %s: launchers exited %s (srun %s)", attempt,
                    " ".join(f"{node}:{code}" for node, code in nodes.codes), srun_rc)
        rc, bad_nodes = nodes.rc, nodes.bad_nodes
        warned, terminated = warned or nodes.warned, terminated or nodes.terminated
    else:
        rc = int(extra["rc"])
    flag = own_files.own_file_exists(settings.flag_file)
    newest = history.newest_mtime(settings.progress_path)
    verdict = policy.decide(policy.Attempt(
        number=attempt, rc=rc, flag=flag, warned=warned, terminated=terminated,
        local=not slurm, failures=state.failures, stalled=state.stalled,
        progressed=bool(newest) and newest != state.progress), settings.limits)
    history.write_state(settings.run_dir,
                        state.ended(failures=verdict.failures, stalled=verdict.stalled))
    excl = policy.Exclusion()
    if slurm and verdict.verdict == policy.CONTINUE and not terminated:
        excl = exclude(settings, bad_nodes, env)
    emit(VERDICT=verdict.verdict, SCRIPT_RC=verdict.exit_code,
         HISTORY_HEADER=history.HISTORY_HEADER,
         DECISION=history.one_field(verdict.text),
         HISTORY_FIELDS=history.history_fields(attempt, settings.job_id, state.start, end, rc,
                                               flag, verdict.shown_failures),
         DECISION_REQUEUED=history.one_field(
             policy.requeued_text(verdict.text, settings.job_ref, excl)),
         EXCLUDE_UPDATE="1" if excl.update else "", EXCLUDE_LIST=",".join(excl.nodes))
    return 0


def exclude(settings: Settings, bad_nodes: list[str], env: Mapping[str, str]) -> policy.Exclusion:
    """The exclusion list for the requeued job; ``RUN_DIR/excluded_nodes`` updated to match."""
    if settings.max_excluded <= 0:
        return policy.Exclusion()
    previous = history.read_excluded(settings.run_dir)
    partition = None
    if previous or bad_nodes:
        from launcher.resume.options import partition_size

        partition = partition_size(env)
    excl = policy.exclusion(previous, bad_nodes, settings.max_excluded, partition,
                            settings.nnodes)
    if excl.note:
        logger.info("%s", excl.note)
    if excl.update:
        history.write_excluded(settings.run_dir, excl.nodes)
    return excl


def step_requeue_failed(settings: Settings, extra: dict[str, str]) -> int:
    """``scontrol requeue`` failed: stop, and start the next submission's counts afresh."""
    state = load_state(settings.run_dir)
    history.write_state(settings.run_dir, state.ended(failures=0, stalled=0))
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
