"""Exit codes of ``ft_launcher``, defined once.

An auto-resume loop reads them to decide whether to continue. :data:`EXIT_CODES` is the one
table: ``ft_launcher --help`` prints it (:func:`help_epilog`), and
``tests/unit/test_exit_codes.py`` checks that the copies in ``scripts/autoresume.sh`` (its
help text), ``docs/launcher.md`` and ``docs/autoresume.md``
agree with it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

EXIT_SUCCESS = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_SHUTDOWN_REQUESTED = 64
EXIT_NODE_EXCLUDED = 65
EXIT_REPEATED_FAILURE = 66
"""The same failure ended ``--ft-max-no-progress-cycles`` cycles in a row without progress, or
before the first step (``launcher/decision/crash_loop.py``); ``--ft-no-restart-exit-code`` may choose another code."""
EXIT_SIGNAL_BASE = 128
"""A forced stop by signal N (the third stop signal): the launcher exits ``EXIT_SIGNAL_BASE + N``.
A graceful stop by signal exits :data:`EXIT_SUCCESS` or :data:`EXIT_FAILURE`."""
AUTORESUME_EXIT_NO_PROGRESS = 3
"""``scripts/autoresume.sh``'s own code (decided by ``launcher/resume/policy.py``): it stopped because
``--max-stalled`` failed attempts in a row left no newer file under ``--progress-path``. Never
an ft_launcher code; distinct from all of :data:`EXIT_CODES`."""
AUTORESUME_ONLY_CODES = {"EXIT_NO_PROGRESS": AUTORESUME_EXIT_NO_PROGRESS}


class LauncherUsageError(Exception):
    """``ft_launcher``'s command line or environment cannot be run; nothing was started.

    :func:`launcher.cli.main` prints the message as a usage error (exit :data:`EXIT_USAGE`). It
    is here, beside its exit code, because the options, the event log and the run directory all
    raise it (autoresume's own is :class:`launcher.resume.options.AutoresumeUsageError`).
    """


@dataclass(frozen=True)
class ExitCode:
    """One row of the exit code table.

    Attributes:
        name: The constant's name (also the name of ``scripts/autoresume.sh``'s copy).
        value: The constant's value.
        code: How the code is written in help texts and docs (``128+N`` for signals).
        meaning: What the launcher means by it (``--help`` and ``docs/launcher.md``).
        autoresume: What an auto-resume loop should do.
        keyword: A word every description of this code mentions (checked in the copies).
    """

    name: str
    value: int
    code: str
    meaning: str
    autoresume: str
    keyword: str


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode("EXIT_SUCCESS", EXIT_SUCCESS, "0",
             "workers succeeded; or the launcher was stopped by SIGTERM/SIGINT/SIGHUP/SIGQUIT (a "
             "preemption) and every worker exited 0 within --term-timeout; or the job ended while "
             "this node waited as a spare",
             "check the finished flag file (and whether this loop saw a stop signal)", ""),
    ExitCode("EXIT_FAILURE", EXIT_FAILURE, "1",
             "workers failed and no restarts were left, or the rendezvous failed (unreachable store, "
             "a port held by another program, join timeout), or after a stop signal a worker failed "
             "or had to be killed",
             "continue (counts as a failure), unless this loop saw a stop signal", "fail"),
    ExitCode("EXIT_USAGE", EXIT_USAGE, "2",
             "invalid arguments or configuration (including --rdzv-conf values)",
             "stop (nothing will change on retry)", "usage"),
    ExitCode("EXIT_SHUTDOWN_REQUESTED", EXIT_SHUTDOWN_REQUESTED, "64",
             "a rank requested ShutdownWorkload: do not continue (every node exits 64)",
             "stop: do not continue", "ShutdownWorkload"),
    ExitCode("EXIT_NODE_EXCLUDED", EXIT_NODE_EXCLUDED, "65",
             "this node left the job: a rank requested ExcludeThisNode, the node check failed, or "
             "this node's ranks were the root of the same failure in consecutive cycles while the job "
             "could go on without it",
             "continue without this node", "ExcludeThisNode"),
    ExitCode("EXIT_REPEATED_FAILURE", EXIT_REPEATED_FAILURE, "66",
             "the same failure ended --ft-max-no-progress-cycles cycles in a row without progress (or "
             "before the first step): a "
             "restart will not fix it (the code can be changed with --ft-no-restart-exit-code)",
             "stop: do not requeue (a repeating failure)", "repeat"),
    ExitCode("EXIT_SIGNAL_BASE", EXIT_SIGNAL_BASE, "128+N",
             "the stop by signal N was forced: a third stop signal, or the stop took longer than "
             "--term-timeout + 30 s (143 = SIGTERM, 130 = SIGINT)",
             "continue (counts as a failure)", "signal"),
)


def help_epilog(width: int = 92) -> str:
    """The ``exit codes:`` section of ``ft_launcher --help``, built from :data:`EXIT_CODES`."""
    lines = ["exit codes:"]
    for row in EXIT_CODES:
        lines += textwrap.wrap(row.meaning, width, initial_indent=f"  {row.code:<7}",
                               subsequent_indent=" " * 9)
    return "\n".join(lines)
