"""The options of ``scripts/autoresume.sh``: parsing, validation and, in slurm mode, the job.

``autoresume.sh --help`` documents them; the script answers ``--help`` itself (so that it works
even where this package cannot be imported) and hands every other argument to :func:`configure`.
A flag beats its environment variable.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.resume import own_files
from launcher.resume.policy import is_count

MAX_COUNT = 1_000_000
"""Bound of --max-failures, --max-attempts, --max-stalled, --max-repeats,
--node-failures-to-exclude and --node-exclusion-expiry."""
SLURM_TIMEOUT_S = 60

# Every option takes a value (--help aside); only the long forms also take "--name=value".
_OPTIONS = {
    "-d": "run_dir", "--run-dir": "run_dir", "-f": "flag_file", "--flag-file": "flag_file",
    "-m": "max_failures", "--max-failures": "max_failures", "--max-attempts": "max_attempts",
    "-a": "launcher_arg", "--launcher-arg": "launcher_arg", "--launcher-args": "launcher_args",
    "--launcher": "launcher", "--mode": "mode", "--rdzv-port": "rdzv_port",
    "--srun-args": "srun_args", "--max-excluded": "max_excluded",
    "--progress-path": "progress_path", "--max-stalled": "max_stalled",
    "--max-repeats": "max_repeats", "--node-failures-to-exclude": "node_failures_to_exclude",
    "--node-exclusion-expiry": "node_exclusion_expiry",
}


class AutoresumeUsageError(Exception):
    """A bad option or environment variable, or a job the script cannot continue: exit 2."""


class Fatal(Exception):
    """Something the script needs is unavailable (e.g. scontrol fails): exit 1."""


@dataclass
class Options:
    """The script's settings, as given (strings) and then as validated.

    Attributes mirror the options of ``autoresume.sh --help``; ``launcher_args`` is the whole
    argument list for ft_launcher (``--launcher-args`` split, then the ``-a`` ones).
    """

    run_dir: str = ""
    flag_file: str = ""
    max_failures: str = "3"
    max_attempts: str = "0"
    launcher_args_str: str = ""
    launcher_args_set: bool = False
    extra_launcher_args: list[str] = field(default_factory=list)
    launcher: str = "ft_launcher"
    mode: str = "auto"
    rdzv_port: str = ""
    srun_args_str: str = ""
    max_excluded: str = "4"
    progress_path: str = ""
    max_stalled: str = "2"
    max_repeats: str = "2"
    node_failures_to_exclude: str = "2"
    node_exclusion_expiry: str = "3"
    command: list[str] = field(default_factory=list)
    help: bool = False
    launcher_args: list[str] = field(default_factory=list)
    srun_args: list[str] = field(default_factory=list)


def from_environment(env: Mapping[str, str]) -> Options:
    """The settings the environment gives (an empty variable counts as unset, but an empty
    ``AUTORESUME_LAUNCHER_ARGS`` still means "no launcher arguments")."""
    return Options(
        run_dir=env.get("AUTORESUME_RUN_DIR", ""),
        flag_file=env.get("FAULT_TOL_FINISHED_FLAG_FILE", ""),
        max_failures=env.get("AUTORESUME_MAX_FAILURES") or "3",
        max_attempts=env.get("AUTORESUME_MAX_ATTEMPTS") or "0",
        launcher_args_str=env.get("AUTORESUME_LAUNCHER_ARGS", ""),
        launcher_args_set="AUTORESUME_LAUNCHER_ARGS" in env,
        launcher=env.get("FT_LAUNCHER") or "ft_launcher",
        mode=env.get("AUTORESUME_MODE") or "auto",
        rdzv_port=env.get("AUTORESUME_RDZV_PORT", ""),
        srun_args_str=env.get("AUTORESUME_SRUN_ARGS", ""),
        max_excluded=env.get("AUTORESUME_MAX_EXCLUDED") or "4",
        progress_path=env.get("AUTORESUME_PROGRESS_PATH", ""),
        max_stalled=env.get("AUTORESUME_MAX_STALLED") or "2",
        max_repeats=env.get("AUTORESUME_MAX_REPEATS") or "2",
        node_failures_to_exclude=env.get("AUTORESUME_NODE_FAILURES_TO_EXCLUDE") or "2",
        node_exclusion_expiry=env.get("AUTORESUME_NODE_EXCLUSION_EXPIRY") or "3")


def parse_args(args: Sequence[str], opts: Options) -> Options:
    """Apply the command line ``args`` to ``opts`` (in place) and return it.

    Raises:
        AutoresumeUsageError: An unknown option, or an option without its value.
    """
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            opts.help = True
            return opts
        name, eq, value = arg.partition("=")
        if arg in _OPTIONS:
            if i + 1 >= len(args):
                raise AutoresumeUsageError(f"option {arg} needs a value")
            key, value, i = _OPTIONS[arg], args[i + 1], i + 2
        elif eq and name.startswith("--") and name in _OPTIONS:
            key, i = _OPTIONS[name], i + 1
        elif arg == "--":
            opts.command = list(args[i + 1:])
            return opts
        elif arg.startswith("-"):
            raise AutoresumeUsageError(f"unknown option '{arg}'")
        else:
            opts.command = list(args[i:])
            return opts
        if key == "launcher_arg":
            opts.extra_launcher_args.append(value)
        elif key == "launcher_args":
            opts.launcher_args_str, opts.launcher_args_set = value, True
        elif key == "srun_args":
            opts.srun_args_str = value
        else:
            setattr(opts, key, value)
    return opts


def _count(value: str, low: int, high: int, message: str) -> int:
    if not is_count(value) or not low <= int(value) <= high:
        raise AutoresumeUsageError(f"{message}, got '{value}'")
    return int(value)


def _resolve_launcher(launcher: str) -> str:
    """The launcher executable's real path, found as a shell would (``command -v``)."""
    found = launcher if "/" in launcher and os.path.lexists(launcher) else None
    if "/" not in launcher:
        found = shutil.which(launcher)
    if found is None:
        raise AutoresumeUsageError(f"ft_launcher not found: --launcher (FT_LAUNCHER) is '{launcher}'")
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise AutoresumeUsageError(f"--launcher (FT_LAUNCHER) '{launcher}' is not an executable file")
    return os.path.realpath(found)


def validate(opts: Options, env: Mapping[str, str]) -> Options:
    """Check and normalise ``opts`` (in place), in the order the errors are reported.

    Creates the run directory (not writable by group or others) and its 0600 lock file once
    everything else is valid. The run directory must be this user's and closed to other
    writers, and the loop's files in it (and the finished flag) this user's and no symbolic
    links (:mod:`launcher.resume.own_files`): another user must not fool or block the loop.

    Raises:
        AutoresumeUsageError: With the flag, its variable and the value in the message.
    """
    if not opts.command:
        raise AutoresumeUsageError("no training command given (TRAINING_SCRIPT [ARGS...])")
    max_failures = _count(opts.max_failures, 1, MAX_COUNT, "--max-failures (AUTORESUME_MAX_FAILURES)"
                          f" must be a whole number >= 1 and <= {MAX_COUNT}")
    max_attempts = _count(opts.max_attempts, 0, MAX_COUNT, "--max-attempts (AUTORESUME_MAX_ATTEMPTS)"
                          f" must be a whole number <= {MAX_COUNT} (0 = no limit)")
    max_excluded = _count(opts.max_excluded, 0, 1000, "--max-excluded (AUTORESUME_MAX_EXCLUDED)"
                          " must be a whole number <= 1000")
    max_stalled = _count(opts.max_stalled, 1, MAX_COUNT, "--max-stalled (AUTORESUME_MAX_STALLED)"
                         f" must be a whole number >= 1 and <= {MAX_COUNT}")
    opts.max_failures, opts.max_attempts = str(max_failures), str(max_attempts)
    opts.max_excluded, opts.max_stalled = str(max_excluded), str(max_stalled)
    opts.max_repeats = str(_count(opts.max_repeats, 0, MAX_COUNT, "--max-repeats (AUTORESUME_MAX_REPEATS)"
                                  f" must be a whole number <= {MAX_COUNT} (0 = never stop for a repeat)"))
    opts.node_failures_to_exclude = str(_count(
        opts.node_failures_to_exclude, 1, MAX_COUNT, "--node-failures-to-exclude "
        f"(AUTORESUME_NODE_FAILURES_TO_EXCLUDE) must be a whole number >= 1 and <= {MAX_COUNT}"))
    opts.node_exclusion_expiry = str(_count(
        opts.node_exclusion_expiry, 0, MAX_COUNT, "--node-exclusion-expiry "
        f"(AUTORESUME_NODE_EXCLUSION_EXPIRY) must be a whole number <= {MAX_COUNT} (0 = never)"))
    if opts.mode == "auto":
        in_batch = env.get("SLURM_JOB_ID") and not env.get("SLURM_STEP_ID")
        opts.mode = "slurm" if in_batch else "local"
    elif opts.mode == "slurm":
        if not env.get("SLURM_JOB_ID"):
            raise AutoresumeUsageError("--mode slurm needs to run inside an sbatch job (SLURM_JOB_ID is not set)")
    elif opts.mode != "local":
        raise AutoresumeUsageError(f"--mode (AUTORESUME_MODE) must be auto, slurm or local, got '{opts.mode}'")
    if opts.rdzv_port:
        port = _count(opts.rdzv_port, 1, 65535,
                      "--rdzv-port (AUTORESUME_RDZV_PORT) must be a TCP port 1-65535")
        opts.rdzv_port = str(port)
    opts.launcher = _resolve_launcher(opts.launcher)

    run_dir = opts.run_dir or "autoresume"
    try:
        own_files.check_path_links(run_dir)
    except own_files.ForeignFileError as err:
        raise AutoresumeUsageError(f"--run-dir (AUTORESUME_RUN_DIR): {err}") from None
    try:
        created = not os.path.lexists(run_dir)
        os.makedirs(run_dir, exist_ok=True)
        if created:   # under a umask of 002 it would be group-writable, which check_run_dir refuses
            os.chmod(run_dir, stat.S_IMODE(os.stat(run_dir).st_mode) & ~0o022)
    except OSError:
        raise AutoresumeUsageError(f"cannot create --run-dir (AUTORESUME_RUN_DIR) '{run_dir}'") from None
    opts.run_dir = os.path.realpath(run_dir)
    opts.flag_file = os.path.abspath(opts.flag_file or os.path.join(opts.run_dir, "finished.flag"))
    if not os.path.isdir(os.path.dirname(opts.flag_file)):
        raise AutoresumeUsageError("the directory of --flag-file (FAULT_TOL_FINISHED_FLAG_FILE) "
                         f"'{opts.flag_file}' does not exist")
    try:
        own_files.check_run_dir(opts.run_dir)
        own_files.check_run_dir_files(opts.run_dir)
        own_files.check_entry(opts.flag_file)
        own_files.prepare_lock_file(os.path.join(opts.run_dir, own_files.LOCK_NAME))
    except own_files.ForeignFileError as err:
        raise AutoresumeUsageError(str(err)) from None
    except OSError as err:
        raise AutoresumeUsageError(f"cannot use --run-dir (AUTORESUME_RUN_DIR) '{opts.run_dir}': {err}") from None
    opts.launcher_args = opts.launcher_args_str.split()
    if opts.mode == "local" and not opts.launcher_args_set and not opts.extra_launcher_args:
        opts.launcher_args = ["--standalone"]
    opts.launcher_args += opts.extra_launcher_args
    opts.srun_args = opts.srun_args_str.split()
    return opts


# ---------------------------------------------------------------------------- slurm


@dataclass
class SlurmJob:
    """What slurm mode needs to know about its job, read once at the start.

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        job_ref: The job to requeue or update: ``ARRAYJOBID_TASKID`` for an array task (one
            task of an array has SLURM_JOB_ID equal to SLURM_ARRAY_JOB_ID, which scontrol takes
            for the whole array).
        hosts: The allocation's node names, in SLURM_NODEID order (node task i runs on host i).
        rdzv_host: The first node's address as SLURM knows it (NodeAddr): where node names do
            not resolve, that is what does.
        rdzv_port: The rendezvous port on the first node.
        nnodes: Nodes in the allocation.
    """

    job_id: str
    job_ref: str
    hosts: list[str]
    rdzv_host: str
    rdzv_port: int
    nnodes: int


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True,
                          timeout=SLURM_TIMEOUT_S, check=False)


def _port_is_free(port: int) -> bool:
    try:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=SLURM_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return True
    return not out.strip()


def pick_rdzv_port(job_id: int, first_host: str, env: Mapping[str, str]) -> int:
    """29500 + job id % 1000, or the next port not in use when this is the first host.

    The batch shell runs on the first node, where the rendezvous store will listen: ports taken
    there (another job, or a store that has not let go yet) are skipped.
    """
    port = 29500 + job_id % 1000
    if first_host == env.get("SLURMD_NODENAME") and shutil.which("ss"):
        for _ in range(100):
            if _port_is_free(port):
                break
            port += 1
    return port


def inspect_slurm_job(opts: Options, env: Mapping[str, str]) -> SlurmJob:
    """Check that this job can be continued, and read its allocation.

    Raises:
        AutoresumeUsageError: The job is not a batch job, or cannot be requeued.
        Fatal: scontrol fails.
    """
    job_id = env["SLURM_JOB_ID"]
    array_id, task_id = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job_ref = f"{array_id}_{task_id}" if array_id and task_id else job_id
    try:
        info = _scontrol("show", "job", job_id)
        if info.returncode != 0:
            raise Fatal(f"cannot read job {job_id} with scontrol: {(info.stdout + info.stderr).strip()}")
        if re.search(r"(^|\s)BatchFlag=0(\s|$)", info.stdout):
            raise AutoresumeUsageError(f"slurm mode runs in an sbatch job, but job {job_id} is interactive "
                             "(salloc/srun); use --mode local")
        if re.search(r"(^|\s)Requeue=0(\s|$)", info.stdout):
            raise AutoresumeUsageError(f"job {job_id} cannot be requeued, so it cannot be continued: "
                             "submit it with sbatch --requeue")
        nodelist = env.get("SLURM_JOB_NODELIST", "")
        expanded = _scontrol("show", "hostnames", nodelist)
        hosts = expanded.stdout.split() if expanded.returncode == 0 else None
        if hosts is None:
            raise Fatal(f"cannot expand the node list SLURM_JOB_NODELIST='{nodelist}'")
        if not hosts:
            raise Fatal(f"empty node list in SLURM_JOB_NODELIST='{nodelist}'")
        node_info = _scontrol("show", "node", "-o", hosts[0]).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Fatal(f"scontrol failed: {err}") from None
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", node_info)
    rdzv_host = match.group(1) if match else hosts[0]
    if opts.rdzv_port:
        port = int(opts.rdzv_port)
    else:
        port = pick_rdzv_port(int(job_id) if job_id.isdigit() else 0, hosts[0], env)
    nnodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    return SlurmJob(job_id, job_ref, hosts, rdzv_host, port, int(nnodes))


def job_node_count(job_ref: str) -> int | None:
    """``NumNodes`` of the job now (``scontrol show job``; smaller than at its start when SLURM
    removed a lost node from a ``--no-kill`` job), None when unknown."""
    try:
        out = _scontrol("show", "job", "-o", job_ref).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    # A running job shows "NumNodes=2"; a pending one may show a range "2-3" (take its minimum).
    match = re.search(r"(?:^|\s)NumNodes=(\d+)", out)
    return int(match.group(1)) if match else None


def partition_size(env: Mapping[str, str]) -> int | None:
    """Nodes in the job's partition (``sinfo``), None when unknown."""
    command = ["sinfo", "-h", "-N", "-o", "%N"]
    if env.get("SLURM_JOB_PARTITION"):
        command[3:3] = ["-p", env["SLURM_JOB_PARTITION"]]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len({line.strip() for line in out.splitlines() if line.strip()}) or None
