"""The launcher's environment: what it takes out of it, and what every process of the run inherits.

:func:`set_up_environment` is the one place that changes ``os.environ``, once, before anything
of the run starts:

- it takes ``scripts/autoresume.sh``'s variables out (the parent to die with, the descriptor of
  its lock, where to write the result), so that the workers do not inherit them;
- it sets the run token every process of the run carries (see :mod:`launcher.node.sentinel`);
- it asks torch's c10d rendezvous for a fresh store per round (restarted gloo groups can read
  the previous round's peer addresses from a store shared with the agent: "Connection
  refused"), unless the user chose otherwise;
- it sets ``TORCHELASTIC_SIGNALS_TO_HANDLE`` as torch's ``launch_agent`` does, without the
  signals the launcher passes on to the workers itself (SIGUSR1, SIGUSR2).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass

from ft_core.wire.env import (
    FT_LAUNCHER_KEEP_FD_ENV_VAR,
    FT_LAUNCHER_PARENT_PID_ENV_VAR,
    FT_LAUNCHER_RESULT_FILE_ENV_VAR,
    FT_LAUNCHER_RUN_ENV_VAR,
)
from launcher.attempt_result import check_result_path
from launcher.exit_codes import LauncherUsageError

SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch (read by its c10d rendezvous) for a fresh store per rendezvous round."""
SIGNALS_TO_HANDLE_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
"""torch's variable (read by its worker processes' context) of the signals it handles."""
RELAYED_BY_US = ("SIGUSR1", "SIGUSR2")
"""Signals torch must not handle: the launcher passes them on to the workers (launcher.node.signals)."""


@dataclass(frozen=True)
class RunEnvironment:
    """What :func:`set_up_environment` took from the environment and set in it.

    Attributes:
        token: The run token (``FT_LAUNCHER_RUN``) every process of the run inherits.
        parent_pid: ``scripts/autoresume.sh``'s pid: the launcher stops (as on SIGTERM) when it
            dies; None when not started by it.
        keep_fd: The descriptor of autoresume's lock, held until the run is cleaned up.
        result_file: Where to write the run's result for autoresume.
    """

    token: str
    parent_pid: int | None = None
    keep_fd: int | None = None
    result_file: str | None = None


def set_up_environment(signals_to_handle: str,
                       environ: MutableMapping[str, str] | None = None) -> RunEnvironment:
    """Take autoresume's variables out of ``environ`` (default ``os.environ``) and set the run's.

    Args:
        signals_to_handle: torchrun's ``--signals-to-handle`` (comma-separated names).

    Raises:
        LauncherUsageError: An autoresume variable with an invalid value (named, value echoed);
            ``environ`` is then left as it was.
    """
    environ = os.environ if environ is None else environ
    parent_pid = _number(environ, FT_LAUNCHER_PARENT_PID_ENV_VAR, 2, "a process id")
    keep_fd = _number(environ, FT_LAUNCHER_KEEP_FD_ENV_VAR, 3, "an open file descriptor >= 3")
    if keep_fd is not None:
        try:
            os.fstat(keep_fd)
        except OSError:
            raise LauncherUsageError(f"{FT_LAUNCHER_KEEP_FD_ENV_VAR} must be an open file descriptor >= 3, "
                             f"got {environ[FT_LAUNCHER_KEEP_FD_ENV_VAR]!r}") from None
    result_file = environ.get(FT_LAUNCHER_RESULT_FILE_ENV_VAR) or None
    if result_file is not None:
        problem = check_result_path(result_file)
        if problem:
            raise LauncherUsageError(f"{FT_LAUNCHER_RESULT_FILE_ENV_VAR} {problem}")
    for name in (FT_LAUNCHER_PARENT_PID_ENV_VAR, FT_LAUNCHER_KEEP_FD_ENV_VAR, FT_LAUNCHER_RESULT_FILE_ENV_VAR):
        environ.pop(name, None)
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    environ[FT_LAUNCHER_RUN_ENV_VAR] = token
    environ.setdefault(SHARE_STORE_ENV, "1")
    environ[SIGNALS_TO_HANDLE_ENV] = ",".join(
        name for name in signals_to_handle.split(",") if name.strip() not in RELAYED_BY_US)
    return RunEnvironment(token, parent_pid, keep_fd, result_file)


def _number(environ: MutableMapping[str, str], name: str, minimum: int, what: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise LauncherUsageError(f"{name} must be {what}, got {raw!r}")
    return value
