"""Whether ``autoresume.sh`` runs as SLURM's batch shell, or as a child of it.

SLURM delivers ``--signal=B:SIG@T`` and ``scancel --batch --signal=SIG`` to the batch shell
alone. A batch script that runs ``scripts/autoresume.sh ...`` without ``exec`` is that shell; it
dies of the SIGUSR1 (bash's default action), and the script below it never hears of the
warning: the stop checkpoint and the requeue are lost. SLURM starts the batch script from
``slurmstepd``; a script that was exec'd has that ``slurmstepd`` as its parent, one that was not
has the batch script's shell (whose parent is the ``slurmstepd``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

# SLURM_STEP_ID of the batch step: "batch" in newer releases, SLURM_BATCH_SCRIPT (0xfffffffe)
# in older ones; SLURM 22.05 does not set it in the batch script at all.
BATCH_STEP_IDS = ("", "batch", "4294967294")
STEPD = "slurmstepd"


@dataclass(frozen=True)
class Proc:
    """What the check needs of one process.

    Attributes:
        comm: The process's name (``/proc/PID/comm``).
        ppid: Its parent's pid.
        cmdline: Its command line, arguments joined by spaces.
    """

    comm: str
    ppid: int
    cmdline: str


def read_proc(pid: int) -> Proc | None:
    """The process ``pid`` from ``/proc``; None when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so split at the last ')'.
    head, _, tail = stat.rpartition(")")
    fields = tail.split()
    if "(" not in head or len(fields) < 2 or not fields[1].isdigit():
        return None
    return Proc(head.partition("(")[2], int(fields[1]), cmdline)


def not_exec_warning(env: Mapping[str, str], script_pid: int,
                     proc: Callable[[int], Proc | None] = read_proc) -> str:
    """The warning for a script that runs in SLURM's batch step but is not its batch shell.

    Args:
        env: The script's environment.
        script_pid: The script's pid (``$$``).
        proc: Reads a process (``/proc`` by default).

    Returns:
        One line naming the problem and the fix, when ``env`` is a batch step's (``SLURM_JOB_ID``
        set, ``SLURM_STEP_ID`` unset or the batch step's) and the script's parent is not
        ``slurmstepd`` while its grandparent is (the parent is the batch script's shell); else
        "" (exec'd, run by srun, outside SLURM, or a process that cannot be read: no guess).
    """
    if not env.get("SLURM_JOB_ID") or env.get("SLURM_STEP_ID", "") not in BATCH_STEP_IDS:
        return ""
    me = proc(script_pid)
    parent = proc(me.ppid) if me else None
    if parent is None or parent.comm == STEPD:
        return ""
    grandparent = proc(parent.ppid)
    if grandparent is None or grandparent.comm != STEPD:
        return ""
    shell = parent.cmdline or parent.comm
    return (f"warning: this script is not the batch shell of job {env['SLURM_JOB_ID']}: its parent "
            f"(pid {me.ppid}: {shell}) is, and SLURM sends --signal=B:... warnings and "
            "'scancel --batch' to that shell alone, which dies of them (no stop checkpoint, no "
            "requeue); exec it: exec scripts/autoresume.sh ... (or exec ft_autoresume ...)")


def script_pid(env: Mapping[str, str]) -> int | None:
    """The script's pid as it passes it (``AUTORESUME_SCRIPT_PID``), None if absent or bad."""
    text = env.get("AUTORESUME_SCRIPT_PID", "")
    return int(text) if text.isdigit() and int(text) > 0 else None

